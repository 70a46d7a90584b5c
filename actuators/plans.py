"""A decision's target and plan, validated into an :class:`Action` the backends can trust.

The plan contract per action (what the decision engine emits)::

    retry_in_place          target.job   plan {"ranks": [global ranks]}      (empty/missing: every rank)
    restart_process         target.job   plan {"nodes": [...], "collect_diagnostics": [...]}  (nodes missing: all)
    checkpoint_restart      target.job   plan {"nodes": [...], "collect_diagnostics": [...]}  (checkpoint, restart)
    isolate_node            target.node  plan {"reason": str}
    reconfigure             target.job   plan {"exclude_nodes": [...], "workers": int, "placement": {...}}
    rebalance_microbatches  target.job   plan {"microbatches": [ints >= 1]}
    adjust_topology         target.job   plan {"swaps": [[node_a, node_b], ...]}
    replan                  -            plan {"allocations": {job: [nodes]}, "workers": {job: nodes}}
    notify_human, none      -            (no machine action)

``collect_diagnostics`` names what to take from the job's ranks before they
are stopped (:data:`~vigil.schemas.control.DIAGNOSTICS`: ``flight_recorder``,
for a hang); a backend that cannot collect ignores it, and names it does not
know are ignored and listed (a diagnosis must never stand in a restart's way).

``replan`` re-plans every job at once (Unicron): each job named gets those
nodes (``allocations``) or that many (``workers``, placed by the backend);
only a backend that manages the whole cluster's jobs can carry it out.

Any plan may carry ``progress_step`` (the job's training step when the
decision was made; the no-progress guard uses it). Keys a plan does not know
are not an error (the engine may carry its own bookkeeping) but are listed in
:attr:`Action.ignored_keys`, so what was ignored is said.

Names (jobs, nodes) must match :data:`NAME_RE` in full (``fullmatch``: a
trailing newline is not a name) so that they can be argv elements of
scheduler commands: no leading ``-`` (no option injection), no spaces,
quotes, ``$``, ``;`` or control characters. A name may not stand for a set
of nodes: ``ALL`` (Slurm's every node), host ranges and lists
(``node[1-64]``, ``a,b``) and globs are refused, so the blast-radius breaker
counts every node an action takes out (an operator's inventory may list
ranges: they are expanded, node by node). Reason text is free but
goes through :func:`clean_reason` (control characters out, length capped)
and is always passed as one argv element, never through a shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from vigil.actuators.errors import PlanError
from vigil.schemas import Decision
from vigil.schemas.control import DIAGNOSTICS

__all__ = [
    "Action", "JOB_ACTIONS", "NAME_RE", "NO_MACHINE_ACTIONS", "RESERVED_NAMES", "RESTART_ACTIONS", "check_name",
    "clean_reason", "parse_action",
]

#: What a job or node name may look like (a DNS name, a Slurm job id, a k8s object name...);
#: always matched with ``fullmatch``.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")
#: Names that stand for every node to a scheduler (``scontrol update nodename=ALL``), case-insensitive.
RESERVED_NAMES = frozenset({"all"})
_SET_SYNTAX = re.compile(r"[\[\],*?{}]")

#: Actions with no machine effect: the executor answers them itself.
NO_MACHINE_ACTIONS = frozenset({"notify_human", "none"})
#: Actions that act on a job (target.job required).
JOB_ACTIONS = frozenset({"retry_in_place", "restart_process", "checkpoint_restart", "reconfigure",
                         "rebalance_microbatches", "adjust_topology"})
#: Actions that restart a job's processes (the no-progress guard counts them).
RESTART_ACTIONS = frozenset({"restart_process", "checkpoint_restart", "reconfigure"})

_PLAN_KEYS: dict[str, frozenset[str]] = {
    "retry_in_place": frozenset({"ranks"}),
    "restart_process": frozenset({"nodes", "collect_diagnostics"}),
    "checkpoint_restart": frozenset({"nodes", "collect_diagnostics"}),
    "isolate_node": frozenset({"reason"}),
    "reconfigure": frozenset({"exclude_nodes", "workers", "placement"}),
    "rebalance_microbatches": frozenset({"microbatches"}),
    "adjust_topology": frozenset({"swaps"}),
    "replan": frozenset({"allocations", "workers", "objective", "trigger"}),
    "notify_human": frozenset(),
    "none": frozenset(),
}
_COMMON_KEYS = frozenset({"progress_step"})

REASON_MAX = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


def check_name(value: object, field: str) -> str:
    """``value`` if it is a valid job/node name, else :class:`PlanError` naming ``field``."""
    if not isinstance(value, str):
        raise PlanError(f"{field}: expected a name (string), got {type(value).__name__}", field)
    if value.lower() in RESERVED_NAMES or _SET_SYNTAX.search(value):
        raise PlanError(f"{field}: {value[:80]!r} names a set of nodes (ALL, a range or a list), not one; vigil acts "
                        "on single nodes, so that the blast-radius breaker counts each", field)
    if not NAME_RE.fullmatch(value):
        raise PlanError(f"{field}: {value[:80]!r} is not a valid name (expected {NAME_RE.pattern})", field)
    return value


def clean_reason(text: object, limit: int = REASON_MAX) -> str:
    """Reason text safe to pass as one argv element: control characters become spaces, capped at ``limit``."""
    cleaned = " ".join(_CONTROL.sub(" ", str(text)).split())
    return cleaned[:limit]


def _int(value: object, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{field}: expected an integer >= {minimum}, got {value!r:.80}", field)
    if value < minimum:
        raise PlanError(f"{field}: expected an integer >= {minimum}, got {value}", field)
    return value


def _list(plan: dict[str, Any], key: str) -> list[Any]:
    value = plan.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PlanError(f"plan.{key}: expected a list, got {type(value).__name__}", f"plan.{key}")
    return value


def _names(plan: dict[str, Any], key: str) -> tuple[str, ...]:
    out = tuple(check_name(v, f"plan.{key}[{i}]") for i, v in enumerate(_list(plan, key)))
    if len(set(out)) != len(out):
        raise PlanError(f"plan.{key}: a node is named twice in {list(out)}", f"plan.{key}")
    return out


@dataclass(frozen=True)
class Action:
    """A validated decision: what to do, to what, with which parameters."""

    decision: Decision
    action: str
    job: str | None = None
    node: str | None = None
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    workers: int | None = None
    placement: dict[str, Any] | None = None
    microbatches: tuple[int, ...] = ()
    swaps: tuple[tuple[str, str], ...] = ()
    #: replan: job -> its nodes, and job -> how many nodes
    allocations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    workers_by_job: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    progress_step: int | None = None
    #: what to collect from the job's ranks before stopping them (known names only)
    diagnostics: tuple[str, ...] = ()
    ignored_keys: tuple[str, ...] = field(default=())

    @property
    def decision_id(self) -> str:
        return str(self.decision.decision_id)

    @property
    def drains(self) -> tuple[str, ...]:
        """Nodes this action takes out of service (what the blast-radius breaker counts)."""
        if self.action == "isolate_node" and self.node is not None:
            return (self.node,)
        if self.action == "reconfigure":
            return self.exclude_nodes
        return ()

    @property
    def named_nodes(self) -> tuple[str, ...]:
        """Every node the action names (each must be a known node)."""
        out: list[str] = [self.node] if self.node is not None else []
        out += list(self.nodes) + list(self.exclude_nodes)
        for nodes in self.allocations.values():
            out += list(nodes)
        for a, b in self.swaps:
            out += [a, b]
        return tuple(dict.fromkeys(out))


def parse_action(decision: Decision) -> Action:
    """Validate ``decision``'s target and plan for its action; :class:`PlanError` says what is wrong."""
    act = decision.action
    plan = decision.plan
    target = decision.target
    job = check_name(target.job, "target.job") if target.job is not None else None
    node = check_name(target.node, "target.node") if target.node is not None else None
    if act in JOB_ACTIONS and job is None:
        raise PlanError(f"{act} needs target.job (the job to act on); the decision names none", "target.job")
    if act == "isolate_node" and node is None:
        raise PlanError("isolate_node needs target.node (the node to isolate); the decision names none", "target.node")
    known = _PLAN_KEYS[act] | _COMMON_KEYS
    ignored = tuple(sorted(k for k in plan if k not in known))
    progress = plan.get("progress_step")
    kw: dict[str, Any] = dict(
        decision=decision, action=act, job=job, node=node, ignored_keys=ignored,
        progress_step=None if progress is None else _int(progress, "plan.progress_step", 0),
        reason=clean_reason(decision.reason),
    )
    if act == "retry_in_place":
        ranks = tuple(_int(r, f"plan.ranks[{i}]", 0) for i, r in enumerate(_list(plan, "ranks")))
        if len(set(ranks)) != len(ranks):
            raise PlanError(f"plan.ranks: a rank is named twice in {list(ranks)}", "plan.ranks")
        kw["ranks"] = ranks
    elif act in ("restart_process", "checkpoint_restart"):
        kw["nodes"] = _names(plan, "nodes")
        asked = plan.get("collect_diagnostics")
        asked = asked if isinstance(asked, list) else [] if asked is None else [asked]
        kw["diagnostics"] = tuple(dict.fromkeys(d for d in asked if isinstance(d, str) and d in DIAGNOSTICS))
        unknown = [d for d in asked if not (isinstance(d, str) and d in DIAGNOSTICS)]
        if unknown:
            ignored += (f"collect_diagnostics{unknown!r:.80}",)
            kw["ignored_keys"] = ignored
    elif act == "isolate_node":
        reason = plan.get("reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise PlanError(f"plan.reason: expected a string, got {type(reason).__name__}", "plan.reason")
            kw["reason"] = clean_reason(reason)
    elif act == "reconfigure":
        kw["exclude_nodes"] = _names(plan, "exclude_nodes")
        if plan.get("workers") is not None:
            kw["workers"] = _int(plan["workers"], "plan.workers", 1)
        placement = plan.get("placement")
        if placement is not None:
            if not isinstance(placement, dict):
                raise PlanError(f"plan.placement: expected an object, got {type(placement).__name__}", "plan.placement")
            kw["placement"] = placement
    elif act == "rebalance_microbatches":
        mbs = _list(plan, "microbatches")
        if not mbs:
            raise PlanError("plan.microbatches: expected a non-empty list of integers >= 1", "plan.microbatches")
        kw["microbatches"] = tuple(_int(m, f"plan.microbatches[{i}]", 1) for i, m in enumerate(mbs))
    elif act == "adjust_topology":
        swaps = _list(plan, "swaps")
        if not swaps:
            raise PlanError("plan.swaps: expected a non-empty list of [node_a, node_b] pairs", "plan.swaps")
        pairs = []
        for i, pair in enumerate(swaps):
            if not isinstance(pair, list) or len(pair) != 2:
                raise PlanError(f"plan.swaps[{i}]: expected a pair [node_a, node_b], got {pair!r:.80}", f"plan.swaps[{i}]")
            a, b = (check_name(n, f"plan.swaps[{i}][{j}]") for j, n in enumerate(pair))
            if a == b:
                raise PlanError(f"plan.swaps[{i}]: swapping {a!r} with itself", f"plan.swaps[{i}]")
            pairs.append((a, b))
        kw["swaps"] = tuple(pairs)
    elif act == "replan":
        kw["allocations"] = {check_name(j, "plan.allocations"): _names({"nodes": ns}, "nodes")
                             for j, ns in _dict(plan, "allocations").items()}
        kw["workers_by_job"] = {check_name(j, "plan.workers"): _int(w, f"plan.workers.{j}", 0)
                                for j, w in _dict(plan, "workers").items()}
        if not kw["allocations"] and not kw["workers_by_job"]:
            raise PlanError("replan needs plan.allocations or plan.workers (what each job gets)", "plan")
    return Action(**kw)


def _dict(plan: dict[str, Any], key: str) -> dict[str, Any]:
    value = plan.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlanError(f"plan.{key}: expected an object, got {type(value).__name__}", f"plan.{key}")
    return value
