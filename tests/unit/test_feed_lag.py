"""A worker that falls behind its feed does not read the gaps in its own reading as nodes gone silent.

The cluster: 40 healthy nodes, one heartbeat a second each, written to one
partition. The worker reads that partition at a fifth of the rate it is
written for a while (an overloaded worker, or one starved of CPU), then at full
speed. Ground truth: no node is lost, except ``n07``, which stops at a known
time after the worker caught up.
"""

from __future__ import annotations

from vigil.schemas import Heartbeat, Source, from_seconds
from vigil.streams.engine.detection import DetectionEngine

T0 = 1_700_000_000.0
NODES = [f"n{i:02d}" for i in range(40)]
FEED = ("vigil.telemetry.node", 0)


def log(until: float, dead: dict[str, float]) -> list[Heartbeat]:
    """Every heartbeat written up to ``until`` (seconds after T0), in write order."""
    out = []
    for k in range(int(until) + 1):
        for i, n in enumerate(NODES):
            t = T0 + k + i / len(NODES)
            if t - T0 <= until and t < dead.get(n, float("inf")):
                out.append(Heartbeat(event_time=from_seconds(t), source=Source(node=n), seq=k, interval_s=1.0))
    return out


def replay(engine: DetectionEngine, beats: list[Heartbeat], speed_until: list[tuple[float, float]],
           with_written: bool) -> list[tuple[str, float]]:
    """Read ``beats`` in order: at each reading speed (log seconds per wall second) until a wall time;
    tick every 0.1 s of wall time; return (node, wall time) of each node_lost raised."""
    raised = []
    wall = T0
    i = 0
    for speed, until in speed_until:
        while wall < T0 + until and i < len(beats):
            wall += 0.1
            log_now = T0 + (wall - T0) * speed if speed < 1 else wall  # how far the worker has read
            while i < len(beats) and beats[i].event_time.timestamp() <= min(log_now, wall):
                written = beats[i].event_time.timestamp()
                kw = {"written": written, "feed": FEED} if with_written else {}
                engine.on_events([beats[i]], wall, **kw)
                i += 1
            raised += [(f.subject.node, wall) for f in engine.tick(wall)
                       if f.kind == "node_lost" and f.status == "raised"]
    return raised


def test_a_worker_reading_far_behind_reports_no_silence_it_caused():
    beats = log(60.0, dead={})
    # 20 s at a fifth of the write rate: the worker falls 16 s behind
    slow = [(0.2, 20.0)]
    assert replay(DetectionEngine(), beats, slow, with_written=True) == []
    # without knowing when messages were written, the gaps in its reading look like 40 silent nodes
    blind = replay(DetectionEngine(), beats, slow, with_written=False)
    assert len({n for n, _ in blind}) == len(NODES)


def test_once_caught_up_a_real_loss_is_reported():
    dead_at = T0 + 40.0
    beats = log(70.0, dead={"n07": dead_at})
    engine = DetectionEngine()
    # behind for 20 s, then it reads everything at once and keeps up from there
    raised = replay(engine, beats, [(0.2, 20.0), (1.0, 75.0)], with_written=True)
    assert [n for n, _ in raised] == ["n07"]
    [(_, at)] = raised
    assert dead_at < at < dead_at + 3.0


def test_a_loss_while_the_worker_stays_behind_is_reported_late_and_a_skewed_clock_is_no_loss():
    """The worker reads at half the write rate throughout (never caught up): a node that dies is reported
    once the log it has read shows the others going on past its timeout (late, not missed), while a node
    whose clock runs 2 s slow, but which keeps sending, is not lost."""
    dead_at, slow_clock = T0 + 30.0, {"n05": -2.0}
    written = []  # (write time, heartbeat stamped by its node's clock), in write order
    for k in range(61):
        for i, n in enumerate(NODES):
            t = T0 + k + i / len(NODES)
            if not (n == "n07" and t >= dead_at):
                stamp = t + slow_clock.get(n, 0.0)
                written.append((t, Heartbeat(event_time=from_seconds(stamp), source=Source(node=n), seq=k,
                                             interval_s=1.0)))
    engine = DetectionEngine()
    raised, wall, i = [], T0, 0
    while i < len(written):
        wall += 0.1
        read_to = T0 + (wall - T0) * 0.5
        while i < len(written) and written[i][0] <= read_to:
            engine.on_events([written[i][1]], wall, written=written[i][0], feed=FEED)
            i += 1
        assert engine.behind(wall) or wall - T0 < 3.0
        raised += [(f.subject.node, f.onset_time.timestamp()) for f in engine.tick(wall)
                   if f.kind == "node_lost" and f.status == "raised"]
    assert [n for n, _ in raised] == ["n07"]
    assert dead_at - 1.0 < raised[0][1] < dead_at  # its onset: its last heartbeat


# -- a partition delivered late while the others flow ---------------------------------------------------
OTHER = ("vigil.telemetry.node", 1)


