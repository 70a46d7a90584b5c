"""The notifier against STUB Alertmanager / Slack / webhook HTTP receivers (tests/stub_receivers.py) and a
real local SMTP server (aiosmtpd): request shapes, paging policy, threading, retries, dead letters and
idempotency across a restart (a new notifier on the same ledger). Time is an argument; backoffs are recorded,
not slept."""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import uuid
from datetime import datetime, timedelta, timezone
from email import message_from_bytes

import pytest

from tests.stub_receivers import SLACK_TOKEN, StubReceivers, parse_time
from vigil.schemas import Alert, Subject
from vigil.streams.notify import (
    AlertmanagerReceiver, DeliveryLedger, EmailReceiver, Notifier, PagePolicy, SlackReceiver, Stopped, WebhookReceiver,
    Where,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
WHERE = Where("vigil.alerts", 2, 41, b'{"raw":"alert"}')


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def alert(iid: uuid.UUID, version: int, status: str = "open", severity: int = 1, kind: str = "xid",
          node: str | None = "gpu-08", job: str | None = "gpt-1b3", at: datetime = T0, **kw) -> Alert:
    return Alert(event_time=at, incident_id=iid, incident_version=version, status=status, severity=severity,
                 kind=kind, subject=Subject(node=node, job=job, gpu=3), onset_time=T0 - timedelta(seconds=4),
                 detection_time=T0, summary=kw.pop("summary", "XID 79: GPU has fallen off the bus"),
                 evidence_count=kw.pop("evidence_count", 1), detector="xid", detector_version="1", **kw)


@pytest.fixture
def stub():
    with StubReceivers() as s:
        yield s


def notifier(receivers, tmp_path, clock=None, waits=None, **kw) -> Notifier:
    waits = waits if waits is not None else []
    return Notifier(receivers, DeliveryLedger(tmp_path / "ledger.sqlite"), clock=clock or Clock(),
                    wait=lambda s: waits.append(s) or False, **kw)


def test_alertmanager_gets_one_alert_per_incident_updated_in_place_and_ended(stub, tmp_path):
    clock = Clock()
    am = AlertmanagerReceiver(stub.base, evidence_url="https://grafana.example.org/d/vigil?var-incident={incident_id}",
                              refresh_s=60)
    n = notifier([am], tmp_path, clock)
    iid = uuid.uuid4()
    assert n.handle(alert(iid, 1), WHERE) == []
    clock.now = T0 + timedelta(seconds=30)
    n.handle(alert(iid, 2, "update", evidence_count=9, at=clock.now), WHERE)
    clock.now = T0 + timedelta(seconds=90)
    n.handle(alert(iid, 3, "resolved", at=clock.now), WHERE)
    posts = stub.alertmanager_alerts()
    assert len(posts) == 3 and len(stub.to("/api/v2/alerts")) == 3
    assert all(p["labels"] == posts[0]["labels"] for p in posts)         # one alert: one label set
    assert posts[0]["labels"] == {"alertname": "vigil_xid", "severity": "sev1", "kind": "xid", "cluster": "default",
                                  "incident": str(iid), "node": "gpu-08", "job": "gpt-1b3", "gpu": "3"}
    assert posts[0]["annotations"]["summary"] == "XID 79: GPU has fallen off the bus"
    assert posts[0]["annotations"]["evidence"] == posts[0]["generatorURL"] == \
        f"https://grafana.example.org/d/vigil?var-incident={iid}"
    assert parse_time(posts[0]["startsAt"]) == T0 - timedelta(seconds=4)
    assert parse_time(posts[0]["endsAt"]) == T0 + timedelta(seconds=240)    # firing: now + 4 refreshes
    assert posts[1]["annotations"]["incident_version"] == "2" and posts[1]["annotations"]["evidence_count"] == "9"
    assert parse_time(posts[2]["endsAt"]) == T0 + timedelta(seconds=90)     # resolved: endsAt = resolution


def test_deliveries_are_exactly_once_across_a_restart_on_the_same_ledger(stub, tmp_path):
    am = AlertmanagerReceiver(stub.base)
    iid = uuid.uuid4()
    notifier([am], tmp_path).handle(alert(iid, 1), WHERE)
    again = notifier([AlertmanagerReceiver(stub.base)], tmp_path)          # a restarted `vigil notify`
    again.handle(alert(iid, 1), WHERE)                                      # the open, redelivered by Kafka
    again.handle(alert(iid, 2, "resolved"), WHERE)
    again.handle(alert(iid, 2, "resolved"), WHERE)
    again.handle(alert(iid, 1), WHERE)                                      # an older version after a newer: stale
    posts = stub.alertmanager_alerts()
    assert len(posts) == 2 and parse_time(posts[1]["endsAt"]) == T0        # the open once, the resolve once
    assert again.ledger.deliveries() == [(str(iid), 1, "alertmanager", "delivered"),
                                         (str(iid), 2, "alertmanager", "delivered")]
    mode = stat.S_IMODE(os.stat(tmp_path / "ledger.sqlite").st_mode)
    assert mode == 0o600


def test_a_reattributed_incident_resolves_its_old_label_set_in_the_same_request(stub, tmp_path):
    n = notifier([AlertmanagerReceiver(stub.base)], tmp_path)
    iid = uuid.uuid4()
    n.handle(alert(iid, 1, kind="task_hang", node=None), WHERE)
    n.handle(alert(iid, 2, "update", kind="node_lost"), WHERE)
    second = stub.to("/api/v2/alerts")[1].body
    assert [a["labels"]["alertname"] for a in second] == ["vigil_node_lost", "vigil_task_hang"]
    assert parse_time(second[1]["endsAt"]) == T0                          # the old set ends now


def test_open_incidents_are_refreshed_until_they_resolve(stub, tmp_path):
    clock = Clock()
    n = notifier([AlertmanagerReceiver(stub.base, refresh_s=60)], tmp_path, clock)
    iid = uuid.uuid4()
    n.handle(alert(iid, 1), WHERE)
    clock.now = T0 + timedelta(seconds=59)
    assert n.refresh_due() == 0
    clock.now = T0 + timedelta(seconds=61)
    assert n.refresh_due() == 1
    assert parse_time(stub.alertmanager_alerts()[-1]["endsAt"]) == clock.now + timedelta(seconds=240)
    assert n.refresh_due() == 0                                            # next one due at +121
    n.handle(alert(iid, 2, "resolved", at=clock.now), WHERE)
    clock.now = T0 + timedelta(seconds=500)
    assert n.refresh_due() == 0 and len(stub.alertmanager_alerts()) == 3


def test_paging_policy_sev3_does_not_page_and_resolutions_follow_what_paged(stub, tmp_path):
    hook = WebhookReceiver(f"{stub.base}/hooks/ops", name="webhook-1")
    n = notifier([hook], tmp_path)
    quiet, loud = uuid.uuid4(), uuid.uuid4()
    n.handle(alert(quiet, 1, severity=3), WHERE)
    n.handle(alert(quiet, 2, "resolved", severity=3), WHERE)
    n.handle(alert(loud, 1, severity=3), WHERE)
    n.handle(alert(loud, 2, "update", severity=2), WHERE)                  # escalated: pages from here
    n.handle(alert(loud, 3, "resolved", severity=2), WHERE)
    got = [(r.body["incident_id"], r.body["incident_version"], r.body["status"]) for r in stub.to("/hooks/ops")]
    assert got == [(str(loud), 2, "update"), (str(loud), 3, "resolved")]
    assert stub.to("/hooks/ops")[0].body["alert"]["subject"]["node"] == "gpu-08"
    everything = notifier([WebhookReceiver(f"{stub.base}/hooks/all", name="w2")], tmp_path / "b",
                          policy=PagePolicy(severities=frozenset({1, 2, 3}), resolutions=False))
    everything.handle(alert(quiet, 1, severity=3), WHERE)
    everything.handle(alert(quiet, 2, "resolved", severity=3), WHERE)
    assert [r.body["status"] for r in stub.to("/hooks/all")] == ["open"]


def test_slack_threads_updates_under_the_first_message_and_skips_evidence_only_updates(stub, tmp_path):
    slack = SlackReceiver(token=SLACK_TOKEN, channel="C0VIGIL", api_url=f"{stub.base}/api",
                          evidence_url="https://grafana.example.org/i/{incident_id}")
    n = notifier([slack], tmp_path)
    iid = uuid.uuid4()
    n.handle(alert(iid, 1, severity=2, kind="task_hang"), WHERE)
    n.handle(alert(iid, 2, "update", severity=2, kind="task_hang", evidence_count=40), WHERE)  # evidence only
    n.handle(alert(iid, 3, "update", severity=1, kind="node_lost"), WHERE)                    # cause found
    n.handle(alert(iid, 4, "resolved", severity=1, kind="node_lost"), WHERE)
    posts = stub.to("/api/chat.postMessage")
    assert len(posts) == 3
    root = "1700000001.000100"
    assert "thread_ts" not in posts[0].body and posts[0].body["channel"] == "C0VIGIL"
    assert posts[0].body["text"].startswith("[vigil] SEV2 OPEN task_hang - job gpt-1b3 node gpu-08 GPU 3")
    assert f"https://grafana.example.org/i/{iid}" in posts[0].body["text"]
    assert [p.body.get("thread_ts") for p in posts[1:]] == [root, root]
    assert posts[2].body.get("reply_broadcast") is True and "RESOLVED" in posts[2].body["text"]
    assert posts[0].headers["Authorization"] == f"Bearer {SLACK_TOKEN}"


def test_slack_rate_limit_is_retried_after_its_retry_after_and_a_bad_channel_is_dead_lettered(stub, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    stub.script["/api/chat.postMessage"] = [(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "7"})]
    waits: list[float] = []
    n = notifier([SlackReceiver(token=SLACK_TOKEN, channel="C0VIGIL", api_url=f"{stub.base}/api")], tmp_path,
                 waits=waits)
    assert n.handle(alert(uuid.uuid4(), 1), WHERE) == []
    assert waits == [7.0] and len(stub.to("/api/chat.postMessage")) == 2
    bad = notifier([SlackReceiver(token=SLACK_TOKEN, channel="C0NOPE", api_url=f"{stub.base}/api")], tmp_path / "b")
    iid = uuid.uuid4()
    [dl] = bad.handle(alert(iid, 1), WHERE)
    assert dl.reason == "notify_failed" and "channel_not_found" in dl.detail and "receiver slack" in dl.detail
    assert (dl.source_topic, dl.source_partition, dl.source_offset) == ("vigil.alerts", 2, 41)
    assert bad.ledger.deliveries() == [(str(iid), 1, "slack", "dead")]
    assert bad.handle(alert(iid, 1), WHERE) == []                          # dead is an outcome: not retried
    assert SLACK_TOKEN not in caplog.text


def test_webhook_5xx_is_retried_with_doubling_backoff_then_gives_up_into_a_dead_letter(stub, tmp_path):
    stub.script["/hooks/flaky"] = [(503, "busy", {}), (500, "oops", {})]
    waits: list[float] = []
    hook = WebhookReceiver(f"{stub.base}/hooks/flaky", name="webhook-1", token="hook-token-SECRET")
    n = notifier([hook], tmp_path, waits=waits, backoff_s=0.5)
    assert n.handle(alert(uuid.uuid4(), 1), WHERE) == []
    assert waits == [0.5, 1.0] and len(stub.to("/hooks/flaky")) == 3
    assert stub.to("/hooks/flaky")[0].headers["Authorization"] == "Bearer hook-token-SECRET"
    stub.script["/hooks/down"] = [(503, "busy", {})] * 3
    gives_up = notifier([WebhookReceiver(f"{stub.base}/hooks/down", name="w")], tmp_path / "b", retry_for_s=0.0)
    [dl] = gives_up.handle(alert(uuid.uuid4(), 1), WHERE)
    assert dl.reason == "notify_retries_exhausted" and "HTTP 503" in dl.detail
    stub.script["/hooks/gone"] = [(404, "not found", {})]
    [dl] = notifier([WebhookReceiver(f"{stub.base}/hooks/gone", name="w")], tmp_path / "c").handle(
        alert(uuid.uuid4(), 1), WHERE)
    assert dl.reason == "notify_failed" and "HTTP 404" in dl.detail and "/hooks/gone" not in dl.detail


def test_one_failing_receiver_does_not_hold_back_the_others_and_a_stop_records_nothing(stub, tmp_path):
    stub.script["/hooks/slow"] = [(503, "busy", {})] * 5
    am = AlertmanagerReceiver(stub.base)
    n = Notifier([am, WebhookReceiver(f"{stub.base}/hooks/slow", name="w")], DeliveryLedger(tmp_path / "l.sqlite"),
                 clock=Clock(), wait=lambda s: True)                       # a stop arrives during the backoff
    iid = uuid.uuid4()
    with pytest.raises(Stopped):
        n.handle(alert(iid, 1), WHERE)
    assert n.ledger.deliveries() == [(str(iid), 1, "alertmanager", "delivered")]   # the webhook: retried next start


@pytest.fixture
def smtp_server(tmp_path):
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    received: list[tuple[str, list[str], bytes]] = []

    class Handler:
        async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
            if address.endswith("@bounce.example.org"):
                return "550 5.1.1 no such user"
            envelope.rcpt_tos.append(address)
            return "250 OK"

        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            received.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
            return "250 Message accepted for delivery"

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == b"vigil" and auth_data.password == b"smtp-pass-SECRET"
        return AuthResult(success=ok, handled=False)  # not handled: aiosmtpd answers 535 itself

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert),
                    "-days", "1"], check=True, capture_output=True)
    import ssl

    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    with socket.socket() as probe:  # aiosmtpd's controller connects to its port once started: name one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(Handler(), hostname="127.0.0.1", port=port, authenticator=authenticator,
                            auth_require_tls=True, require_starttls=True, tls_context=server_ctx)
    controller.start()
    client_ctx = ssl.create_default_context(cafile=str(cert))
    try:
        yield controller, received, client_ctx
    finally:
        controller.stop()


