"""Hang root cause from flight-recorder dumps: the rank missing from, or stuck in, collective N of group G.

When a job hangs, every rank that is still alive blocks in some collective.
Torch's flight recorder (see :mod:`vigil.producers.training.flight_recorder`)
keeps, per rank and per process group, the sequence number of every
collective the rank issued and whether it completed. Comparing the ranks'
dumps group by group says where the job stopped:

1. For group G, each member's *last issued* (``pg_status.last_enqueued``, else
   its highest entry) and *last completed* (``last_completed``, else its
   highest entry completed or retired) sequence numbers. The stuck
   collective is ``N = min(last completed) + 1``; the group is clean when
   nobody issued N.
2. Members that never issued N are **missing** from it: they are the culprits
   (``verdict="missing"``). When every member issued N and the recorder tells
   states (NCCL), members still ``scheduled`` while others ``started`` never
   got to run it (``not_started``). When every member is in it,
   the rank that has been **stuck longest** is named (``stuck_longest``): the
   collective itself is stuck, at the transport level. Members with no dump
   while all others wait: ``no_dump``.
3. A culprit may itself be blocked in another group (rank 2 misses the
   world all-reduce because it waits in a tensor-parallel one that rank 3
   never joined): culprits are followed across groups to the ranks that
   wait nowhere else, and the verdict names that group, with the chain.

:func:`analyze_dumps` does this on a set of dumps (one per rank; the
``FlightRecorderDump`` event's fields with ``rank`` and ``node``).
:class:`FlightRecorderAnalyzer` (registered as ``flight_recorder``) collects
a job's dumps as they arrive and analyses them once every member has
reported or ``settle_s`` after the first.

Limits: point-to-point entries are listed, not compared (their sequence
numbers are per peer pair); with Gloo the recorder has no states (only
completion), so ``not_started`` cannot be told there; a dump whose ring
buffer dropped group G's entries still has G's ``pg_status``.

References
----------
PyTorch flight recorder and its analyser ``torch/distributed/flight_recorder``
(``fr_trace``), which matches entries across ranks by group and sequence id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from vigil.detectors.base import Detector, DetectorError, Finding, _check_positive, _check_time, register

__all__ = ["Attribution", "analyze_dumps", "dump_record", "FlightRecorderAnalyzer"]

_PRIORITY = {"missing": 0, "not_started": 1, "no_dump": 2, "stuck_longest": 3}


@dataclass(frozen=True)
class Attribution:
    """What the dumps say: the verdict, where (group, sequence number, op), and who."""

    verdict: str  # missing | not_started | stuck_longest | no_dump | no_mismatch | unavailable
    group: str | None = None
    group_desc: str | None = None
    seq: int | None = None
    op: str | None = None
    culprit_ranks: tuple[int, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    waiting_ranks: tuple[int, ...] = ()
    no_dump_ranks: tuple[int, ...] = ()
    onset: float | None = None
    stuck_s: float | None = None
    chain: tuple[dict[str, Any], ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)


def dump_record(event: Any) -> dict[str, Any]:
    """A ``FlightRecorderDump`` event as the mapping :func:`analyze_dumps` reads (adds ``rank``, ``node``)."""
    d = event.model_dump(mode="json")
    d["rank"] = event.source.rank
    d["node"] = event.source.node
    return d


@dataclass
class _Group:
    name: str
    desc: str | None
    members: set[int]


@dataclass
class _Result:
    group: str
    desc: str | None
    seq: int
    op: str | None
    verdict: str
    culprits: list[int]
    missing: list[int]
    waiting: list[int]
    no_dump: list[int]
    onset_ns: int | None
    stuck_since_ns: int | None


def _validate(dumps: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    if not isinstance(dumps, Sequence) or isinstance(dumps, (str, bytes)):
        raise DetectorError("dumps must be a sequence of per-rank mappings")
    by_rank: dict[int, Mapping[str, Any]] = {}
    for d in dumps:
        if not isinstance(d, Mapping):
            raise DetectorError(f"a dump must be a mapping, got {type(d).__name__}")
        r = d.get("rank")
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise DetectorError(f"a dump's 'rank' must be a non-negative int, got {r!r}")
        for k in ("groups", "entries"):
            if not isinstance(d.get(k, []), list):
                raise DetectorError(f"rank {r}: {k!r} must be a list")
        by_rank[r] = d  # a later dump of a rank replaces an earlier one
    return by_rank


def _groups(dumps: Mapping[int, Mapping[str, Any]]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for r, d in dumps.items():
        for g in d.get("groups") or []:
            name = str(g.get("name"))
            grp = out.setdefault(name, _Group(name, g.get("desc"), set()))
            grp.desc = grp.desc or g.get("desc")
            grp.members.update(int(x) for x in g.get("ranks") or [])
        for e in d.get("entries") or []:
            grp = out.setdefault(str(e.get("group")), _Group(str(e.get("group")), None, set()))
            if not grp.members or r not in grp.members:
                grp.members.add(r)  # a rank with entries in a group is a member, whatever the config says
    return out


def _progress(d: Mapping[str, Any], group: str) -> tuple[int, int, dict[int, Mapping[str, Any]]]:
    """(last issued, last completed, entries by seq) of one rank in one group (collectives only)."""
    status = next((g for g in d.get("groups") or [] if str(g.get("name")) == group), {})
    es = {int(e["seq"]): e for e in d.get("entries") or []
          if str(e.get("group")) == group and not e.get("is_p2p") and e.get("seq") is not None}
    last_enq = status.get("last_enqueued")
    if last_enq is None:
        last_enq = max(es, default=0)
    last_done = status.get("last_completed")
    if last_done is None:
        done = [s for s, e in es.items() if e.get("state") == "completed" or e.get("retired") is True]
        if done:
            last_done = max(done)
        else:
            last_done = min(es) - 1 if es else 0
    return int(last_enq), int(last_done), es


def _analyze_group(g: _Group, dumps: Mapping[int, Mapping[str, Any]], available: set[int]) -> _Result | None:
    reporting = sorted(r for r in g.members if r in available)
    if not reporting:
        return None
    prog = {r: _progress(dumps[r], g.name) for r in reporting}
    n = min(p[1] for p in prog.values()) + 1
    present = [r for r in reporting if prog[r][0] >= n]
    if not present:
        return None  # nobody issued collective N: the group is idle, not stuck
    missing = [r for r in reporting if prog[r][0] < n]
    no_dump = sorted(g.members - set(reporting))
    entry = {r: prog[r][2].get(n) for r in present}
    known = [e for e in entry.values() if e is not None]
    op = next((e.get("op") for e in known if e.get("op")), None)
    created = [int(e["created_ns"]) for e in known if e.get("created_ns")]
    onset_ns = min(created) if created else None
    states = {r: (e.get("state") if e is not None else None) for r, e in entry.items()}
    stuck_since = None
    if missing:
        verdict, culprits = "missing", missing
    elif no_dump:
        verdict, culprits = "no_dump", no_dump
    elif any(s == "started" for s in states.values()) and any(s == "scheduled" for s in states.values()):
        verdict, culprits = "not_started", sorted(r for r, s in states.items() if s == "scheduled")
    else:
        def since(r: int) -> float:
            e = entry[r]
            if e is None:
                return float("inf")
            return float(e.get("started_ns") or e.get("created_ns") or float("inf"))
        first = min(present, key=lambda r: (since(r), r))
        verdict, culprits = "stuck_longest", [first]
        stuck_since = int(since(first)) if since(first) != float("inf") else None
    return _Result(g.name, g.desc, n, op, verdict, culprits, missing, present, no_dump, onset_ns, stuck_since)


def analyze_dumps(dumps: Sequence[Mapping[str, Any]], *, now: float) -> Attribution:
    """Compare the ranks' flight-recorder dumps; name the culprit of the hang.

    Parameters
    ----------
    dumps : sequence of mapping
        One per rank (a later one of the same rank replaces an earlier one):
        ``rank``, optionally ``node``, ``available``, ``unavailable_reason``,
        ``groups`` (``{name, desc, ranks, last_enqueued, last_completed}``) and
        ``entries`` (``{group, seq, is_p2p, op, state, retired, created_ns,
        started_ns}``), as in :class:`~vigil.schemas.events.FlightRecorderDump`.
    now : float
        Seconds since the epoch, for how long the culprit has been stuck.

    Examples
    --------
    Four ranks of one group; rank 2 never issued all-reduce number 3, the
    others wait in it:

    >>> def dump(rank, issued, done):
    ...     entries = [{"group": "0", "seq": s, "is_p2p": False, "op": "nccl:all_reduce",
    ...                 "state": "completed" if s <= done else "started", "created_ns": s * 10**9}
    ...                for s in range(1, issued + 1)]
    ...     return {"rank": rank, "available": True, "entries": entries,
    ...             "groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}]}
    >>> a = analyze_dumps([dump(0, 3, 2), dump(1, 3, 2), dump(2, 2, 2), dump(3, 3, 2)], now=100.0)
    >>> a.verdict, a.group, a.seq, a.op, a.culprit_ranks, a.waiting_ranks
    ('missing', '0', 3, 'nccl:all_reduce', (2,), (0, 1, 3))
    """
    _check_time(now, "now")
    by_rank = _validate(dumps)
    available = {r for r, d in by_rank.items() if d.get("available", True)}
    nodes = {r: d.get("node") for r, d in by_rank.items() if d.get("node")}
    unavailable = {r: d.get("unavailable_reason") or "unavailable" for r, d in by_rank.items() if r not in available}
    base_ev: dict[str, Any] = {"dumps": len(by_rank), "ranks_with_dump": sorted(available)}
    if unavailable:
        base_ev["unavailable"] = {str(r): why for r, why in sorted(unavailable.items())}
    if not available:
        return Attribution("unavailable", evidence=dict(base_ev, backends=sorted({str(d.get("backend")) for d in by_rank.values()})))
    groups = _groups({r: by_rank[r] for r in available})
    results = [res for g in groups.values() if (res := _analyze_group(g, by_rank, available)) is not None]
    if not results:
        return Attribution("no_mismatch", evidence=dict(base_ev, groups=sorted(groups)))
    by_group = {res.group: res for res in results}
    waiting_in: dict[int, list[str]] = {}
    for res in results:
        for r in res.waiting:
            waiting_in.setdefault(r, []).append(res.group)

    # Follow culprits into the other groups they wait in; roots wait nowhere else.
    roots: dict[str, set[int]] = {}
    for res in results:
        stack = [(res.group, c) for c in res.culprits]
        seen: set[tuple[str, int]] = set()
        while stack:
            gname, c = stack.pop()
            if (gname, c) in seen:
                continue
            seen.add((gname, c))
            elsewhere = [h for h in waiting_in.get(c, []) if h != gname]
            if not elsewhere:
                roots.setdefault(gname, set()).add(c)
            for h in elsewhere:
                stack.extend((h, c2) for c2 in by_group[h].culprits)
    cycle = not roots
    if cycle:  # every culprit waits in another group: a cross-group ordering deadlock
        first = min(results, key=lambda x: (x.onset_ns or 0, x.group))
        roots = {first.group: set(first.culprits)}

    def covers(root: str, g: _Result) -> bool:
        """Root group ``root`` explains stuck group ``g``: each culprit of g is a root culprit or waits in ``root``."""
        return all(c in roots[root] or root in waiting_in.get(c, []) for c in g.culprits)

    covered = {h: [g.group for g in results if g.group != h and covers(h, g)] for h in roots}
    # Among equals, the group other groups' culprits are stuck in is the deeper cause.
    via_wait = {h: sum(1 for g in results if g.group != h for c in g.culprits if h in waiting_in.get(c, []))
                for h in roots}
    root_group = min(roots, key=lambda h: (-len(covered[h]), -via_wait[h], _PRIORITY[by_group[h].verdict],
                                           by_group[h].onset_ns or 0, h))
    res = by_group[root_group]
    culprits = tuple(sorted(roots[root_group]))
    onset = res.onset_ns / 1e9 if res.onset_ns else None
    stuck_s = (now - res.stuck_since_ns / 1e9) if res.stuck_since_ns else (now - onset if onset else None)
    chain = tuple({"group": by_group[h].group, "group_desc": by_group[h].desc, "seq": by_group[h].seq,
                   "op": by_group[h].op, "verdict": by_group[h].verdict, "culprit_ranks": by_group[h].culprits}
                  for h in covered[root_group] + [root_group])
    pending_p2p = {str(r): sum(1 for e in by_rank[r].get("entries") or []
                               if e.get("is_p2p") and e.get("state") != "completed" and e.get("retired") is not True)
                   for r in sorted(available)}
    ev = dict(base_ev, nodes={str(r): n for r, n in sorted(nodes.items())},
              stuck_groups=sorted(by_group), cycle=cycle, pending_p2p={k: v for k, v in pending_p2p.items() if v})
    return Attribution(res.verdict, res.group, res.desc, res.seq, res.op, culprits, tuple(res.missing),
                       tuple(res.waiting), tuple(res.no_dump), onset, stuck_s, chain, ev)


def _summary(a: Attribution) -> str:
    who = ",".join(map(str, a.culprit_ranks))
    where = f"collective {a.seq} ({a.op}) of group {a.group}" + (f" ({a.group_desc})" if a.group_desc else "")
    waiting = ",".join(map(str, a.waiting_ranks))
    if a.verdict == "missing":
        return f"rank(s) {who} never entered {where}; rank(s) {waiting} wait in it"
    if a.verdict == "not_started":
        return f"rank(s) {who} issued but never started {where}; the others run it"
    if a.verdict == "no_dump":
        return f"no dump from rank(s) {who}; every rank that answered waits in {where}"
    return f"every member is in {where}; rank {who} has been stuck longest"


@register
class FlightRecorderAnalyzer(Detector):
    """A job's flight-recorder dumps, collected as they arrive and compared (see :func:`analyze_dumps`).

    A *round* begins with the first dump; it is analysed as soon as every
    member of every group named so far has sent one (``update``), or
    ``settle_s`` after the first (``tick``). A dump arriving more than
    ``settle_s`` after the last analysis begins a new round.

    Parameters
    ----------
    settle_s : float, default 15
        How long to wait for the other ranks' dumps.

    Update signature: ``update(dump, *, t)``, ``dump`` as in
    :func:`analyze_dumps` (:func:`dump_record` of the event), ``t`` its time.

    Finding: kind ``"collective_stuck"`` (severity 2) when a culprit is named:
    onset = when the first rank entered the stuck collective (the round's
    first dump time if unknown); evidence ``verdict`` (missing | not_started | no_dump |
    stuck_longest), ``group``, ``group_desc``, ``seq``, ``op``,
    ``culprit_ranks``, ``missing_ranks``, ``waiting_ranks``,
    ``no_dump_ranks``, ``rank`` and ``node`` (the first culprit's),
    ``stuck_s``, ``chain``, ``summary`` and what the dumps held. Kind
    ``"flight_recorder_unavailable"`` (severity 2) when no rank's recorder
    gave a dump (onset: the round's first dump time): evidence ``unavailable`` (rank -> reason). Nothing when the
    dumps agree (no collective is pending): :attr:`attribution` says so.

    Examples
    --------
    >>> det = FlightRecorderAnalyzer(settle_s=10)
    >>> grp = [{"name": "0", "desc": "default_pg", "ranks": [0, 1]}]
    >>> det.update({"rank": 0, "node": "n0", "groups": grp, "entries": [
    ...     {"group": "0", "seq": 7, "op": "gloo:all_reduce", "retired": False, "created_ns": 5 * 10**9}]}, t=40.0)
    >>> det.finding is None      # waiting for rank 1's dump
    True
    >>> det.update({"rank": 1, "node": "n1", "groups": grp, "entries": [
    ...     {"group": "0", "seq": 6, "op": "gloo:all_reduce", "retired": True, "created_ns": 4 * 10**9}]}, t=41.0)
    >>> f = det.finding
    >>> f.kind, f.onset, f.evidence["verdict"], f.evidence["rank"], f.evidence["node"], f.evidence["seq"]
    ('collective_stuck', 5.0, 'missing', 1, 'n1', 7)
    """

    name = "flight_recorder"
    version = "1"
    consumes = ("flight_recorder_dump",)
    per = "job"

    def __init__(self, settle_s: float = 15.0) -> None:
        self.settle_s = _check_positive(settle_s, "settle_s")
        self._reset()

    def _reset(self) -> None:
        self._round: dict[int, dict[str, Any]] = {}
        self._first: float | None = None
        self._analysed_at: float | None = None
        self._attribution: Attribution | None = None
        self._finding: Finding | None = None

    def observe(self, item: Any, *, t: float, context: Any = None) -> None:
        """A rank's dump event (:class:`~vigil.schemas.FlightRecorderDump`)."""
        self.update(dump_record(item), t=t)

    def update(self, dump: Mapping[str, Any], *, t: float) -> None:
        t = _check_time(t, "t")
        _validate([dump])
        if self._analysed_at is not None and t - self._analysed_at > self.settle_s:
            self._round, self._first, self._analysed_at = {}, None, None
        if self._analysed_at is not None:  # a straggling dump of the analysed round: analyse again
            self._round[int(dump["rank"])] = dict(dump)
            self._analyse(t)
            return
        self._round[int(dump["rank"])] = dict(dump)
        if self._first is None:
            self._first = t
        members: set[int] = set()
        for d in self._round.values():
            for g in d.get("groups") or []:
                members.update(int(x) for x in g.get("ranks") or [])
        if members and members <= set(self._round):
            self._analyse(t)

    def tick(self, now: float) -> None:
        now = _check_time(now, "now")
        if self._first is not None and self._analysed_at is None and now - self._first >= self.settle_s:
            self._analyse(now)

    def _analyse(self, t: float) -> None:
        a = analyze_dumps(list(self._round.values()), now=t)
        self._attribution = a
        self._analysed_at = t
        if a.verdict in ("no_mismatch",):
            self._finding = None
            return
        # Onset: when the recorders were asked (the round's first dump), or when the stuck collective began.
        asked = min(t, self._first) if self._first is not None else t
        if a.verdict == "unavailable":
            self._finding = Finding("flight_recorder_unavailable", 2, asked, t, dict(a.evidence, verdict="unavailable"))
            return
        nodes = a.evidence.get("nodes", {})
        first = a.culprit_ranks[0] if a.culprit_ranks else None
        ev = {"verdict": a.verdict, "group": a.group, "group_desc": a.group_desc, "seq": a.seq, "op": a.op,
              "culprit_ranks": list(a.culprit_ranks), "missing_ranks": list(a.missing_ranks),
              "waiting_ranks": list(a.waiting_ranks), "no_dump_ranks": list(a.no_dump_ranks),
              "rank": first, "node": nodes.get(str(first)) if first is not None else None,
              "stuck_s": a.stuck_s, "chain": [dict(c) for c in a.chain], "summary": _summary(a)}
        ev.update({k: v for k, v in a.evidence.items() if k not in ev})
        self._finding = Finding("collective_stuck", 2, a.onset if a.onset is not None else asked, t, ev,
                                subject={"rank": first, "node": ev["node"]})

    @property
    def attribution(self) -> Attribution | None:
        """The last analysis (None before the first)."""
        return self._attribution

    @property
    def finding(self) -> Finding | None:
        return self._finding

    @classmethod
    def _conformance_params(cls) -> dict[str, Any]:
        return {"settle_s": 5.0}

    @classmethod
    def _conformance_feed(cls, seed: int) -> Iterable[tuple[str, tuple, dict]]:
        import random

        rng = random.Random(seed)
        world = 4
        calls: list[tuple[str, tuple, dict]] = []
        t = 100.0
        for _round in range(3):  # healthy dumps: every rank completed the same collectives
            n = rng.randint(3, 9)
            for r in range(world):
                entries = [{"group": "0", "seq": s, "is_p2p": False, "op": "nccl:all_reduce", "state": "completed",
                            "created_ns": int((t - 10 + s) * 1e9)} for s in range(max(1, n - 4), n + 1)]
                groups = [{"name": "0", "desc": "default_pg", "ranks": list(range(world)), "last_enqueued": n,
                           "last_completed": n}]
                calls.append(("update", ({"rank": r, "node": f"n{r}", "groups": groups, "entries": entries},), {"t": t}))
                t += rng.uniform(0.1, 1.0)
            calls.append(("tick", (t + 6.0,), {}))
            t += 60.0
        return calls

    @classmethod
    def _conformance_warmup(cls) -> int:
        return 15
