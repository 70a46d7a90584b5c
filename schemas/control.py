"""The control-socket protocol between a node's actuator and its training processes.

One Unix datagram socket per training process, at
``<control dir>/<job>.rank<rank>.sock`` (:func:`control_path`; the control
directory is ``$VIGIL_CONTROL_DIR``, default ``/tmp/vigil-control``). A command
is one JSON datagram::

    {"command": "retry_step" | "checkpoint" | "save_and_exit" | "dump_flight_recorder", "id": "<request id>"}

and, when the sender bound an address, the process answers on it with
``{"id": .., "ok": true}`` (or ``"ok": false, "error": ..``) once the command
is queued. The first three wait for the training loop's next step boundary;
``dump_flight_recorder`` is served at once by the listening thread (a hung
rank never reaches a step boundary) and answered once the dump has left the
process (``"detail"`` says what it held). The training side listens with
:class:`vigil.producers.training.ControlChannel`; the actuator's local backend
sends with :func:`send_command`. Both import this module, the lowest layer
they share.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from enum import Enum
from pathlib import Path

__all__ = ["Command", "ControlError", "DIAGNOSTICS", "IMMEDIATE", "control_path", "send_command"]


class Command(str, Enum):
    retry_step = "retry_step"
    checkpoint = "checkpoint"
    save_and_exit = "save_and_exit"
    dump_flight_recorder = "dump_flight_recorder"


#: Commands served by the listening thread as they arrive, never queued for a step boundary.
IMMEDIATE = frozenset({Command.dump_flight_recorder})
#: What a restart decision's ``plan["collect_diagnostics"]`` may ask the actuator to collect from the
#: job's ranks before it stops them (the decision engine decides it, the local backend does it).
DIAGNOSTICS = frozenset({"flight_recorder"})


class ControlError(RuntimeError):
    """A command could not be delivered or was refused (the message says which and why)."""


def control_path(job: str, rank: int, directory: str | os.PathLike | None = None) -> Path:
    base = Path(directory or os.environ.get("VIGIL_CONTROL_DIR") or "/tmp/vigil-control")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)
    return base / f"{safe}.rank{rank}.sock"


def send_command(path: str | os.PathLike, command: str | Command, timeout_s: float = 5.0) -> dict:
    """Send one command and wait for the process to confirm it is queued."""
    cmd = Command(command).value
    request_id = uuid.uuid4().hex
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(f"\0vigil-ctl-{request_id}")  # abstract address: nothing to clean up
        sock.settimeout(timeout_s)
        try:
            sock.sendto(json.dumps({"command": cmd, "id": request_id}).encode(), str(path))
        except OSError as exc:
            raise ControlError(f"no training process listens on {path}: {exc.strerror}") from exc
        try:
            data = sock.recv(4096)
        except socket.timeout:
            raise ControlError(f"no answer from {path} within {timeout_s} s") from None
        reply = json.loads(data)
        if not reply.get("ok"):
            raise ControlError(f"{path} refused {cmd}: {reply.get('error')}")
        return reply
    finally:
        sock.close()