def read_two_feeds(engine: DetectionEngine, until: float, delivered, dead: dict[str, float],
                   pulse: bool = False) -> list:
    """Nodes ``a00..a39`` write to FEED, ``b00..b39`` to OTHER, a heartbeat a second each; FEED's message
    written at ``t`` is read at ``delivered(t)`` (OTHER's at once). Ticks every 0.1 s (``pulse``: the broker
    answers before each); returns (node, wall, onset) of each node_lost raised."""
    beats = []  # (read at, write time, feed, heartbeat)
    for k in range(int(until) + 1):
        for prefix, feed in (("a", FEED), ("b", OTHER)):
            for i in range(40):
                n, t = f"{prefix}{i:02d}", T0 + k + i / 40
                if t < dead.get(n, float("inf")):
                    read = delivered(t) if feed == FEED else t
                    beats.append((read, t, feed, Heartbeat(event_time=from_seconds(t), source=Source(node=n), seq=k,
                                                           interval_s=1.0)))
    beats.sort(key=lambda b: (b[0], b[1]))  # a partition is read in write order
    raised, wall, i = [], T0, 0
    while wall < T0 + until:
        wall += 0.1
        while i < len(beats) and beats[i][0] <= wall:
            read, written, feed, hb = beats[i]
            engine.on_events([hb], wall, written=written, feed=feed)
            i += 1
        if pulse:
            engine.heard(wall)
        raised += [(f.subject.node, wall, f.onset_time.timestamp()) for f in engine.tick(wall)
                   if f.kind == "node_lost" and f.status == "raised"]
    return raised


def stalled(start: float, length: float):
    """FEED delivers nothing from ``start`` for ``length`` seconds, then what was written meanwhile at once."""
    return lambda t: T0 + start + length if T0 + start <= t < T0 + start + length else t


def test_a_partition_stalled_for_less_than_a_timeout_makes_no_node_lost():
    """Ground truth: every node keeps sending; FEED's partition is delivered 2.2 s late for a while (a
    broker serving it late, the worker's fetch starved) while OTHER flows. Judged on arrival alone (no
    grace), the FEED nodes whose last beat came early before the stall look lost: that is what the rule
    is for."""
    from vigil.streams.engine.detection import EngineParams

    assert read_two_feeds(DetectionEngine(), 40.0, stalled(20.0, 2.2), {}) == []
    on_arrival = read_two_feeds(DetectionEngine(EngineParams(late_feed_grace_s=0.0)), 40.0, stalled(20.0, 2.2), {})
    assert on_arrival and {n[0] for n, _, _ in on_arrival} == {"a"}


def test_a_partition_stalled_past_a_timeout_is_held_for_the_grace_then_reported_as_its_nodes_silence():
    """FEED (40 nodes) delivers nothing for 6 s while OTHER flows: held (its delivery, not 40 nodes lost at
    once). Stalled for longer than the grace, its nodes are judged on arrival: every one of them, and none
    of OTHER's (the correlator makes that one shared silence)."""
    from vigil.streams.engine.detection import EngineParams

    assert read_two_feeds(DetectionEngine(), 40.0, stalled(20.0, 6.0), {}) == []
    params = EngineParams(late_feed_grace_s=5.0)
    raised = read_two_feeds(DetectionEngine(params), 60.0, stalled(20.0, 20.0), {})
    assert {n for n, _, _ in raised} == {f"a{i:02d}" for i in range(40)}
    assert all(2.5 + 5.0 < at - onset <= 2.5 + 5.0 + 0.3 for _, at, onset in raised)  # timeout + grace, a tick or so


def test_a_node_lost_on_a_flowing_partition_is_still_reported_on_time():
    dead_at = T0 + 20.0
    raised = read_two_feeds(DetectionEngine(), 40.0, lambda t: t, {"a07": dead_at})
    assert [n for n, _, _ in raised] == ["a07"]
    [(_, at, onset)] = raised
    assert dead_at - 1.0 < onset < dead_at and at - onset < 2.5 + 0.3  # its timeout, and a tick or two


def test_the_only_node_of_a_partition_lost_is_reported_from_its_silence():
    """A feed whose every writer stopped carries no news at all: a partition of one node (a small cluster)
    is judged on arrival, as before, not held back for the grace."""
    dead = {f"a{i:02d}": T0 + 20.0 for i in range(40)}
    dead.pop("a00")
    dead["a00"] = T0 + 25.0  # the last writer of FEED, alone on it from 20 s
    raised = read_two_feeds(DetectionEngine(), 40.0, lambda t: t, dead)
    lost = {n: (at, onset) for n, at, onset in raised}
    assert set(lost) == {f"a{i:02d}" for i in range(40)}
    at, onset = lost["a00"]
    assert T0 + 24.0 <= onset < T0 + 25.0 and at - onset < 2.5 + 0.3


def test_every_node_silent_at_once_is_reported_at_its_timeout_not_held():
    """Both partitions go quiet because every node stopped (the agents' network), the broker still
    answering: nothing else is read, so no partition is taken for a stalled one; every node is reported
    once its partition has been quiet for its timeout (a node whose beat came early in the last second
    waits for the partition's last message, at most an interval more: the correlator's shared silence)."""
    dead = {f"{p}{i:02d}": T0 + 20.0 for p in "ab" for i in range(40)}
    raised = read_two_feeds(DetectionEngine(), 40.0, lambda t: t, dead, pulse=True)
    assert len({n for n, _, _ in raised}) == 80
    assert all(at - T0 <= 20.0 + 2.5 + 0.3 and at - onset <= 2.5 + 1.0 + 0.3 for _, at, onset in raised)
