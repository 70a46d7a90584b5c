"""Secrets stay secret: redaction of everything vigil prints or logs, and private state files.

* :func:`redact_dsn` takes the password out of a DSN (``user:pass@`` and
  ``?password=``) wherever one is shown or written down;
* :class:`Redactor` replaces every known secret value (the ClickHouse
  password, the SASL password, the decision keys, the query token) and any
  URL's password in a text; :func:`redact_process_output` wraps the process's
  stdout and stderr with it, so banners, logs, errors and tracebacks of every
  ``vigil`` command are covered, whoever prints them (rich, logging, click,
  a library);
* :func:`write_private` writes a state file readable by its owner only
  (0600, atomically); :func:`private_dir` makes a 0700 directory.
"""

from __future__ import annotations

import io
import os
import secrets as _secrets
import sys
from pathlib import Path

from vigil.streams.redact import MASK, Redactor, dsn_secrets, redact_dsn

__all__ = ["MASK", "Redactor", "dsn_secrets", "private_dir", "private_tree", "redact_dsn", "redact_process_output",
           "token", "write_private"]

class _RedactingStream(io.TextIOBase):
    """A text stream that redacts what is written to it, then writes it to ``inner``."""

    def __init__(self, inner: io.TextIOBase, redact: Redactor) -> None:
        self._inner = inner
        self._redact = redact

    def write(self, text: str) -> int:  # type: ignore[override]
        self._inner.write(self._redact(text))
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._inner, "encoding", "utf-8")

    def __getattr__(self, name: str):  # errors, buffer, line_buffering...
        return getattr(self._inner, name)


def redact_process_output(redact: Redactor) -> None:
    """Route this process's stdout and stderr through ``redact`` (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _RedactingStream):
            stream._redact = redact
        elif stream is not None:
            setattr(sys, name, _RedactingStream(stream, redact))


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (created 0700; an existing one is tightened)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def private_tree(path: Path) -> int:
    """Take group and other permissions off ``path`` and everything under it that this user owns
    (a history made by an older vigil, or by another tool): directories 0700, files 0600 (0700 if
    executable). Returns how many it changed."""
    changed = 0
    if not path.exists():
        return 0
    uid = os.getuid()
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, f) for f in files)]:
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue
            if st.st_uid != uid or (st.st_mode & 0o077) == 0 or os.path.islink(name):
                continue
            os.chmod(name, st.st_mode & 0o700)
            changed += 1
    return changed


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (0600, atomically: a reader sees the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def token() -> str:
    """A new random secret: 256 bits, URL-safe."""
    return _secrets.token_urlsafe(32)
