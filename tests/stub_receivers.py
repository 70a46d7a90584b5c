"""STUB Alertmanager, Slack Web API and JSON webhook receivers for tests: one local HTTP server.

None of them can run here, so the server implements what vigil relies on, per
their documentation:

* ``POST /api/v2/alerts`` (Alertmanager's v2 API, ``postableAlerts``): a JSON
  list of objects with ``labels`` (string -> string, required, non-empty),
  optional ``annotations`` (string -> string), ``startsAt``/``endsAt`` (RFC 3339)
  and ``generatorURL``; 200 with an empty body, 400 for a malformed body.
* ``POST /api/chat.postMessage`` (Slack Web API): bearer token in
  ``Authorization``; JSON with ``channel`` and ``text``, optional ``thread_ts``
  and ``reply_broadcast``; always HTTP 200 with ``{"ok": true, "channel", "ts"}``
  or ``{"ok": false, "error": "invalid_auth" | "channel_not_found"}``; rate
  limiting is HTTP 429 with ``Retry-After``.
* ``POST /hooks/<name>`` (Slack incoming webhooks and generic JSON webhooks):
  200 ``ok``.

``script`` queues responses per path (``(status, body, headers)``) that are
served before the normal behaviour; every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SLACK_TOKEN = "xoxb-test-0000-SECRET"
SLACK_CHANNELS = {"C0VIGIL"}
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: Any


def validate_postable_alerts(body: Any) -> str | None:
    """Why ``body`` is not a valid ``postableAlerts`` document, or None."""
    if not isinstance(body, list):
        return "expected a JSON array of alerts"
    for i, a in enumerate(body):
        if not isinstance(a, dict):
            return f"alert {i} is not an object"
        extra = set(a) - {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        if extra:
            return f"alert {i}: unknown fields {sorted(extra)}"
        labels = a.get("labels")
        if not isinstance(labels, dict) or not labels or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            return f"alert {i}: labels must be a non-empty string map"
        if not all(re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", k) for k in labels):
            return f"alert {i}: invalid label name"
        ann = a.get("annotations", {})
        if not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values()):
            return f"alert {i}: annotations must be a string map"
        for f in ("startsAt", "endsAt"):
            if f in a and not (isinstance(a[f], str) and _RFC3339.match(a[f])):
                return f"alert {i}: {f} is not RFC 3339"
        if "generatorURL" in a and not str(a["generatorURL"]).startswith(("http://", "https://")):
            return f"alert {i}: generatorURL is not a URL"
    return None


class StubReceivers:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.script: dict[str, list[tuple[int, Any, dict[str, str]]]] = {}
        self.lock = threading.Lock()
        self._ts = 1700000000.000100
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                with stub.lock:
                    stub.requests.append(Request(self.path, dict(self.headers), body))
                    queued = stub.script.get(self.path)
                    if queued:
                        self._answer(*queued.pop(0))
                        return
                    if self.path == "/api/v2/alerts":
                        why = validate_postable_alerts(body)
                        self._answer(400, why) if why else self._answer(200, b"")
                    elif self.path == "/api/chat.postMessage":
                        if self.headers.get("Authorization") != f"Bearer {SLACK_TOKEN}":
                            self._answer(200, {"ok": False, "error": "invalid_auth"})
                        elif not isinstance(body, dict) or body.get("channel") not in SLACK_CHANNELS:
                            self._answer(200, {"ok": False, "error": "channel_not_found"})
                        else:
                            stub._ts += 1.0
                            self._answer(200, {"ok": True, "channel": body["channel"], "ts": f"{stub._ts:.6f}",
                                               "message": {"text": body.get("text", "")}})
                    elif self.path.startswith("/hooks/"):
                        self._answer(200, "ok")
                    else:
                        self._answer(404, "no such endpoint")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def to(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def alertmanager_alerts(self) -> list[dict[str, Any]]:
        return [a for r in self.to("/api/v2/alerts") for a in r.body]

    def __enter__(self) -> "StubReceivers":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def parse_time(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))