def test_email_starttls_auth_one_message_per_paging_version_threaded(smtp_server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    controller, received, ctx = smtp_server
    from pydantic import SecretStr

    mail = EmailReceiver(host="127.0.0.1", port=controller.port, starttls=True, user="vigil",
                         password=SecretStr("smtp-pass-SECRET"), sender="vigil@example.org",
                         to=["oncall@example.org", "gpu-team@example.org"], ssl_context=ctx,
                         evidence_url="https://grafana.example.org/i/{incident_id}")
    n = notifier([mail], tmp_path)
    iid = uuid.uuid4()
    n.handle(alert(iid, 1, severity=2, kind="task_hang"), WHERE)
    n.handle(alert(iid, 1, severity=2, kind="task_hang"), WHERE)          # redelivered: not sent again
    n.handle(alert(iid, 2, "update", severity=1, kind="node_lost"), WHERE)
    n.handle(alert(iid, 3, "resolved", severity=1, kind="node_lost"), WHERE)
    assert len(received) == 3
    msgs = [message_from_bytes(content) for _, _, content in received]
    assert all(rcpt == ["oncall@example.org", "gpu-team@example.org"] for _, rcpt, _ in received)
    first = f"<vigil.{iid}.v1@example.org>"
    assert msgs[0]["Message-ID"] == first and msgs[0]["In-Reply-To"] is None
    assert [m["In-Reply-To"] for m in msgs[1:]] == [first, first] and [m["References"] for m in msgs[1:]] == [first] * 2
    assert msgs[0]["Subject"] == "[vigil] task_hang - job gpt-1b3 node gpu-08 GPU 3"
    assert msgs[2]["Subject"].startswith("Re: ") and "RESOLVED" in msgs[2].get_payload()
    assert f"https://grafana.example.org/i/{iid}" in msgs[0].get_payload()
    assert "smtp-pass-SECRET" not in caplog.text


def test_email_bad_password_and_refused_recipient_are_permanent(smtp_server, tmp_path, caplog):
    controller, received, ctx = smtp_server
    wrong = EmailReceiver(host="127.0.0.1", port=controller.port, user="vigil", password="nope-SECRET",
                          sender="vigil@example.org", to=["oncall@example.org"], ssl_context=ctx)
    [dl] = notifier([wrong], tmp_path).handle(alert(uuid.uuid4(), 1), WHERE)
    assert dl.reason == "notify_failed" and "refused the login" in dl.detail and "nope-SECRET" not in dl.detail
    bounce = EmailReceiver(host="127.0.0.1", port=controller.port, user="vigil", password="smtp-pass-SECRET",
                           sender="vigil@example.org", to=["ghost@bounce.example.org"], ssl_context=ctx)
    [dl] = notifier([bounce], tmp_path / "b").handle(alert(uuid.uuid4(), 1), WHERE)
    assert dl.reason == "notify_failed" and "550" in dl.detail
    assert received == [] and "SECRET" not in caplog.text


def test_email_receiver_built_from_vigil_smtp_settings_logs_in_and_never_prints_the_password(
        smtp_server, tmp_path, monkeypatch, caplog, capsys):
    """``vigil notify``'s path: VIGIL_SMTP_* -> SmtpSettings -> build_receivers -> a real login and delivery."""
    from typer.testing import CliRunner

    from vigil.cli import app
    from vigil.cli.notify import NotifySettings, SmtpSettings, build_receivers, describe

    caplog.set_level(logging.DEBUG)
    controller, received, _ = smtp_server
    for k in [k for k in os.environ if k.startswith(("VIGIL_SMTP_", "VIGIL_NOTIFY_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))  # the site's CA, as the default context reads it
    monkeypatch.setenv("VIGIL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("VIGIL_SMTP_PORT", str(controller.port))
    monkeypatch.setenv("VIGIL_SMTP_USER", "vigil")
    monkeypatch.setenv("VIGIL_SMTP_PASSWORD", "smtp-pass-SECRET")
    monkeypatch.setenv("VIGIL_SMTP_FROM", "vigil@example.org")
    monkeypatch.setenv("VIGIL_SMTP_TO", " oncall@example.org, gpu-team@example.org ,")
    smtp = SmtpSettings()
    assert "smtp-pass-SECRET" not in repr(smtp) and "smtp-pass-SECRET" not in str(smtp.model_dump())
    [mail] = build_receivers(NotifySettings(), smtp, 60.0, "default")
    assert isinstance(mail, EmailReceiver) and (mail.port, mail.starttls, mail.use_ssl) == (controller.port, True, False)
    assert mail.to == ["oncall@example.org", "gpu-team@example.org"] and mail.sender == "vigil@example.org"
    assert mail.user == "vigil"  # it logs in: a wrong password would be a permanent failure, no delivery
    assert describe(mail) == f"email via 127.0.0.1:{controller.port} (STARTTLS) to 2 recipient(s)"
    n = notifier([mail], tmp_path)
    n.handle(alert(uuid.uuid4(), 1), WHERE)  # the stub server accepts only the right password
    assert [(frm, rcpt) for frm, rcpt, _ in received] == [("vigil@example.org", ["oncall@example.org", "gpu-team@example.org"])]
    checked = CliRunner().invoke(app, ["notify", "--check"])
    assert checked.exit_code == 0 and "email via 127.0.0.1" in checked.output, checked.output
    monkeypatch.setenv("VIGIL_SMTP_TO", "")
    refused = CliRunner().invoke(app, ["notify", "--check"])
    assert refused.exit_code == 2 and "VIGIL_SMTP_TO" in refused.output
    out = capsys.readouterr()
    assert not any("smtp-pass-SECRET" in text for text in (checked.output, refused.output, caplog.text, out.out, out.err))
