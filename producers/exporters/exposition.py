"""Reading a Prometheus text exposition into plain samples.

The exporters vigil reads (dcgm-exporter, node_exporter) serve the Prometheus
text format; :func:`parse` reads it with ``prometheus_client``'s parser and
returns every sample as ``(name, labels, value)``. Counter samples are named
as the parser names them: with a ``_total`` suffix, which it *adds* to a
counter exposed without one (dcgm-exporter's ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``
comes out as ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total``); the dcgm mapper strips
it again (DCGM field names are upper case, so a lower-case ``_total`` is always
the parser's). Samples whose value is not finite (``NaN``, which
both exporters use for "no value") are dropped: no event field can hold them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ExpositionError", "Sample", "parse"]


class ExpositionError(ValueError):
    """The text is not a Prometheus exposition; the message says where it failed."""


@dataclass(frozen=True)
class Sample:
    """One sample of an exposition."""

    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every finite sample of a text exposition, in order.

    >>> s = parse('# TYPE node_infiniband_link_downed_total counter\\n'
    ...           'node_infiniband_link_downed_total{device="mlx5_0",port="1"} 3\\n'
    ...           'DCGM_FI_DEV_GPU_TEMP{gpu="0"} NaN\\n')
    >>> [(x.name, x.labels, x.value) for x in s]
    [('node_infiniband_link_downed_total', {'device': 'mlx5_0', 'port': '1'}, 3.0)]
    >>> parse('this is { not an exposition')
    Traceback (most recent call last):
    ...
    vigil.producers.exporters.exposition.ExpositionError: not a Prometheus text exposition: ...
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                value = float(s.value)
                if math.isfinite(value):
                    out.append(Sample(s.name, dict(s.labels), value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # the parser's errors for malformed lines
        raise ExpositionError(f"not a Prometheus text exposition: {exc}"[:500]) from None
    return out
