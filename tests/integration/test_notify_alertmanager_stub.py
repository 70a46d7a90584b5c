"""Acceptance: `vigil notify` (a real subprocess, the real broker) delivers an open and a resolve of one
incident to a STUB Alertmanager (tests/stub_receivers.py: the v2 API's request shape) exactly once each,
across a crash (SIGKILL) and a restart that re-reads the alerts topic from the beginning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from confluent_kafka import Producer

from tests.integration.conftest import wait_for
from tests.stub_receivers import StubReceivers, parse_time
from vigil.schemas import Alert, DeadLetter, Subject, decode, encode, message_key
from vigil.stack import wait_for_file
from vigil.streams.kafka import reader
from vigil.streams.notify import DeliveryLedger


def delivered(workdir: Path) -> list[int]:
    path = workdir / "notify-ledger.sqlite"
    if not path.exists():
        return []
    book = DeliveryLedger(path)
    try:
        return [v for _, v, _, outcome in book.deliveries() if outcome == "delivered"]
    finally:
        book.close()


class Notify:
    def __init__(self, config, workdir: Path, am_url: str, group: str, tag: str) -> None:
        self.ready = workdir / f"ready-{tag}"
        self.log = workdir / f"notify-{tag}.log"
        env = dict(os.environ, VIGIL_KAFKA_BOOTSTRAP=config.bootstrap, VIGIL_TOPIC_PREFIX=config.topic_prefix,
                   VIGIL_STATE_DIR=str(workdir), VIGIL_NOTIFY_ALERTMANAGER_URL=am_url)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vigil.cli", "notify", "--group-id", group, "--am-refresh", "3600",
                 "--ready-file", str(self.ready), "--log-level", "INFO"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not wait_for_file(self.ready, 60, alive=lambda: self.proc.poll() is None):
            self.stop()
            raise AssertionError(f"notify not ready; log:\n{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def test_notify_delivers_open_and_resolve_exactly_once_across_a_restart(config, tmp_path):
    iid = uuid.uuid4()
    t0 = datetime.now(timezone.utc).replace(microsecond=0)

    def version(v: int, status: str) -> Alert:
        return Alert(event_time=t0 + timedelta(seconds=10 * (v - 1)), incident_id=iid, incident_version=v,
                     status=status, severity=1, kind="node_lost", subject=Subject(node="gpu-05"), onset_time=t0,
                     detection_time=t0, summary="node gpu-05 lost: no heartbeat for 2.5 intervals",
                     evidence_count=1, detector="heartbeat_loss", detector_version="1")

    producer = Producer({"bootstrap.servers": config.bootstrap})

    def send(event: Alert | bytes) -> None:
        if isinstance(event, bytes):
            # The alerts' key: the junk sits between the open and the resolve in one partition, so whichever
            # run reads the resolve has read the junk before it (another key could land in a partition the
            # second run has not fetched yet when it is stopped, and a SIGKILLed first run flushed nothing).
            producer.produce(config.topic("alert"), event, key=message_key(version(1, "open")))
        else:
            producer.produce(config.topic("alert"), encode(event), key=message_key(event))
        assert producer.flush(10) == 0

    with StubReceivers() as am:
        first = Notify(config, tmp_path, am.base, group=f"notify-{uuid.uuid4().hex[:6]}", tag="1")
        try:
            send(version(1, "open"))
            send(b"not json at all")
            assert wait_for(lambda: len(am.alertmanager_alerts()) >= 1, 60), first.log.read_text()[-3000:]
            # Crash once the delivery is recorded (a crash between the POST and the record would re-send:
            # the at-least-once window, which Alertmanager's dedup by label set absorbs).
            assert wait_for(lambda: delivered(tmp_path) == [1], 30)
        finally:
            first.stop(signal.SIGKILL)  # a crash: nothing flushed, nothing closed

        # A new group reads the topic from the beginning: the open is redelivered, the ledger skips it.
        second = Notify(config, tmp_path, am.base, group=f"notify-{uuid.uuid4().hex[:6]}", tag="2")
        try:
            send(version(2, "resolved"))
            assert wait_for(lambda: len(am.alertmanager_alerts()) >= 2, 60), second.log.read_text()[-3000:]
        finally:
            assert second.stop() == 0, second.log.read_text()[-3000:]
        posts = am.alertmanager_alerts()

    # Same key, same partition, read in order: the redelivered open came before the resolve.
    assert len(posts) == 2, posts
    assert [p["labels"]["alertname"] for p in posts] == ["vigil_node_lost"] * 2
    assert posts[0]["labels"] == posts[1]["labels"] and posts[0]["labels"]["incident"] == str(iid)
    assert posts[0]["labels"]["node"] == "gpu-05" and posts[0]["labels"]["severity"] == "sev1"
    assert parse_time(posts[0]["endsAt"]) > t0 + timedelta(hours=1)       # firing: refreshed within 4 x 3600 s
    assert parse_time(posts[1]["endsAt"]) == t0 + timedelta(seconds=10)   # resolved at the resolve's time
    book = DeliveryLedger(tmp_path / "notify-ledger.sqlite")
    assert book.deliveries() == [(str(iid), 1, "alertmanager", "delivered"), (str(iid), 2, "alertmanager", "delivered")]
    book.close()

    # The junk message went to the dead-letter topic (by the first run, or by the second when the first
    # crashed before committing: a dead letter keeps one id whoever reports it).
    consumer = reader(config.kafka_conf(), [config.topic("dead_letter")])
    letters: dict[str, DeadLetter] = {}

    def poll() -> None:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            for ev in decode(msg.value()).events:
                letters[str(ev.event_id)] = ev

    assert wait_for(lambda: any(dl.reason == "not_json" for dl in letters.values()), 30, poll)
    consumer.close()
    assert {dl.source_topic for dl in letters.values()} == {config.topic("alert")}
    assert json.loads(json.dumps([dl.reason for dl in letters.values()])) == ["not_json"]
