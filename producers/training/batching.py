"""Node-local batching: the ranks of one node send records here; batches leave the node.

:class:`NodeBatcher` listens on a Unix datagram socket (``$VIGIL_HOOKS_SOCKET``;
the node agent runs one), turns the ranks' compact records into events
(:func:`~vigil.producers.training.wire.records_to_events`), groups them by event
type and key (all ranks' iteration timings of a job are one group) and
publishes each group as one Kafka message every ``max_delay_s`` or when
``max_events`` are waiting, and at once (but at most every ``min_gap_s``)
when every local rank of a job has reported a step: that step is what the
hang and fail-slow detectors wait for. Kafka sees a handful of messages per
interval per node instead of one per rank per step.

It also remembers per job the highest training step it has seen
(:meth:`NodeBatcher.highest_step`), which the local actuator's no-progress
guard reads: a job whose step no longer rises across restarts is not
making progress; and how long its steps and its checkpoints take
(:meth:`NodeBatcher.timings`), which the agent's walltime rule reads.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from vigil.producers.training.wire import decode_datagram, records_to_events
from vigil.schemas import Envelope, message_key

log = logging.getLogger(__name__)

__all__ = ["NodeBatcher", "default_hooks_socket"]


def _listening(path: Path) -> bool:
    """A socket at ``path`` that someone receives on (connecting to a stale one is refused)."""
    if not path.is_socket():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def default_hooks_socket() -> Path:
    return Path(os.environ.get("VIGIL_HOOKS_SOCKET") or "/tmp/vigil-hooks.sock")


class NodeBatcher:
    """Receive hook datagrams on ``path``; publish batched events through ``publisher``.

    ``publisher`` needs ``publish(events)`` and ``poll(timeout)`` (a
    :class:`~vigil.producers.publisher.Publisher`). Runs in a daemon thread after
    :meth:`start`; :meth:`stop` flushes what is pending.
    """

    def __init__(self, path: str | os.PathLike, publisher: Any, max_delay_s: float = 0.2,
                 max_events: int = 2000, min_gap_s: float = 0.05) -> None:
        self.path = Path(path)
        self.publisher = publisher
        self.max_delay_s = max_delay_s
        self.max_events = max_events
        #: a step every local rank of its job has reported goes out at once, but messages at most every min_gap_s
        self.min_gap_s = min_gap_s
        self._ranks: dict[str, set[int]] = {}  # job -> its ranks heard on this node
        self._step_ranks: dict[tuple[str, int], set[int]] = {}  # (job, step) -> ranks that reported it
        self._complete = False  # a step of every local rank waits
        self._last_flush = float("-inf")
        self.received = 0
        self.bad = 0
        self.published_events = 0
        self.published_messages = 0
        self._groups: dict[tuple[str, bytes], list[Envelope]] = {}
        self._steps: dict[str, int] = {}
        #: job -> recent step durations, recent checkpoint durations, (step, seconds) of the last saved checkpoint
        self._durations: dict[str, deque[float]] = {}
        self._checkpoints: dict[str, deque[float]] = {}
        self._last_checkpoint: dict[str, tuple[int, float]] = {}
        self._saved_at: dict[tuple[str, int | None], float] = {}
        self._waiting = 0
        self._oldest: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if len(os.fsencode(self.path)) >= 108:  # the kernel's sun_path limit; say which path, not "path too long"
            raise ValueError(f"hooks socket path {self.path} is too long for a Unix socket (max 107 bytes): "
                             "give a shorter --hooks-socket / VIGIL_HOOKS_SOCKET")
        if _listening(self.path):  # unlinking it would take the hooks of every job from whoever listens there
            raise ValueError(f"another process already receives the training hooks on {self.path} (a vigil agent "
                             "running as the node daemon?): one agent per node; give this one its own "
                             "--hooks-socket / VIGIL_HOOKS_SOCKET to run it beside the other")
        try:
            self.path.unlink()  # a stale socket: nobody receives on it
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        except OSError:
            pass
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o666)  # training processes may run as another user
        self._sock.settimeout(0.05)

    def start(self) -> "NodeBatcher":
        self._thread = threading.Thread(target=self._run, name="vigil-node-batcher", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step(time.monotonic())

    def step(self, now: float) -> None:
        """Receive what is waiting (up to one timeout), publish what is due."""
        try:
            data = self._sock.recv(1 << 20)
            self._ingest(data, now)
            while True:  # drain without waiting
                self._sock.setblocking(False)
                try:
                    self._ingest(self._sock.recv(1 << 20), now)
                except (BlockingIOError, InterruptedError):
                    break
                finally:
                    self._sock.settimeout(0.05)
        except socket.timeout:
            pass
        except OSError:
            if self._stop.is_set():
                return
            raise
        if self._waiting and (self._waiting >= self.max_events or (self._oldest is not None and now - self._oldest >= self.max_delay_s)
                              or (self._complete and now - self._last_flush >= self.min_gap_s)):
            self.flush(now)
        else:
            self.publisher.poll(0)

    def _ingest(self, data: bytes, now: float) -> None:
        self.received += 1
        try:
            source, records = decode_datagram(data)
            events, errors = records_to_events(source, records)
        except (ValueError, TypeError) as exc:
            self.bad += 1
            log.warning("bad hook datagram (%d bytes): %s", len(data), exc)
            return
        if errors:
            self.bad += len(errors)
            log.warning("bad hook records: %s", "; ".join(errors[:3]))
        urgent = False
        steps = self._steps
        for ev in events:
            etype = ev.event_type  # type: ignore[attr-defined]
            self._groups.setdefault((etype, message_key(ev)), []).append(ev)
            # what cannot wait: an exception (the process may be exiting), a checkpoint's start or end and a
            # clean end (a long pause on purpose must be known before it looks like a hang), a flight-recorder
            # dump (taken for a hang its restart will soon resolve: it must be heard first)
            urgent = urgent or etype in ("training_exception", "checkpoint", "process_exit", "flight_recorder_dump")
            step = getattr(ev, "step", None)
            job = ev.source.job
            if step is not None and job is not None and step > steps.get(job, -1):
                steps[job] = step
            if job is not None:
                self._learn(job, ev)
                if etype == "iteration" and ev.source.rank is not None:
                    # the step every local rank has reported is what the hang and fail-slow detectors wait for:
                    # holding it for the batching delay would be latency in each of their alerts
                    ranks = self._ranks.setdefault(job, set())
                    ranks.add(ev.source.rank)
                    done = self._step_ranks.setdefault((job, ev.step), set())  # type: ignore[attr-defined]
                    done.add(ev.source.rank)
                    self._complete = self._complete or done >= ranks
        self._waiting += len(events)
        if self._oldest is None and events:
            self._oldest = now
        if urgent:  # the process may be exiting: no batching delay
            self.flush(now)

    def _learn(self, job: str, ev: Envelope) -> None:
        etype = ev.event_type  # type: ignore[attr-defined]
        if etype == "iteration":
            self._durations.setdefault(job, deque(maxlen=100)).append(ev.duration_s)  # type: ignore[attr-defined]
        elif etype == "checkpoint" and ev.phase == "completed" and ev.duration_s is not None:  # type: ignore[attr-defined]
            self._checkpoints.setdefault(job, deque(maxlen=8)).append(ev.duration_s)  # type: ignore[attr-defined]
            self._last_checkpoint[job] = (ev.step, ev.duration_s)  # type: ignore[attr-defined]
            self._saved_at[(job, ev.source.rank)] = ev.event_time.timestamp()

    def highest_step(self, job: str) -> int | None:
        """The highest training step seen from ``job``'s ranks on this node (None: none seen yet)."""
        return self._steps.get(job)

    def saved_since(self, job: str, t: float, ranks: list[int]) -> bool:
        """Did every one of ``ranks`` of ``job`` complete a checkpoint at or after ``t`` (seconds since the epoch)?"""
        return bool(ranks) and all(self._saved_at.get((job, r), float("-inf")) >= t for r in ranks)

    def timings(self, job: str) -> tuple[float | None, float | None, tuple[int, float] | None]:
        """``(longest recent step s, longest recent checkpoint s, (step, s) of the last saved checkpoint)``."""
        steps, ckpts = self._durations.get(job), self._checkpoints.get(job)
        return (max(steps) if steps else None, max(ckpts) if ckpts else None, self._last_checkpoint.get(job))

    def flush(self, now: float | None = None) -> None:
        groups, self._groups = self._groups, {}
        self._waiting = 0
        self._oldest = None
        # steps sent whole are done with; a step part of whose ranks went out is still counted to its end
        ranks = self._ranks
        self._step_ranks = {k: got for k, got in self._step_ranks.items() if not got >= ranks[k[0]]} \
            if len(self._step_ranks) < 10_000 else {}
        self._complete = False
        self._last_flush = time.monotonic() if now is None else now
        for group in groups.values():
            self.publisher.publish(group)
            self.published_events += len(group)
            self.published_messages += 1
        self.publisher.poll(0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        # Whatever arrived before the stop is still published.
        try:
            self._sock.setblocking(False)
            while True:
                self._ingest(self._sock.recv(1 << 20), time.monotonic())
        except (BlockingIOError, InterruptedError, OSError):
            pass
        self.flush()
        self._sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
