"""The seeded generator of ``vigil bench fuzz``: messages good and malformed, each with what must become of
every item in it (the kinds of each are listed in :mod:`vigil.bench.fuzz`)."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from vigil.schemas import EVENT_TYPES
from vigil.schemas.events import NodeState
from vigil.schemas.envelope import EARLIEST, LATEST
from vigil.schemas.tables import TABLE_SPECS

INT64_MAX = 2**63 - 1
#: The schema's bound on a node state's reason: a good event stays within it, a bad one goes one past.
REASON_MAX = next(m.max_length for m in NodeState.model_fields["reason"].metadata if hasattr(m, "max_length"))
#: The namespace of ids derived from content, as documented (vigil.schemas.codec.content_id); the
#: generator derives the ids it expects itself, rather than asking the code under test.
_CONTENT_NS = uuid.UUID("3d0c6f2a-9a7e-4f44-b1c5-8a0e2e6c4b71")


def derived_id(obj: dict[str, Any]) -> str:
    """The documented id of an event sent without one: UUIDv5 of its canonical JSON (all but event_id)."""
    body = {k: v for k, v in obj.items() if k != "event_id"}
    return str(uuid.uuid5(_CONTENT_NS, json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)))

__all__ = ["Expect", "FuzzMessage", "Generator"]

GOOD, BAD = "good", "bad"


@dataclass
class Expect:
    """What must become of one item: stored in ``table`` under ``event_id``, or dead-lettered."""

    kind: str  # GOOD or BAD
    table: str | None = None
    event_id: str | None = None


@dataclass
class FuzzMessage:
    topic_type: str  # the event type whose topic it goes to (its topic: topics.TOPICS)
    key: bytes
    value: bytes | None
    items: list[Expect]
    label: str
    #: Set once produced: where it landed.
    partition: int = -1
    offset: int = -1

    @property
    def malformed(self) -> bool:
        return any(e.kind == BAD for e in self.items)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


class Generator:
    """Seeded messages, good and malformed, each with what must become of its items."""

    def __init__(self, seed: int = 0, now: datetime | None = None) -> None:
        self.rng = random.Random(seed)
        self.now = now or datetime.now(timezone.utc)
        self.sent: list[FuzzMessage] = []

    # -- good events -----------------------------------------------------------------------------

    def _id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _time(self) -> datetime:
        return self.now - timedelta(seconds=self.rng.uniform(0, 600))

    def _name(self, prefix: str) -> str:
        r = self.rng.random()
        if r < 0.03:
            return "n" * 256  # at the length bound
        if r < 0.06:
            return "gpu-07.rack_3:a/b@c+d=e"  # every allowed character
        return f"{prefix}{self.rng.randrange(40)}"

    def _text(self) -> str:
        return self.rng.choice(["", "plain", "ünïcödé ✓ 日本語 🚀", "tab\there\nnewline", "x" * 5000,
                                "\u202e override in free text", "quote\" and \\ backslash"])

    def event(self, event_type: str | None = None, edge: bool = False) -> dict[str, Any]:
        """A valid event as a JSON object (``edge``: fields at their bounds)."""
        et = event_type or self.rng.choice(_GOOD_TYPES)
        t = self._time()
        node, job = self._name("node-"), self._name("job-")
        base: dict[str, Any] = {"event_type": et, "version": 1, "event_id": self._id(), "event_time": _iso(t),
                                "source": {"cluster": "fuzz", "node": node, "job": job}}
        big = INT64_MAX if edge else self.rng.randrange(10**6)
        if et == "heartbeat":
            base |= {"seq": big, "interval_s": self.rng.choice([0.5, 1, 10.0])}
            base["source"].pop("job")
        elif et == "gpu_telemetry":
            base["source"]["gpu"] = 1023 if edge else self.rng.randrange(8)
            base |= {"utilization_pct": self.rng.choice([0, 100, 55.5]), "memory_used_bytes": big,
                     "temperature_c": self.rng.uniform(-40, 120), "nvlink_errors": {"crc": 2**64 - 1 if edge else 3}}
        elif et == "nic_counters":
            base |= {"device": "mlx5_0", "port": 1, "counters": {"rx_bytes": 2**64 - 1 if edge else 10,
                                                                 "np_cnp_sent": self.rng.randrange(100)}}
        elif et == "iteration":
            start = t - timedelta(seconds=1)
            base |= {"step": big, "start": _iso(start), "end": _iso(t), "duration_s": 1.0, "compute_s": 0.7,
                     "communication_s": 0.3, "dp": 0, "pp": 0, "tp": 0}
            base["source"]["rank"] = big
        elif et == "iteration_step":
            n = self.rng.randrange(1, 6)
            start = t - timedelta(seconds=1)
            base |= {"step": big, "start": _iso(start), "end": _iso(t), "duration_s": 1.0,
                     "ranks": list(range(n)), "nodes": [node] * n, "gpus": [min(i, 1023) for i in range(n)],
                     "compute_s": [0.7] * n, "communication_s": [0.3] * n, "dp": [0] * n, "pp": [0] * n, "tp": [0] * n}
        elif et == "xid":
            base |= {"code": self.rng.choice([13, 31, 48, 79, 94, 999]), "message": self._text(),
                     "raw_line": self._text()}
        elif et == "process_exit":
            base |= {"pid": big, "exit_code": -(2**63) if edge else self.rng.choice([0, 1, 137]),
                     "command": self._text()}
        elif et == "training_exception":
            base |= {"category": "cuda_error", "exc_type": "RuntimeError", "message": self._text(),
                     "traceback": self._text()}
        elif et == "collective":
            base |= {"op": "all_reduce", "group": "data parallel 0", "nbytes": big, "start": _iso(t - timedelta(seconds=1)),
                     "end": _iso(t)}
        elif et == "job_state":
            base |= {"state": "running", "nodes": [node], "gpus": 8}
        elif et == "node_state":
            reason = "r" * REASON_MAX if edge else self._text()[:REASON_MAX]
            base |= {"state": "healthy", "reason": reason}
        elif et == "agent_health":
            base |= {"collector": "nvml", "status": "failed", "problem": "/dev/nvidia0 unreadable", "detail": self._text()}
        elif et == "events_dropped":
            base |= {"count": big, "messages": 1, "by_type": {"heartbeat": 1}, "reason": "spool_full",
                     "component": "publisher spool"}
        elif et == "watchdog":
            base |= {"check": "disk_space", "target": "/var/lib/vigil", "status": "ok", "used": 1.0, "limit": 2.0}
        elif et == "action_result":
            base |= {"decision_id": self._id(), "state": "succeeded", "backend": "slurm", "detail": self._text()}
        if edge and self.rng.random() < 0.5:
            base["event_time"] = _iso(EARLIEST if self.rng.random() < 0.5 else LATEST)
            if et in ("iteration", "iteration_step", "collective"):
                base["start"] = base["end"] = base["event_time"]
        return base

    # -- messages --------------------------------------------------------------------------------

    def good(self) -> FuzzMessage:
        r = self.rng.random()
        if r < 0.55:
            ev = self.event(edge=self.rng.random() < 0.15)
            if self.rng.random() < 0.1:
                del ev["event_id"]  # the id derived from its content
            return self._single(ev, "good")
        if r < 0.85:
            et = self.rng.choice(["heartbeat", "gpu_telemetry", "iteration_step", "xid", "iteration"])
            evs = [self.event(et) for _ in range(self.rng.randrange(2, 30))]
            return FuzzMessage(et, b"batch", json.dumps(evs).encode(), [self._expect(e) for e in evs], "good batch")
        if r < 0.93:
            evs = [self.event(t) for t in ("heartbeat", "gpu_telemetry", "nic_counters", "gpu_telemetry")]
            return FuzzMessage("node_samples", b"node", json.dumps(evs).encode(), [self._expect(e) for e in evs],
                           "node samples")
        if self.sent:  # a message sent again (a producer retry, a replay): the same events, stored once
            prev = self.rng.choice([m for m in self.sent[-200:] if not m.malformed] or self.sent[-1:])
            if not prev.malformed:
                return FuzzMessage(prev.topic_type, prev.key, prev.value, list(prev.items), "sent again")
        return self._single(self.event(), "good")

    def _expect(self, ev: dict[str, Any]) -> Expect:
        eid = ev.get("event_id") or derived_id(ev)
        return Expect(GOOD, TABLE_SPECS[ev["event_type"]].table, eid)

    def _single(self, ev: dict[str, Any], label: str) -> FuzzMessage:
        return FuzzMessage(ev["event_type"], b"k", json.dumps(ev, ensure_ascii=self.rng.random() < 0.5).encode(),
                       [self._expect(ev)], label)

    def malformed(self) -> FuzzMessage:
        kind = self.rng.choice(_BAD_KINDS)
        bad = [Expect(BAD)] * (3 if kind == "not_an_object_item" else 1)
        topic = self.rng.choice(_GOOD_TYPES + ["node_samples", "dead_letter", "decision", "finding"])
        ev = self.event(topic if topic in _GOOD_TYPES else None)
        if kind == "binary":
            value = bytes(self.rng.getrandbits(8) for _ in range(self.rng.randrange(1, 400)))
        elif kind == "truncated":
            raw = json.dumps(ev).encode()
            value = raw[:self.rng.randrange(1, len(raw))]
        elif kind == "no_value":
            value = None
        elif kind == "empty_array":
            value = b"[]"
        elif kind == "empty_bytes":
            value = b""
        elif kind == "deep":
            depth = self.rng.choice([5_000, 100_000])
            value = b"[" * depth + b"]" * depth
        elif kind == "huge":
            value = json.dumps({**ev, "extra": "x" * self.rng.randrange(1_000_000, 3_000_000)}).encode()
        elif kind == "scalar":
            value = self.rng.choice([b"42", b'"a string"', b"null", b"true", b"1e999"])
        elif kind == "invalid_utf8":
            value = json.dumps(ev).encode().replace(b'"fuzz"', b'"\xff\xfe"', 1)
        else:
            ev = self._break(ev, kind)
            value = json.dumps(ev, allow_nan=True).encode() if not isinstance(ev, bytes) else ev
        return FuzzMessage(topic if topic != "node_samples" else "node_samples", b"bad", value, bad, kind)

    def _break(self, ev: dict[str, Any], kind: str) -> Any:
        src = ev.setdefault("source", {})
        if kind == "unknown_type":
            ev["event_type"] = "heartbeet"
        elif kind == "unknown_version":
            ev["version"] = 2
        elif kind == "missing_version":
            del ev["version"]
        elif kind == "version_string":
            ev["version"] = "1"
        elif kind == "bool_for_int":
            ev["version"] = True
        elif kind == "missing_field":
            ev.pop("event_time")
        elif kind == "rank_2_64":
            src["rank"] = 2**64
        elif kind == "negative":
            src["gpu"] = -1
        elif kind == "gpu_1024":
            src["gpu"] = 1024
        elif kind == "nan":
            return json.dumps({**ev, "source": {**src, "rank": float("nan")}}, allow_nan=True).encode()
        elif kind == "inf":  # 1e400 where a time belongs (a float past what a double holds)
            return json.dumps(ev).replace(json.dumps(ev["event_time"]), "1e400", 1).encode()
        elif kind == "naive_time":
            ev["event_time"] = "2026-03-01T00:00:00"
        elif kind == "far_time":
            ev["event_time"] = "9999-12-31T00:00:00Z"
        elif kind == "bad_name":
            src["node"] = self.rng.choice(["n\x00", "node-07\n", "\u202enode", "a b", "ALL,x", "n" * 257, "-rf",
                                           "node[1-64]", "\u2066x", ""])
        elif kind == "reason_too_long":
            ev.update(event_type="node_state", state="healthy", reason="r" * (REASON_MAX + 1))
            for field in set(ev) - {"event_type", "version", "event_id", "event_time", "source", "state", "reason"}:
                del ev[field]
        elif kind == "null_id":
            ev["event_id"] = None
        elif kind == "bad_id":
            ev["event_id"] = "not-a-uuid"
        elif kind == "extra_field":
            ev["surprise"] = 1
        elif kind == "wrong_topic":
            # a decision on a telemetry topic: the message's topic is set by malformed() from the event's
            # type, so this one goes where decisions do not belong
            return json.dumps({"event_type": "decision", "version": 1, "event_id": self._id(),
                               "event_time": ev["event_time"], "decision_id": self._id(), "idempotency_key": "k",
                               "action": "isolate_node", "target": {"node": "ALL"}, "reason": "forged"}).encode()
        elif kind == "dead_letter_offset":
            return json.dumps({"event_type": "dead_letter", "version": 1, "event_id": self._id(),
                               "event_time": ev["event_time"], "reason": "x", "detail": "y", "source_topic": "t",
                               "source_partition": 0, "source_offset": 2**70, "raw_b64": ""}).encode()
        elif kind == "not_an_object_item":
            return json.dumps([1, "two", None]).encode()
        return ev

    def mixed_batch(self) -> FuzzMessage:
        """Good and bad items in one array, one event type (its topic's)."""
        et = self.rng.choice(["heartbeat", "gpu_telemetry", "xid"])
        items, expects = [], []
        for _ in range(self.rng.randrange(3, 20)):
            ev = self.event(et)
            if self.rng.random() < 0.35:
                ev = self._break(ev, self.rng.choice(["rank_2_64", "bool_for_int", "bad_name", "missing_field",
                                                      "unknown_type", "null_id", "extra_field", "version_string"]))
                expects.append(Expect(BAD))
            else:
                expects.append(self._expect(ev))
            items.append(ev)
        if all(e.kind == GOOD for e in expects):  # at least one bad item
            items.append({"event_type": et, "version": 1})
            expects.append(Expect(BAD))
        return FuzzMessage(et, b"mixed", json.dumps(items).encode(), expects, "mixed batch")

    def message(self, malformed_share: float) -> FuzzMessage:
        r = self.rng.random()
        if r < malformed_share * 0.7:
            m = self.malformed()
        elif r < malformed_share:
            m = self.mixed_batch()
        else:
            m = self.good()
        if m.label == "wrong_topic":
            m.topic_type = self.rng.choice(["heartbeat", "gpu_telemetry", "node_samples", "iteration"])
        elif m.label == "dead_letter_offset":
            m.topic_type = "dead_letter"
        elif m.label == "reason_too_long":
            m.topic_type = "node_state"
        self.sent.append(m)
        return m


_GOOD_TYPES = ["heartbeat", "gpu_telemetry", "nic_counters", "iteration", "iteration_step", "xid", "process_exit",
               "training_exception", "collective", "job_state", "node_state", "agent_health", "events_dropped",
               "watchdog", "action_result"]
_BAD_KINDS = ["binary", "truncated", "no_value", "empty_array", "empty_bytes", "deep", "huge", "scalar",
              "invalid_utf8", "unknown_type", "unknown_version", "missing_version", "version_string", "bool_for_int",
              "missing_field", "rank_2_64", "negative", "gpu_1024", "nan", "inf", "naive_time", "far_time", "bad_name",
              "null_id", "bad_id", "extra_field", "wrong_topic", "dead_letter_offset", "not_an_object_item",
              "reason_too_long"]
#: How often a malformed kind is drawn relative to the others ("huge" is rare: it is slow to move).
_BAD_KINDS = [k for k in _BAD_KINDS for _ in range(1 if k == "huge" else 6)]


assert set(_GOOD_TYPES) <= set(EVENT_TYPES)
