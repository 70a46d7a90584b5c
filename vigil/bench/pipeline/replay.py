"""What a worker alerts for the load generator's faults, on a simulated clock: no broker, no wall clock.

:func:`replay` plays :class:`~vigil.sim.load.LoadGenerator`'s messages
through the stages a worker runs (:func:`~vigil.streams.stages.build_stages`:
decode, the detection engine, the correlator, the decision engine) in the
order the worker's loop takes them, and scores the alerts with the live run's
:func:`~vigil.bench.pipeline.scoring.match`. It is deterministic (the same
seed gives the same alerts), so a fault the live run missed can be replayed,
looked at and fixed; times are simulated (how late each message is read is
a parameter), so its latencies say nothing about speed.

The worker's order, kept here: telemetry is read as it arrives (the
generator's telemetry producer batches it for ``linger_s``, faults and states
go at once); each tick (``tick_interval_s`` of the stream config) the job
and node states read since the last tick (the worker's broadcast reader) go
to the detection engine, then its timers run, then the states go to the
correlating stage, then the correlator's and decision engine's timers. No
actuator acts on the decisions (as in the live run).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from vigil.bench.pipeline.scoring import match, summarize
from vigil.schemas import Alert, Decision, Envelope, decode, topic_accepts, topic_name
from vigil.sim.load import KINDS, LoadGenerator, Message
from vigil.streams.config import StreamConfig
from vigil.streams.stages import Place, build_stages

__all__ = ["Replayed", "replay"]

#: Read by the worker's broadcast reader (at its ticks), not by the detect stage.
_FEEDBACK = ("job_state", "node_state")
#: What the live run's telemetry producer batches (faults and states go through an unbatched one).
_BATCHED = ("node_samples", "iteration_step")


class Replayed:
    """A replay's generator (its injections: the ground truth), the alerts and decisions with their
    simulated arrival times, and the dead letters."""

    def __init__(self, gen: LoadGenerator) -> None:
        self.gen = gen
        self.alerts: list[tuple[Alert, float]] = []
        self.decisions: list[tuple[Decision, float]] = []
        self.dead_letters = 0

    def took(self, events: list[Envelope], now: float) -> None:
        for ev in events:
            if isinstance(ev, Alert):
                self.alerts.append((ev, now))
            elif isinstance(ev, Decision):
                self.decisions.append((ev, now))

    def scored(self) -> dict[str, Any]:
        """The live run's scoring: each fault's first alert naming its cause, per-kind counts, the incidents
        no fault explains, the decisions by action."""
        matched = match(self.gen.injections, self.alerts)
        latency = summarize(matched)
        return {"faults": matched["faults"], "unexplained_incidents": matched["unexplained_incidents"],
                "counts": {k: {"n": v["n"], "missed": v["missed"], "alerted_more_than_once": v["alerted_more_than_once"]}
                           for k, v in latency.items()},
                "decisions": dict(Counter(d.action for d, _ in self.decisions)), "dead_letters": self.dead_letters}


def replay(gpus: int, *, seed: int = 0, faults_per_kind: int = 30, warmup_s: float = 30.0,
           node_loss_gap_s: float = 6.5, kinds: tuple[str, ...] = tuple(KINDS), delivery_s: float = 0.02,
           linger_s: float = 0.1, settle_s: float = 15.0, config: StreamConfig | None = None,
           load_options: dict[str, Any] | None = None, start: float = 1.8e9,
           stall: tuple[float, float] | None = None) -> Replayed:
    """Play a ``gpus``-GPU cluster with ``faults_per_kind`` faults of each of ``kinds`` through a worker's stages.

    ``delivery_s``: from a message leaving its producer to the worker reading it; ``linger_s``: the telemetry
    producer's batching (the live run's). ``stall``: (from, for) seconds after ``start``, the path to the
    worker stalls (the broker still answers it): what is sent then is read when it ends, all at once. It
    stops ``settle_s`` after the last fault ended (as the live run), when the cluster finishes cleanly (jobs
    completed, agents leaving), and 5 s later.
    """
    config = config or StreamConfig(bootstrap="-")
    from vigil.streams.worker import TELEMETRY

    detect, correlate = build_stages(config, None, TELEMETRY)
    gen = LoadGenerator(gpus, start, seed=seed, faults_per_kind=faults_per_kind, faults_from=warmup_s,
                        node_loss_gap_s=node_loss_gap_s, kinds=kinds, **(load_options or {}))
    out = Replayed(gen)
    tick_s = config.tick_interval_s
    topics = {t: topic_name(t, config.topic_prefix) for t in (*TELEMETRY, *_FEEDBACK)}
    offsets: Counter[str] = Counter()
    #: (read at, sent at, message), in the order they are read
    inflight: list[tuple[float, float, Message]] = []
    states: list[Envelope] = []  # read by the broadcast reader since the last tick
    planned = faults_per_kind * len(kinds)
    next_tick = start + tick_s
    finished_at: float | None = None

    def read(m: Message, sent: float, now: float) -> None:
        topic = topics[m.event_type]
        if m.event_type in _FEEDBACK:
            states.extend(decode(m.value, accept=topic_accepts(topic)).events)
            return
        offsets[topic] += 1
        found = detect.on_message(Place(topic, 0, offsets[topic], sent), m.value, now)
        out.dead_letters += len(found.dead_letters)
        out.took(correlate.on_findings(found.findings, now), now)

    def tick(now: float) -> None:
        detect.engine.heard(now)  # its broker answers
        out.took(correlate.on_findings(detect.tick(now, states), now), now)
        for ev in states:
            out.took(correlate.on_feedback(ev, now, live=True), now)
        states.clear()
        out.took(correlate.tick(now), now)

    while True:
        due = gen.next_due
        if finished_at is None and due is not None and due < next_tick:
            for m in gen.advance(due):
                # batched telemetry leaves at the end of its linger window; faults and states at once
                sent = math.ceil(due / linger_s) * linger_s if m.event_type in _BATCHED and linger_s > 0 else due
                arrives = sent
                if stall is not None and start + stall[0] <= sent < start + stall[0] + stall[1]:
                    arrives = start + stall[0] + stall[1]
                inflight.append((arrives + delivery_s, sent, m))
            continue
        inflight.sort(key=lambda x: x[0])  # stable: each producer's order is kept
        n = 0
        for at, sent, m in inflight:
            if at > next_tick:
                break
            read(m, sent, at)
            n += 1
        del inflight[:n]
        tick(next_tick)
        now, next_tick = next_tick, next_tick + tick_s
        if finished_at is None and (len(gen.injections) >= planned and all(
                i.ended_at is not None and i.ended_at + settle_s < now for i in gen.injections)):
            finished_at = now
            inflight += [(now + delivery_s, now, m) for m in gen.finish(now)]
        elif finished_at is not None and now - finished_at > 5.0 and not inflight:
            return out


def main(gpus: int, seed: int, faults_per_kind: int, json_path: str | None = None) -> dict[str, Any]:
    """``python -m vigil.bench.pipeline replay``: prints the counts per kind, the unexplained incidents and
    each missed fault; ``json_path`` gets every fault's row."""
    scored = replay(gpus, seed=seed, faults_per_kind=faults_per_kind).scored()
    missed = [r for r in scored["faults"] if r["delay_s"] is None]
    if json_path:
        Path(json_path).write_text(json.dumps(scored, indent=1, default=str) + "\n")
    print(json.dumps({k: scored[k] for k in ("counts", "unexplained_incidents", "decisions", "dead_letters")}))
    for r in missed:
        print("missed:", json.dumps(r, default=str))
    return scored
