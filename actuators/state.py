"""The state machine of one action (CONVENTIONS §9, after NVRx's rank-monitor state machine).

::

    pending --> running --> succeeded
       |           |------> failed
       |           |------> timed_out
       |           '------> cancelled  (the actuator stopped before it finished: no verdict)
       '------> failed            (refused before anything ran)

``pending``: the decision is recorded in the ledger, nothing has run.
``running``: the backend was asked to act; its effect may be partial until
a final state is recorded. ``succeeded``, ``failed``, ``timed_out`` and
``cancelled`` are terminal; ``cancelled`` says nothing about the remedy (the
job is being stopped), so nothing escalates on it. Every other move raises :class:`~vigil.actuators.errors.InvalidTransition`.
"""

from __future__ import annotations

from enum import Enum

from vigil.actuators.errors import InvalidTransition

__all__ = ["ActionState", "TERMINAL", "TRANSITIONS", "check_transition"]


class ActionState(str, Enum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    timed_out = "timed_out"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


#: From each state, the states it may move to.
TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.pending: frozenset({ActionState.running, ActionState.failed}),
    ActionState.running: frozenset({ActionState.succeeded, ActionState.failed, ActionState.timed_out,
                                    ActionState.cancelled}),
    ActionState.succeeded: frozenset(),
    ActionState.failed: frozenset(),
    ActionState.timed_out: frozenset(),
    ActionState.cancelled: frozenset(),
}

TERMINAL = frozenset({ActionState.succeeded, ActionState.failed, ActionState.timed_out, ActionState.cancelled})


def check_transition(from_state: ActionState | str, to_state: ActionState | str, decision_id: object) -> ActionState:
    """Return ``to_state`` as an :class:`ActionState` if the move is allowed, else raise ``InvalidTransition``."""
    try:
        src, dst = ActionState(from_state), ActionState(to_state)
    except ValueError:
        raise InvalidTransition(from_state, to_state, decision_id) from None
    if dst not in TRANSITIONS[src]:
        raise InvalidTransition(src, dst, decision_id)
    return dst
