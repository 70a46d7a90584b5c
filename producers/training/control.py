"""The control channel of a training process: retry the step, checkpoint now, save and exit.

The protocol (socket path, datagrams, :func:`send_command`) is
:mod:`vigil.schemas.control`, shared with the actuator. Why this transport:
it is local to the node (where the agent that acts runs), needs no port
allocation, survives any number of restarts (the socket file is replaced on
bind), costs nothing while idle, and a datagram is one whole command (no
framing). Permissions are the socket file's
(0600 by default: the training user and root).

The listening thread only queues commands; the training loop applies them at
step boundaries (:class:`vigil.producers.training.TrainingMonitor`), where a
checkpoint is consistent. The exception is what must work while the loop is
stuck (:data:`~vigil.schemas.control.IMMEDIATE`: a flight-recorder dump of a
hung rank): a handler given for it runs at once on a thread of its own, and
the sender hears back when it has finished.

``python -m vigil.producers.training.control PATH COMMAND`` sends a command by hand.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping

from vigil.schemas.control import IMMEDIATE, Command, ControlError, control_path, send_command

__all__ = ["Command", "ControlChannel", "ControlError", "control_path", "send_command"]


class ControlChannel:
    """Listens on ``path`` in a daemon thread and queues the commands it receives.

    ``handlers``: command -> callable run at once (on a thread of its own, not
    queued) for the commands of :data:`~vigil.schemas.control.IMMEDIATE`; the
    reply waits for it and carries what it returned as ``detail``. Such a
    command without a handler is refused.
    """

    def __init__(self, path: str | os.PathLike, mode: int = 0o600,
                 handlers: Mapping[Command, Callable[[], str]] | None = None) -> None:
        self.handlers = dict(handlers or {})
        unknown = set(self.handlers) - IMMEDIATE
        if unknown:
            raise ValueError(f"only {sorted(c.value for c in IMMEDIATE)} are served at once, not {sorted(unknown)}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if len(os.fsencode(self.path)) >= 108:
            raise ControlError(f"control socket path {self.path} is too long for a Unix socket (max 107 bytes)")
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(0.2)  # here, not in the thread: a channel closed at once must not race it
        os.chmod(self.path, mode)
        self._queue: queue.Queue[tuple[Command, str]] = queue.Queue()
        self._stop = threading.Event()
        self._serving = threading.Lock()  # one handler at a time: requests that pile up wait their turn
        self._thread = threading.Thread(target=self._run, name=f"vigil-control:{self.path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self._sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            reply: dict = {}
            accepted: tuple[Command, str] | None = None
            try:
                msg = json.loads(data)
                reply["id"] = msg.get("id")
                accepted = (Command(msg["command"]), str(msg.get("id") or ""))
                reply["ok"] = True
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                reply.update(ok=False, error=f"expected {{\"command\": one of {[c.value for c in Command]}}}: {exc}")
            if accepted is not None and accepted[0] in IMMEDIATE:
                self._serve(accepted[0], reply, addr)
                continue
            # Answer before queuing: once queued, the training loop may apply the
            # command and close this channel, and the sender would never hear back.
            if addr:
                try:
                    self._sock.sendto(json.dumps(reply).encode(), addr)
                except OSError:
                    pass
            if accepted is not None:
                self._queue.put(accepted)

    def _serve(self, cmd: Command, reply: dict, addr: str | None) -> None:
        """Run an immediate command's handler on its own thread (it may block: the listener must not)."""
        handler = self.handlers.get(cmd)

        def run() -> None:
            if handler is None:
                reply.update(ok=False, error=f"{cmd.value} is not served by this process")
            else:
                try:
                    with self._serving:
                        reply["detail"] = str(handler())[:2000]
                except Exception as exc:  # the caller hears why; the training process goes on
                    reply.update(ok=False, error=f"{cmd.value} failed: {type(exc).__name__}: {exc}"[:2000])
            if addr:
                try:
                    self._sock.sendto(json.dumps(reply).encode(), addr)
                except OSError:
                    pass

        threading.Thread(target=run, name=f"vigil-control-{cmd.value}", daemon=True).start()

    def poll(self) -> list[Command]:
        """Commands received since the last call, in arrival order."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait()[0])
            except queue.Empty:
                return out

    def wait(self, timeout_s: float) -> Command | None:
        """The next command, waiting up to ``timeout_s``."""
        try:
            return self._queue.get(timeout=timeout_s)[0]
        except queue.Empty:
            return None

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=1.0)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


if __name__ == "__main__":  # pragma: no cover - a tool for humans
    if len(sys.argv) != 3:
        print("usage: python -m vigil.producers.training.control SOCKET_PATH retry_step|checkpoint|save_and_exit|dump_flight_recorder", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(send_command(sys.argv[1], sys.argv[2])))
