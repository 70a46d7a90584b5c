"""Checkpoints the training loop saves without marking them: ``torch.save`` and ``torch.distributed.checkpoint``.

A save the hang detector does not know of is a long silence between two
steps: every periodic checkpoint would page as a hang. Users call
``torch.save(state, path)`` or ``dcp.save(state_dict, ...)`` in their loop
without ``mon.checkpoint()``, so :meth:`SaveHooks.instrument_saves` (called
by :meth:`~vigil.producers.training.monitor.TrainingMonitor.instrument_collectives`
unless ``saves=False``) wraps ``torch.save`` and
``torch.distributed.checkpoint.save`` / ``async_save`` while the monitor is
installed: a call made by the training loop's thread is marked as a
checkpoint of the last step begun (for ``async_save``, its blocking part).

Not marked: a save inside one already marked (``mon.checkpoint()`` around
``torch.save``, the ``torch.save`` calls DCP makes itself), a save made by
another thread (DCP's background writers: the loop goes on meanwhile), and a
name bound before the wrapping (``from torch import save`` at import time).
``torch.distributed.checkpoint`` is wrapped when it is imported (at
instrumenting, or at the first step after the training script imported it):
importing it costs seconds, never paid for a script that does not use it.

:class:`SaveHooks` is a part of
:class:`~vigil.producers.training.monitor.TrainingMonitor` (its state lives there).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from vigil.producers.training.monitor import TrainingMonitor

__all__ = ["SaveHooks", "DCP_FUNCTIONS"]

#: The functions of ``torch.distributed.checkpoint`` that block the loop while they save.
DCP_FUNCTIONS = ("save", "async_save")
_DCP = "torch.distributed.checkpoint"


class SaveHooks:
    """Mark the training loop's unmarked saves as checkpoints (see the module docstring)."""

    _save_wrapped: list[tuple[Any, str, Callable, Callable]]
    _saves_wanted: bool
    _dcp_wrapped: bool
    _saving: int
    _loop_thread: int | None
    _last_step: int | None
    _lock: threading.Lock

    def instrument_saves(self: "TrainingMonitor", torch: Any = None, dcp: Any = None) -> None:  # type: ignore[misc]
        """Wrap ``torch.save`` (and DCP's ``save``/``async_save`` once imported); idempotent.

        ``torch``/``dcp``: the modules to wrap (tests pass their own); default the imported ones.
        """
        if self._saves_wanted:
            return
        self._saves_wanted = True
        if torch is None:
            torch = sys.modules.get("torch")
        if torch is not None and callable(getattr(torch, "save", None)):
            self._wrap_save(torch, "save")
        self._wrap_dcp(dcp)

    def uninstrument_saves(self: "TrainingMonitor") -> None:  # type: ignore[misc]
        """Put back what :meth:`instrument_saves` wrapped (where nothing wrapped it again since)."""
        for owner, name, original, wrapper in self._save_wrapped:
            if getattr(owner, name, None) is wrapper:
                setattr(owner, name, original)
        self._save_wrapped = []
        self._saves_wanted = False
        self._dcp_wrapped = False

    def _wrap_dcp(self: "TrainingMonitor", dcp: Any = None) -> None:  # type: ignore[misc]
        """DCP's functions, if its module is imported (else at a later step: see :meth:`_maybe_wrap_dcp`)."""
        dcp = dcp if dcp is not None else sys.modules.get(_DCP)
        if dcp is None:
            return
        self._dcp_wrapped = True
        for name in DCP_FUNCTIONS:
            if callable(getattr(dcp, name, None)):
                self._wrap_save(dcp, name)

    def _maybe_wrap_dcp(self: "TrainingMonitor") -> None:  # type: ignore[misc]
        """Called at each step until DCP is wrapped: one dict lookup."""
        if _DCP in sys.modules:
            self._wrap_dcp()

    def _wrap_save(self: "TrainingMonitor", owner: Any, name: str) -> None:  # type: ignore[misc]
        original = getattr(owner, name)
        mon = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            loop = mon._loop_thread
            if mon._saving or (loop is not None and threading.get_ident() != loop):
                return original(*args, **kwargs)
            with mon.checkpoint(mon._last_step if mon._last_step is not None else 0):
                return original(*args, **kwargs)

        wrapper.__vigil_wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)
        self._save_wrapped.append((owner, name, original, wrapper))
