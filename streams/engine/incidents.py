"""Incidents: one per root cause, from findings across signals and subjects.

The correlator receives every finding (raised / cleared) and keeps open
incidents. Each incident has a root finding and the findings it explains
(its evidence). Attribution is a small set of explicit rules,
:func:`explains` (in :mod:`vigil.streams.engine.attribution`): a lost
node explains the hang, NCCL timeouts and connection errors of the jobs
on it (the rank that times out is usually healthy); a congested NIC
explains a communication fail-slow of a job on that node; a degraded GPU
explains a computation fail-slow; a crashed rank explains its job's hang
and its peers' timeouts; a fatal XID explains the crashes on its node.

When a stronger cause arrives after its symptom already opened an incident,
that incident is re-rooted (same incident id, an ``update`` whose kind and
subject name the cause), so one root cause stays one incident.

Many nodes going silent at the same moment share a cause (the telemetry
path, a switch, the broker) until shown otherwise: from ``silence_group``
lost nodes with onsets within ``silence_window_s`` of each other, their
incidents become one ``nodes_silent`` incident (sev2, no node named as the
culprit), told again at most every ``silence_hold_s`` as nodes join it. It
explains only waiting (hangs, timeouts): a stalled path crashes nothing, so
a crash or XID reported meanwhile is its own incident. A hang of one of many
jobs that stopped together waits for its nodes' news (fast steps time out
before heartbeats do). When every node is heard again, ``silence_hold_s`` later (what they sent
meanwhile is read by then) the silence resolves, and what it explained that
still holds beyond its own timeout (a job still hung) is handed back; it
stays the late cause of timeouts, never of hangs; a node lost again after it
was heard is a loss of its own; nodes still silent ``silence_split_s`` after
the others returned are handed back one by one. What a lost node reported
itself from over a beat after its last one it was running to report: not
the loss's (a spooled report proves it alive, not reachable: its loss still
ends when it is heard).

Only a cause that held when a finding began explains it: a lost node that came
back, or a job that ended, takes no later fault into its incident; but what
began while it held and is found after it cleared (the hang of a job on a lost
node, whose timeout runs out after the node came back) is still its own, told
in a further ``resolved`` version when its incident has closed since (within
``late_cause_s``; never a page of its own). A cause
explains only what was found after it began (within ``skew_s`` of clock skew
between sources): a node lost a minute after an XID on it does not re-root
the XID's incident, it is a new one. And a cause on a node explains a job's
symptoms only within the run it began in: a job that ended and was started
again (requeued by its scheduler) is a new run, whose failures are new
incidents even on a node whose older incident is still open.
One exception: a hung job's flight-recorder verdict (``collective_stuck``, or the
recorder being unavailable) is taken from the ranks just before the restart
that ends the hang, and may be heard after that restart closed the incident;
within ``late_cause_s`` it still names that incident's cause, in a further
``resolved`` version (never a page of its own).

Pure bookkeeping, no Kafka; time is an argument. Incident ids derive from
the founding finding, and alert event ids from (incident id, version), so
replaying the same findings yields the same alerts and consumers drop repeats.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from vigil.schemas import Alert, DetectorFinding, Slowdown, Source, Subject, from_seconds, to_seconds
from vigil.schemas.evidence import (
    ChainBrokenEvidence, CollectiveStuckEvidence, FailSlowEvidence, NodesSilentEvidence, SilenceEvidence, XidEvidence,
)
from vigil.streams.engine.attribution import (  # noqa: F401  (re-exported: the kinds' old home)
    ANNOTATIONS, COLLECTIVE_STUCK, CRASHES, GPU_CAUSES, JOB_SYMPTOMS, LINK_CAUSES, PEER_SYMPTOMS, SILENCE_SYMPTOMS,
    TRANSIENT, explains,
    subject_key,
)

_INCIDENT_NS = uuid.UUID("0b6c1a52-8f0e-4a43-9d4b-6b8f3e1f2a90")
MAX_EVIDENCE = 100
#: Many nodes silent together: one incident, a shared cause.
NODES_SILENT = "nodes_silent"
#: What a shared silence that closed is still the late cause of: the timeouts it made (a job found hung
#: after it is its own).
SILENCE_AFTERMATH = SILENCE_SYMPTOMS - {"task_hang", "iteration_period_lost"}
#: What the flight recorders say of a hang: heard late, it still belongs to the hang's closed incident.
LATE_CAUSES = {COLLECTIVE_STUCK} | ANNOTATIONS


@dataclass
class Incident:
    incident_id: uuid.UUID
    root: DetectorFinding
    members: dict[str, DetectorFinding] = field(default_factory=dict)  # finding key -> raised finding
    cleared: dict[str, float] = field(default_factory=dict)  # finding key -> when its condition ended
    evidence: list[dict[str, Any]] = field(default_factory=list)
    evidence_count: int = 0
    severity: int = 3
    version: int = 0
    opened_at: float = 0.0
    last_evidence_at: float = 0.0
    summary: str = ""
    told_at: float = 0.0  # when its last version was published
    heard_clear_at: float = 0.0  # when one of its lost nodes was last heard again
    untold: bool = False  # it changed since (a shared silence's nodes are told at most every silence_hold_s)


def finding_key(f: DetectorFinding) -> str:
    return f"{f.kind}|{subject_key(f.subject)}|{to_seconds(f.onset_time):.6f}"


def _silence_root(f: DetectorFinding, nodes: list[str], onset: float) -> DetectorFinding:
    """The root of a shared silence: no node is the culprit; the cause is what they share."""
    return f.model_copy(update={
        "event_id": uuid.uuid5(_INCIDENT_NS, f"silence|{'+'.join(nodes)}|{onset:.3f}"), "kind": NODES_SILENT,
        "severity": 2, "subject": Subject(), "onset_time": from_seconds(onset), "detector": "correlator",
        "detector_version": "1", "job_nodes": [], "affected_jobs": [],
        "evidence": {"nodes": nodes, "likely_cause": "a shared path: the agents' network or telemetry path, a "
                     "switch, or the broker; check those before any node"}})


def _summary(f: DetectorFinding) -> str:
    subject = " ".join(f"{k}={v}" for k, v in f.subject.model_dump(exclude_none=True).items())
    ev = f.facts  # the evidence's typed view for the kind (vigil.schemas.evidence)
    detail = ""
    if isinstance(ev, SilenceEvidence) and f.kind == "node_lost":
        detail = f": no heartbeat for {_num(ev.silence_s):.1f} s"
    elif isinstance(ev, SilenceEvidence):
        detail = f": no iteration for {_num(ev.silence_s):.1f} s (timeout {_num(ev.timeout_s):.2f} s)"
    elif isinstance(ev, FailSlowEvidence):
        detail = f": iteration time {100 * _num(ev.rel_change):+.0f}% ({ev.slowdown_class or 'unclassified'})"
    elif isinstance(ev, XidEvidence):
        detail = f": XID {ev.code} {ev.mnemonic or ''} -> {ev.action or ''}"
    elif isinstance(ev, CollectiveStuckEvidence):
        return f"{f.kind} {subject}: {ev.summary or ''}"[:1000]
    elif isinstance(ev, ChainBrokenEvidence):
        return f"{f.kind} {subject}: {ev.why or ''}"[:1000]
    elif isinstance(ev, NodesSilentEvidence):
        nodes = ev.nodes
        return f"{len(nodes)} nodes went silent together ({', '.join(nodes[:8])}{'...' if len(nodes) > 8 else ''}): " \
               f"likely a shared cause, {ev.likely_cause or ''}"
    return f"{f.kind} {subject}{detail}"


def _num(x: float | None) -> float:
    return 0.0 if x is None else x


class Correlator:
    """Findings in, alerts out: open, update (evidence, severity, attribution), resolve."""

    def __init__(self, cluster_emitter: str = "vigil-correlate", transient_hold_s: float = 600.0,
                 silence_group: int = 3, silence_window_s: float = 5.0, silence_split_s: float = 30.0,
                 silence_hold_s: float = 1.5, late_cause_s: float = 60.0, skew_s: float = 5.0,
                 node_lost_after_s: float = 3.5) -> None:
        if silence_group < 2:
            raise ValueError(f"silence_group must be >= 2, got {silence_group}")
        if not skew_s >= 0:
            raise ValueError(f"skew_s must be >= 0 s, got {skew_s}")
        self.emitter = cluster_emitter
        self.transient_hold_s = transient_hold_s
        self.silence_group = silence_group
        self.silence_window_s = silence_window_s
        self.silence_split_s = silence_split_s
        self.silence_hold_s = silence_hold_s
        #: the longest a node's heartbeat detector takes to tell a loss, from its last beat (2.5 intervals and
        #: one of delivery delay at the agents' 1 s): how long a hang among many may wait for its nodes' news
        self.node_lost_after_s = node_lost_after_s
        #: clock skew allowed between the sources of a cause and of what it explains
        self.skew_s = skew_s
        #: lost nodes held back a moment while another is silent: finding key -> (finding, when to open)
        self._held: dict[str, tuple[DetectorFinding, float]] = {}
        self.incidents: dict[uuid.UUID, Incident] = {}
        self._seen: OrderedDict[uuid.UUID, None] = OrderedDict()
        #: job -> time of its last recovery: symptoms that began before it belong to the resolved failure.
        self._recovered_at: dict[str, float] = {}
        self.late_cause_s = late_cause_s
        #: job -> (incident, when, why) of its last hang incident closed: see LATE_CAUSES
        self._closed_hangs: dict[str, tuple[Incident, float, str]] = {}
        #: incident -> (incident, when, why) closed in the last ``late_cause_s`` because its findings cleared:
        #: what began while its cause held is still its own (see :meth:`_after_close`)
        self._cleared_incidents: dict[uuid.UUID, tuple[Incident, float, str]] = {}
        #: job -> when its current run began (it started, or its last run ended); jobs running now
        self._run_began: dict[str, float] = {}
        self._running: set[str] = set()

    def open_incidents(self) -> list[Incident]:
        return list(self.incidents.values())

    def on_finding(self, f: DetectorFinding, now: float) -> list[Alert]:
        if f.event_id in self._seen:
            return []  # redelivered
        self._seen[f.event_id] = None
        while len(self._seen) > 100_000:
            self._seen.popitem(last=False)
        return self._on_raised(f, now) if f.status == "raised" else self._on_cleared(f, now)

    def _on_raised(self, f: DetectorFinding, now: float) -> list[Alert]:
        key = finding_key(f)
        job = f.subject.job
        if f.kind in LATE_CAUSES and (late := self._late_cause(f, now)) is not None:
            return late
        if job is not None and job in self._recovered_at and to_seconds(f.onset_time) < self._recovered_at[job]:
            return []  # late evidence of a failure already recovered from
        for inc in self.incidents.values():
            if key in inc.members:
                return []
        if f.kind == "node_lost" and key not in self._held:
            shared = self._shared_silence(f, now)
            if shared is not None:
                return shared
        if f.kind == "task_hang" and key not in self._held and self._among_many_silent(f):
            # Many jobs stopped stepping at once: their nodes' silence may be told a moment later (a job's
            # hang timeout can run out before its nodes' heartbeat timeout); held back that moment, a
            # shared silence that explains it takes it, and no hang is paged for a stalled telemetry path.
            due = max(now, to_seconds(f.onset_time) + self.node_lost_after_s) + self.silence_hold_s
            self._held[key] = (f, due)
            return []
        return self._place(f, key, now)

    def _place(self, f: DetectorFinding, key: str, now: float) -> list[Alert]:
        """Into an incident whose cause explains it, as the new root of those it explains, or its own."""
        # 1. an open incident's cause explains it: more evidence (not a job's symptoms from
        # before its recovery: a node-rooted incident outlives the jobs moved off the node; not a
        # cause that had cleared when it began: a node that came back explains nothing that happens later)
        for inc in self._by_age():
            if inc.root.kind == NODES_SILENT and f.kind not in SILENCE_SYMPTOMS:
                continue  # a stalled path or a partition makes jobs wait; it crashes nothing, slows no GPU
            if any(self._explains(m, f) for k, m in inc.members.items()
                   if self._current(m) and self._held_at(inc, k, f)):
                return self._attach(inc, f, now)
        if f.kind in ANNOTATIONS:
            return []  # nothing to annotate: not an incident of its own
        # 1b. the cause of an incident closed a moment ago explains it, and held when it began
        late = self._after_close(f, key, now)
        if late is not None:
            return late
        # 2. it explains open incidents: it becomes their root (re-rooting the oldest)
        absorbed = [inc for inc in self._by_age() if self._explains(f, inc.root)]
        if absorbed:
            first, rest = absorbed[0], absorbed[1:]
            alerts = []
            first.members[key] = f
            first.root = f
            first.severity = min(first.severity, f.severity)
            first.summary = f"{_summary(f)} (explains {len(first.members) - 1} finding(s))"
            self._add_evidence(first, f, now)
            for other in rest:
                for k, m in other.members.items():
                    first.members[k] = m
                first.cleared |= other.cleared
                first.evidence_count += other.evidence_count
                alerts.append(self._close(other, now, f"merged into incident {first.incident_id}", merged=True))
            alerts.insert(0, self._alert(first, "update", now))
            return alerts
        # 3. a new root cause
        inc = Incident(
            incident_id=uuid.uuid5(_INCIDENT_NS, f"{f.kind}|{subject_key(f.subject)}|{to_seconds(f.onset_time):.3f}"),
            root=f, severity=f.severity, opened_at=now, summary=_summary(f),
        )
        inc.members[key] = f
        self._add_evidence(inc, f, now)
        self.incidents[inc.incident_id] = inc
        return [self._alert(inc, "open", now)]

    @staticmethod
    def _held_at(inc: Incident, key: str, f: DetectorFinding) -> bool:
        """Did ``inc``'s member ``key`` still hold when ``f`` began? (A symptom found after its cause cleared
        may have begun before: a job whose node was lost hangs, and its hang timeout runs out after the
        node came back.)"""
        ended = inc.cleared.get(key)
        return ended is None or to_seconds(f.onset_time) <= ended

    def _after_close(self, f: DetectorFinding, key: str, now: float) -> list[Alert] | None:
        """``f`` began while the cause of an incident that closed since (its findings cleared) still held:
        it is that incident's, told in a further ``resolved`` version (no second page for one cause);
        None when no such incident explains it."""
        for inc, closed_at, why in self._cleared_incidents.values():
            if now - closed_at > self.late_cause_s:
                continue
            if inc.root.kind == NODES_SILENT and f.kind not in SILENCE_AFTERMATH:
                continue  # a shared silence is a guess at a cause
            if any(self._explains(m, f) for k, m in inc.members.items() if k in inc.cleared and self._current(m)
                   and self._held_at(inc, k, f)):
                inc.members[key] = f
                self._add_evidence(inc, f, now)
                inc.summary = f"{_summary(inc.root)} (explains {len(inc.members) - 1} finding(s)) — resolved: {why}"
                return [self._alert(inc, "resolved", now)]
        return None

    def _late_cause(self, f: DetectorFinding, now: float) -> list[Alert] | None:
        """The recorders' verdict on a hang whose incident has closed since they were asked: that incident's
        cause, told in a further ``resolved`` version; None when there is no such incident."""
        held = self._closed_hangs.get(f.subject.job or "")
        if held is None:
            return None
        inc, closed_at, why = held
        if now - closed_at > self.late_cause_s or to_seconds(f.onset_time) > closed_at:
            return None  # asked after that incident closed: about something else
        if finding_key(f) in inc.members:
            return []
        inc.members[finding_key(f)] = f
        self._add_evidence(inc, f, now)
        if f.kind not in ANNOTATIONS:
            inc.root = f
            inc.severity = min(inc.severity, f.severity)
        inc.summary = f"{_summary(inc.root)} (explains {len(inc.members) - 1} finding(s)) — resolved: {why}"
        return [self._alert(inc, "resolved", now)]

    def _explains(self, cause: DetectorFinding, symptom: DetectorFinding) -> bool:
        """:func:`explains`, where the cause could have caused it: it began before the symptom was found
        (within ``skew_s``), and a job's symptom is of the run the cause began in."""
        began = to_seconds(cause.onset_time)
        if began > to_seconds(symptom.event_time) + self.skew_s or not explains(cause, symptom):
            return False
        job = symptom.subject.job
        return job is None or cause.subject.job == job or began >= self._run_began.get(job, float("-inf"))

    def _current(self, f: DetectorFinding) -> bool:
        """Is ``f`` still evidence: not a symptom of a job from before that job recovered?"""
        job = f.subject.job
        return job is None or to_seconds(f.onset_time) >= self._recovered_at.get(job, float("-inf"))

    def _attach(self, inc: Incident, f: DetectorFinding, now: float) -> list[Alert]:
        new_kind = all(m.kind != f.kind for m in inc.members.values())
        inc.members[finding_key(f)] = f
        self._add_evidence(inc, f, now)
        worse = f.severity < inc.severity and inc.root.kind != NODES_SILENT  # a shared cause keeps its own
        inc.severity = inc.severity if inc.root.kind == NODES_SILENT else min(inc.severity, f.severity)
        return [self._alert(inc, "update", now)] if worse or new_kind else []

    def _on_cleared(self, f: DetectorFinding, now: float) -> list[Alert]:
        key = finding_key(f)
        if self._held.pop(key, None) is not None:
            return []  # back before it was told: nothing to say
        for inc in list(self.incidents.values()):
            if key in inc.members:
                inc.cleared[key] = min(now, to_seconds(f.event_time))  # when it ended, by its detector
                if f.kind == "node_lost":
                    inc.heard_clear_at = now
                if inc.root.kind != NODES_SILENT and self._all_clear(inc, now):
                    return [self._close(inc, now, f"{f.kind} cleared", cleared=True)]
                return []
        return []

    def recovered(self, incident_ids: list[uuid.UUID], job: str | None, at: float, why: str) -> list[Alert]:
        """A remedy worked: resolve these incidents; the job's symptoms older than ``at`` are theirs.

        A failure that comes back after this opens a new incident, which the
        decision engine sees as the same failure returning.
        """
        if job is not None:
            self._recovered_at[job] = max(at, self._recovered_at.get(job, at))
        return [self._close(self.incidents[i], at, why) for i in incident_ids if i in self.incidents]

    def tick(self, now: float) -> list[Alert]:
        """Resolve incidents whose findings have all cleared or expired; split long silences; open the
        lost nodes held back that no third one joined."""
        out = [self._close(inc, now, "no new evidence", cleared=True) for inc in list(self.incidents.values())
               if inc.root.kind != NODES_SILENT and self._all_clear(inc, now)]
        for job in [j for j, (_, at, _) in self._closed_hangs.items() if now - at > self.late_cause_s]:
            del self._closed_hangs[job]
        for iid in [i for i, (_, at, _) in self._cleared_incidents.items() if now - at > self.late_cause_s]:
            del self._cleared_incidents[iid]
        for key, (f, due) in list(self._held.items()):
            if now >= due:
                del self._held[key]
                if self._current(f):  # not of a job that recovered or ended while it was held
                    out += self._place(f, key, now)
        for inc in [i for i in self.incidents.values() if i.root.kind == NODES_SILENT]:
            closed = self._split_silence(inc, now) or self._silence_over(inc, now)
            if closed:
                out += closed
            elif inc.untold and now - inc.told_at >= self.silence_hold_s:
                out.append(self._alert(inc, "update", now))
        return out

    def job_ended(self, job: str, at: float, how: str) -> list[Alert]:
        """The job ended (``how``: completed, cancelled, ...): its incidents resolve, its later symptoms
        from before ``at`` are its past, and what comes after is a new run's."""
        self._running.discard(job)
        self._run_began[job] = max(at, self._run_began.get(job, at))
        ids = [i.incident_id for i in self.incidents.values() if i.root.subject.job == job]
        return self.recovered(ids, job, at, f"job {job} ended: {how}")

    def job_started(self, job: str, at: float) -> None:
        """The job runs (or waits to), as of ``at``: a run begins unless one is going on already (a state
        said again is no new run). A cause on its nodes from before explains none of this run's failures."""
        if job not in self._running:
            self._running.add(job)
            self._run_began[job] = max(at, self._run_began.get(job, at))

    # -- many nodes silent together ---------------------------------------------------------------------
    def _silent_nodes(self, inc: Incident) -> dict[str, DetectorFinding]:
        return {m.subject.node: m for k, m in inc.members.items()
                if m.kind == "node_lost" and m.subject.node and k not in inc.cleared}

    def _shared_silence(self, f: DetectorFinding, now: float) -> list[Alert] | None:
        """``f`` joins (or makes) an incident of many nodes silent together, or waits a moment while other
        nodes are silent too (its detector names them: ``silent_peers``); None when it is alone."""
        t = to_seconds(f.onset_time)
        close = lambda m: abs(to_seconds(m.onset_time) - t) <= self.silence_window_s  # noqa: E731
        near = [inc for inc in self._by_age() if inc.root.kind in ("node_lost", NODES_SILENT)
                and any(close(m) for m in self._silent_nodes(inc).values())
                and not self._heard_since(inc, f.subject.node)]
        held = {k: m for k, (m, _) in self._held.items() if m.kind == "node_lost" and close(m)}
        nodes = {n for inc in near for n in self._silent_nodes(inc)} | {m.subject.node for m in held.values()} \
            | {f.subject.node}
        if len(nodes) < self.silence_group:
            peers = f.facts.silent_peers if isinstance(f.facts, SilenceEvidence) else []
            if not near and len(peers) + 1 < self.silence_group:
                return None
            # Other nodes are silent right now: hold this one back a moment, so that a shared silence
            # becomes one incident and not one page per node.
            self._held[finding_key(f)] = (f, now + self.silence_hold_s)
            return []
        for k in held:
            del self._held[k]
        held[finding_key(f)] = f
        shared = next((inc for inc in near if inc.root.kind == NODES_SILENT), None)
        if shared is None and near:
            shared = near[0]  # a lost node told at once, before the others fell silent: it becomes the shared one
        elif shared is None:
            shared = Incident(incident_id=uuid.uuid5(_INCIDENT_NS, f"silence|{finding_key(f)}"), root=f,
                              severity=2, opened_at=now)
            self.incidents[shared.incident_id] = shared
        first_version = shared.version == 0
        was_silence = shared.root.kind == NODES_SILENT
        for other in [inc for inc in near if inc is not shared]:
            shared.members.update(other.members)
            shared.cleared |= other.cleared
        shared.members.update(held)
        onset = min(to_seconds(m.onset_time) for m in self._silent_nodes(shared).values())
        shared.root = _silence_root(f, sorted(self._silent_nodes(shared)), onset)
        shared.severity = 2
        shared.summary = _summary(shared.root)
        for m in held.values():
            self._add_evidence(shared, m, now)
        merged = [self._close(o, now, f"merged into incident {shared.incident_id}", merged=True)
                  for o in near if o is not shared]
        if first_version or not was_silence:
            return [self._alert(shared, "open" if first_version else "update", now)] + merged
        # One more node of a silence already told: a thousand nodes falling silent within a second are one
        # update at the next tick that is silence_hold_s after the last one, not a thousand versions.
        shared.untold = True
        return merged

    @staticmethod
    def _heard_since(inc: Incident, node: str | None) -> bool:
        """Was ``node`` lost in ``inc`` and heard again since? Lost once more, that is a loss of its own."""
        return any(m.kind == "node_lost" and m.subject.node == node and k in inc.cleared for k, m in inc.members.items())

    def _among_many_silent(self, f: DetectorFinding) -> bool:
        """Are ``silence_group`` jobs silent with ``f``'s, counting none whose silence is told already (a job
        stopped by its crash, a hang open), while some node of ``f``'s job is quiet too (``quiet_nodes``; a hang
        on nodes that all talk is no stalled path's or partition's)?"""
        facts = f.facts if isinstance(f.facts, SilenceEvidence) else None
        if facts is not None and facts.quiet_nodes == []:
            return False  # its nodes were all heard when it was found: no silence of theirs explains it or is coming
        peers = set(facts.silent_peers) if facts is not None else set()
        if len(peers) + 1 < self.silence_group:
            return False
        peers -= {m.subject.job for inc in self.incidents.values() for m in inc.members.values()}
        return len(peers) + 1 >= self.silence_group

    def _split_silence(self, inc: Incident, now: float) -> list[Alert]:
        """Once the others are back, nodes still silent ``silence_split_s`` later are each their own incident."""
        silent = self._silent_nodes(inc)
        back = [k for k, m in inc.members.items() if m.kind == "node_lost" and k in inc.cleared]
        if not silent or not back or now - inc.last_evidence_at < self.silence_split_s:
            return []
        out = [self._close(inc, now, f"{len(back)} node(s) came back; {len(silent)} still silent, "
                                     "handled one by one")]
        for node, m in sorted(silent.items()):
            alone = Incident(incident_id=uuid.uuid5(_INCIDENT_NS, f"alone|{finding_key(m)}"), root=m,
                             severity=m.severity, opened_at=now, summary=f"{_summary(m)} (stayed silent after the "
                                                                        f"others of a shared silence came back)")
            alone.members[finding_key(m)] = m
            self._add_evidence(alone, m, now)
            self.incidents[alone.incident_id] = alone
            out.append(self._alert(alone, "open", now))
        return out

    def _silence_over(self, inc: Incident, now: float) -> list[Alert]:
        """Every node of a shared silence is back, for ``silence_hold_s`` (what they sent meanwhile is read by
        then): it resolves, and what it explained that still holds (a job still hung, a slow job) is handed
        back, to be an incident of its own or another cause's; crashes and timeouts stay its history."""
        nodes = [k for k, m in inc.members.items() if m.kind == "node_lost"]
        if not nodes or self._silent_nodes(inc) or now - inc.heard_clear_at < self.silence_hold_s:
            return []
        holding = [(k, m) for k, m in inc.members.items() if m.kind != "node_lost" and k not in inc.cleared
                   and m.kind not in TRANSIENT and self._current(m)]
        # A job that runs steps again within its own timeout of being heard: its steps may be read later
        # than its nodes' beats (another topic, a busy worker); only one still silent after that is hung.
        if any(now - inc.heard_clear_at < self.silence_hold_s + _timeout_s(m) for _, m in holding):
            return []
        out = [self._close(inc, now, f"the {len(nodes)} silent nodes came back")]
        for k, m in holding:
            out += self._place(m, k, now)
        return out

    def _all_clear(self, inc: Incident, now: float) -> bool:
        for key, m in inc.members.items():
            if key in inc.cleared:
                continue
            if m.kind in TRANSIENT and now - inc.last_evidence_at >= self.transient_hold_s:
                continue
            return False
        return True

    def _by_age(self) -> list[Incident]:
        return sorted(self.incidents.values(), key=lambda i: (i.opened_at, str(i.incident_id)))

    @staticmethod
    def _add_evidence(inc: Incident, f: DetectorFinding, now: float) -> None:
        inc.evidence_count += 1
        inc.last_evidence_at = now
        if len(inc.evidence) < MAX_EVIDENCE:
            entry = {"kind": f.kind, "subject": f.subject.model_dump(exclude_none=True),
                     "onset": f.onset_time.isoformat(), "detector": f.detector, **f.evidence}
            if f.job_nodes and f.subject.job:
                entry["job_nodes"] = list(f.job_nodes)  # where the job runs: what a node failure affects
            inc.evidence.append(entry)

    def _close(self, inc: Incident, now: float, why: str, merged: bool = False, cleared: bool = False) -> Alert:
        self.incidents.pop(inc.incident_id, None)
        inc.summary = f"{inc.summary} — resolved: {why}"
        if cleared or inc.root.kind == NODES_SILENT:
            self._cleared_incidents[inc.incident_id] = (inc, now, why)
        job = inc.root.subject.job
        if job and not merged and any(m.kind == "task_hang" for m in inc.members.values()):
            self._closed_hangs[job] = (inc, now, why)
        return self._alert(inc, "resolved", now)

    def _alert(self, inc: Incident, status: str, now: float) -> Alert:
        inc.version += 1
        inc.told_at, inc.untold = now, False
        root = inc.root
        return Alert(
            event_id=uuid.uuid5(inc.incident_id, str(inc.version)),
            event_time=from_seconds(now),
            source=Source(cluster=root.source.cluster, node=root.subject.node, job=root.subject.job),
            incident_id=inc.incident_id,
            incident_version=inc.version,
            status=status,  # type: ignore[arg-type]
            severity=inc.severity,
            kind=root.kind,
            subject=root.subject,
            onset_time=min(m.onset_time for m in inc.members.values()),
            detection_time=root.event_time,
            summary=inc.summary,
            evidence=list(inc.evidence),
            evidence_count=inc.evidence_count,
            detector=root.detector,
            detector_version=root.detector_version,
            jobs=_jobs(inc),
            slowdowns=_slowdowns(inc),
        )


