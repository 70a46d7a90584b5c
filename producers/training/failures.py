"""What a rank says when it fails or hangs: classified exceptions, and the flight recorder's dump.

:class:`FailureHooks` is a part of
:class:`~vigil.producers.training.monitor.TrainingMonitor`: uncaught
exceptions of every thread are classified and sent before the process
exits; the hang watchdog dumps torch's flight recorder
(:mod:`vigil.producers.training.flight_recorder`) once when a step stays
open too long.
"""

from __future__ import annotations

import statistics
import sys
import threading
import traceback as tb_mod
from typing import Any

from vigil.producers.training.exceptions import classify_exception
from vigil.producers.training.wire import MAX_DATAGRAM, encode_datagram

__all__ = ["FailureHooks"]


class FailureHooks:
    """The monitor's exception hooks and hang watchdog (see the module docstring)."""

    def report_exception(self, exc: BaseException, thread: str | None = None) -> None:
        """Classify and send an exception now (once per exception object)."""
        if getattr(exc, "_vigil_reported", False):
            return
        try:
            exc._vigil_reported = True  # type: ignore[attr-defined]
        except AttributeError:
            pass
        text = "".join(tb_mod.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
        rec = ["ex", classify_exception(exc), type(exc).__name__, str(exc)[:4000], text,
               thread or threading.current_thread().name, self._clock()]
        with self._lock:
            self._buf.append(rec)
        self.flush(urgent=True)

    def install_exception_hooks(self) -> None:
        """Publish uncaught exceptions of the main thread and of other threads before the process exits."""
        if self._prev_excepthook is not None:
            return
        self._prev_excepthook = sys.excepthook
        self._prev_threading_hook = threading.excepthook

        def excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
            if not issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
                try:
                    self.report_exception(exc, thread="MainThread")
                except Exception:  # reporting must never mask the original failure
                    pass
            self._prev_excepthook(exc_type, exc, tb)

        def thread_hook(args: Any) -> None:
            if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
                try:
                    self.report_exception(args.exc_value, thread=getattr(args.thread, "name", None))
                except Exception:
                    pass
            self._prev_threading_hook(args)

        sys.excepthook = excepthook
        threading.excepthook = thread_hook

    def uninstall_exception_hooks(self) -> None:
        if self._prev_excepthook is not None:
            sys.excepthook = self._prev_excepthook
            threading.excepthook = self._prev_threading_hook
            self._prev_excepthook = self._prev_threading_hook = None

    def dump_flight_recorder(self, trigger: str = "on_demand") -> dict[str, Any]:
        """Take this rank's flight-recorder dump now and send it (urgent); returns the payload sent.

        Safe from another thread while the training thread is blocked in a
        collective. Where torch has no recorder (or its buffer size is 0) the
        payload says so (``available`` false, ``unavailable_reason``).
        """
        from vigil.producers.training.flight_recorder import collect_dump, fit_payload

        payload = collect_dump(self._dist, trigger=trigger)
        payload = fit_payload(payload, lambda p: len(encode_datagram(self.source, [["fr", 0.0, p]])) <= MAX_DATAGRAM)
        with self._lock:
            self._buf.append(["fr", self._clock(), payload])
        self.flush(urgent=True)
        self.dumps_sent += 1
        return payload

    def start_hang_watchdog(self, factor: float = 3.0, min_timeout_s: float = 30.0, poll_s: float = 1.0,
                            warmup_steps: int = 3) -> threading.Thread:
        """Dump the flight recorder once when a step stays open longer than ``factor`` x the median step time.

        The timeout is never below ``min_timeout_s``; nothing fires before
        ``warmup_steps`` steps have closed. The thread wakes every ``poll_s``
        seconds (the only work it does then is a comparison).
        """
        if factor <= 1 or min_timeout_s < 0 or poll_s <= 0 or warmup_steps < 1:
            raise ValueError("factor must be > 1, min_timeout_s >= 0, poll_s > 0, warmup_steps >= 1")
        if self._watchdog is not None:
            return self._watchdog
        mon = self

        def run() -> None:
            dumped_for: float | None = None
            while not mon._watchdog_stop.wait(poll_s):
                opened = mon._step_open_at
                if opened is None or len(mon._durations) < warmup_steps or opened == dumped_for:
                    continue
                timeout = max(min_timeout_s, factor * statistics.median(list(mon._durations)))
                if mon._clock() - opened > timeout:
                    dumped_for = opened
                    try:
                        mon.dump_flight_recorder("hang")
                    except Exception:  # the watchdog must not die with the dump
                        pass

        self._watchdog_stop.clear()
        self._watchdog = threading.Thread(target=run, name="vigil-hang-watchdog", daemon=True)
        self._watchdog.start()
        return self._watchdog

    def stop_hang_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog_stop.set()
            self._watchdog.join(timeout=5.0)
            self._watchdog = None
