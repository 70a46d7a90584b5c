"""SQL fragments the rollups and views share: the time type, the window, seconds, overlaps, evidence."""

from __future__ import annotations


def _list(values: tuple) -> str:
    return ", ".join(repr(v) for v in values)


_T = "DateTime64(6, 'UTC')"
_W = f"toDateTime64({{since:{_T}}}, 6, 'UTC') AS w0, toDateTime64({{until:{_T}}}, 6, 'UTC') AS w1"


def _secs(x: str) -> str:
    return f"(toUnixTimestamp64Micro({x}) / 1e6)"


def _overlap(a: str, b: str) -> str:
    """Seconds of [a, b) inside the window [w0, w1)."""
    return f"greatest(0., {_secs(f'least({b}, w1)')} - {_secs(f'greatest({a}, w0)')})"


def _evidence_of(kind: str, key: str, ch_type: str) -> str:
    return (f"if(alert_kind = '{kind}', JSONExtract(arrayFirst(e -> JSONExtractString(e, 'kind') = '{kind}', "
            f"JSONExtractArrayRaw(evidence)), '{key}', '{ch_type}'), NULL)")
