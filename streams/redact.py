"""Redaction of secrets in text: DSN passwords, known secret values, URL passwords.

The pure part of :mod:`vigil.secrets` (which adds the process's output and
private files), here so that the stream adapters (the history store's error
messages) can use it too.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

__all__ = ["MASK", "Redactor", "dsn_secrets", "redact_dsn"]

MASK = "***"
#: ``scheme://user:password@`` anywhere in a text.
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<pw>[^\s@/]+)(?P<at>@)")
#: ``password=...`` / ``token=...`` in a query string or a ``key=value`` list.
_PARAM = re.compile(r"(?i)(?P<head>\b(?:password|passwd|pwd|token|secret|sasl\.password)=)(?P<pw>[^\s&;,'\"]+)")


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***``.

    >>> redact_dsn("https://vigil:s3cr3t@ch.example.org:8443/?password=x&database=v")
    'https://vigil:***@ch.example.org:8443/?password=***&database=v'
    >>> redact_dsn("chdb:///var/lib/vigil/history")
    'chdb:///var/lib/vigil/history'
    """
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return _PARAM.sub(lambda m: m["head"] + MASK, _USERINFO.sub(lambda m: m["head"] + MASK + m["at"], dsn))
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _pw = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if colon else netloc
    query = _PARAM.sub(lambda m: m["head"] + MASK, parts.query)
    if netloc == parts.netloc and query == parts.query:
        return dsn
    # (not urlunsplit: it drops the // of an empty host, chdb:///path)
    head = f"{parts.scheme}://{netloc}" if "://" in dsn else f"{parts.scheme}:{netloc}"
    return head + parts.path + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")


def dsn_secrets(dsn: str | None) -> list[str]:
    """The password(s) a DSN holds."""
    if not dsn:
        return []
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return []
    found = [parts.password] if parts.password else []
    found += [v for k, v in parse_qsl(parts.query) if k.lower() in ("password", "passwd", "pwd", "token")]
    return [f for f in found if f]


class Redactor:
    """Replaces known secret values (and their URL-encoded forms) and URL passwords in texts."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        self.add(values)

    def add(self, values: Iterable[str | None]) -> None:
        for value in values:
            if value and len(value) >= 4:  # (a 1-3 character "secret" would mask half of every text)
                self._values.update({value, quote(value, safe=""), quote_plus(value)})
        self._ordered = sorted(self._values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self._ordered:
            if value in text:
                text = text.replace(value, MASK)
        if "://" in text:
            text = _USERINFO.sub(lambda m: m["head"] + MASK + m["at"], text)
        if "=" in text:
            text = _PARAM.sub(lambda m: m["head"] + MASK, text)
        return text