def _timeout_s(f: DetectorFinding) -> float:
    """The silence a finding's detector waited (a hang's learned timeout), at most an hour; 0 if none."""
    ev = f.facts
    t = ev.timeout_s if isinstance(ev, SilenceEvidence) else None
    return min(float(t), 3600.0) if t is not None and t == t and t > 0 else 0.0


def _jobs(inc: Incident) -> dict[str, list[str]]:
    """The jobs an incident touches and the nodes each was seen on: its job findings' own
    nodes, and the jobs that ran on the node of a node finding."""
    jobs: dict[str, set[str]] = {}
    for m in (inc.root, *inc.members.values()):
        node = m.subject.node
        if m.subject.job:
            seen = jobs.setdefault(m.subject.job, set())
            seen.update(m.job_nodes)
            if node:
                seen.add(node)
        for job in m.affected_jobs:
            jobs.setdefault(job, set()).update([node] if node else [])
    return {job: sorted(nodes) for job, nodes in sorted(jobs.items())}


def _slowdowns(inc: Incident) -> list[Slowdown]:
    """The incident's fail-slows with their before and after levels, in the order they joined it; where a
    straggler of the same job was localized in the incident, its node and GPU too."""
    where = {m.subject.job: m.slowdown for m in inc.members.values()
             if m.kind == "straggler" and m.slowdown is not None and m.slowdown.node is not None}
    out = []
    for m in inc.members.values():
        s = m.slowdown
        if m.kind != "fail_slow" or s is None or not s.job or not s.before_s or not s.after_s:
            continue
        found = where.get(s.job)
        if s.node is None and found is not None:
            s = s.model_copy(update={"node": found.node, "gpu": found.gpu})
        out.append(s)
    return out
