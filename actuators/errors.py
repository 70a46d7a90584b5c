"""The one root exception of the actuators and its subclasses (CONVENTIONS §7).

Each subclass carries what it is about (the field, the states, the decision),
and its message names what failed, where, and what was expected.
"""

from __future__ import annotations

__all__ = ["ActuatorError", "InvalidTransition", "LedgerError", "PlanError"]


class ActuatorError(Exception):
    """Root of every error raised by :mod:`actuators`."""


class PlanError(ActuatorError, ValueError):
    """A decision's target or plan is malformed for its action; ``field`` names the offending field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidTransition(ActuatorError):
    """An action was asked to move between states the transition table does not allow."""

    def __init__(self, from_state: object, to_state: object, decision_id: object) -> None:
        self.from_state = from_state
        self.to_state = to_state
        self.decision_id = decision_id
        allowed = _allowed(from_state)
        super().__init__(
            f"decision {decision_id}: invalid transition {_name(from_state)} -> {_name(to_state)}; "
            f"from {_name(from_state)} only {allowed} are allowed"
        )


class LedgerError(ActuatorError):
    """The ledger cannot be opened or used (in use by another actuator, bad file...)."""


def _name(state: object) -> str:
    return str(getattr(state, "value", state))


def _allowed(state: object) -> str:
    from vigil.actuators.state import TRANSITIONS, ActionState

    try:
        targets = TRANSITIONS[ActionState(_name(state))]
    except (ValueError, KeyError):
        return "[] (unknown state)"
    return "[" + ", ".join(t.value for t in sorted(targets, key=lambda s: s.value)) + "]" if targets else "none (terminal)"


class ActionCancelled(ActuatorError):
    """The action was stopped before it finished because its actuator is stopping (a ``cancelled`` result)."""
