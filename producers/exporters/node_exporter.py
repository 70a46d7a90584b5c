"""node_exporter's InfiniBand collector to vigil's ``NicCounters`` events.

node_exporter's ``infiniband`` collector (``collector/infiniband_linux.go``,
on by default) reads ``/sys/class/infiniband`` through
``prometheus/procfs`` (``sysfs/class_infiniband.go``) and exposes every port
counter as ``node_infiniband_<name>`` with labels ``device`` and ``port``.
vigil's NIC detector (:mod:`vigil.detectors.nic`) and the node agent speak the
sysfs file names, so each metric is mapped back to the file it was read from:

===================================================  ===============================
node_exporter metric (``node_infiniband_`` + ...)    sysfs counter (``counters/``)
===================================================  ===============================
``port_transmit_wait_total``                         ``port_xmit_wait``
``link_downed_total``                                ``link_downed``
``link_error_recovery_total``                        ``link_error_recovery``
``symbol_error_total``                               ``symbol_error``
``port_errors_received_total``                       ``port_rcv_errors``
``port_receive_remote_physical_errors_total``        ``port_rcv_remote_physical_errors``
``port_receive_switch_relay_errors_total``           ``port_rcv_switch_relay_errors``
``port_discards_received_total`` / ``_transmitted``  ``port_rcv_discards`` / ``port_xmit_discards``
``port_constraint_errors_received_total`` / ...      ``port_rcv_constraint_errors`` / ``port_xmit_...``
``local_link_integrity_errors_total``                ``local_link_integrity_errors``
``excessive_buffer_overrun_errors_total``            ``excessive_buffer_overrun_errors``
``vl15_dropped_total``                               ``VL15_dropped``
``port_packets_received_total`` / ``_transmitted``   ``port_rcv_packets`` / ``port_xmit_packets``
``port_data_received_bytes_total`` / ``_transmitted``  ``port_rcv_data`` / ``port_xmit_data`` (bytes / 4:
                                                     procfs multiplies the 4-octet words by 4)
``unicast_/multicast_packets_received/transmitted``  ``unicast_rcv_packets``, ... (``rcv``/``xmit``)
===================================================  ===============================

and the RoCE ``hw_counters/`` (mlx5; node_exporter 1.9 and later):

===================================================  ===============================
``np_cnp_packets_sent_total``                        ``np_cnp_sent``
``rp_cnp_packets_handled_total``                     ``rp_cnp_handled``
``rp_cnp_ignored_packets_received_total``            ``rp_cnp_ignored``
``np_ecn_marked_roce_packets_received_total``        ``np_ecn_marked_roce_packets``
``out_of_sequence_packets_received_total``           ``out_of_sequence``
``packet_sequence_errors_total``                     ``packet_seq_err``
``local_ack_timeout_errors_total``                   ``local_ack_timeout_err``
``out_of_buffer_drops_total``                        ``out_of_buffer``
``roce_adp_retransmits_total`` / ``_timeout_total``  ``roce_adp_retrans`` / ``roce_adp_retrans_to``
... (see :data:`HW_COUNTERS`)
===================================================  ===============================

``node_infiniband_state_id`` (1 down, 2 init, 3 armed, 4 active, 5 active
defer) becomes ``port_state``. The node is the target's configured name, else
``node_uname_info``'s ``nodename`` label (the uname collector, on by default),
else the target's host. Metrics not listed are left out: no detector reads them.

References
----------
prometheus/node_exporter ``collector/infiniband_linux.go`` (metric names) and
``collector/fixtures/e2e-output.txt`` (an exposition with them); prometheus/procfs
``sysfs/class_infiniband.go`` (sysfs file to field, the data counters x 4); NVIDIA,
"Understanding mlx5 Linux counters and status parameters" (hw_counters names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable

from vigil.producers.exporters.exposition import Sample
from vigil.schemas import NicCounters, Source

__all__ = ["PORT_COUNTERS", "HW_COUNTERS", "NicReading", "read_node_exporter", "nic_events"]

_PREFIX = "node_infiniband_"
#: node_exporter name (without the prefix) -> sysfs ``counters/`` file.
PORT_COUNTERS: dict[str, str] = {
    "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "link_downed_total": "link_downed",
    "link_error_recovery_total": "link_error_recovery",
    "local_link_integrity_errors_total": "local_link_integrity_errors",
    "multicast_packets_received_total": "multicast_rcv_packets",
    "multicast_packets_transmitted_total": "multicast_xmit_packets",
    "port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
    "port_data_received_bytes_total": "port_rcv_data",
    "port_data_transmitted_bytes_total": "port_xmit_data",
    "port_discards_received_total": "port_rcv_discards",
    "port_discards_transmitted_total": "port_xmit_discards",
    "port_errors_received_total": "port_rcv_errors",
    "port_packets_received_total": "port_rcv_packets",
    "port_packets_transmitted_total": "port_xmit_packets",
    "port_transmit_wait_total": "port_xmit_wait",
    "port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "port_receive_switch_relay_errors_total": "port_rcv_switch_relay_errors",
    "symbol_error_total": "symbol_error",
    "unicast_packets_received_total": "unicast_rcv_packets",
    "unicast_packets_transmitted_total": "unicast_xmit_packets",
    "vl15_dropped_total": "VL15_dropped",
}
#: node_exporter name (without the prefix) -> sysfs ``hw_counters/`` file (mlx5).
HW_COUNTERS: dict[str, str] = {
    "duplicate_requests_packets_total": "duplicate_request",
    "implied_nak_seq_errors_total": "implied_nak_seq_err",
    "local_ack_timeout_errors_total": "local_ack_timeout_err",
    "np_cnp_packets_sent_total": "np_cnp_sent",
    "np_ecn_marked_roce_packets_received_total": "np_ecn_marked_roce_packets",
    "out_of_buffer_drops_total": "out_of_buffer",
    "out_of_sequence_packets_received_total": "out_of_sequence",
    "packet_sequence_errors_total": "packet_seq_err",
    "req_cqes_errors_total": "req_cqe_error",
    "req_cqes_flush_errors_total": "req_cqe_flush_error",
    "req_remote_access_errors_total": "req_remote_access_errors",
    "req_remote_invalid_request_errors_total": "req_remote_invalid_request",
    "resp_cqes_errors_total": "resp_cqe_error",
    "resp_cqes_flush_errors_total": "resp_cqe_flush_error",
    "resp_local_length_errors_total": "resp_local_length_error",
    "resp_remote_access_errors_total": "resp_remote_access_errors",
    "rnr_nak_retry_packets_received_total": "rnr_nak_retry_err",
    "roce_adp_retransmits_total": "roce_adp_retrans",
    "roce_adp_retransmits_timeout_total": "roce_adp_retrans_to",
    "roce_slow_restart_used_total": "roce_slow_restart",
    "roce_slow_restart_cnps_total": "roce_slow_restart_cnps",
    "roce_slow_restart_total": "roce_slow_restart_trans",
    "rp_cnp_packets_handled_total": "rp_cnp_handled",
    "rp_cnp_ignored_packets_received_total": "rp_cnp_ignored",
    "rx_atomic_requests_total": "rx_atomic_requests",
    "rx_dct_connect_requests_total": "rx_dct_connect",
    "rx_icrc_encapsulated_errors_total": "rx_icrc_encapsulated",
    "rx_read_requests_total": "rx_read_requests",
    "rx_write_requests_total": "rx_write_requests",
}
_SYSFS = {**PORT_COUNTERS, **HW_COUNTERS}
#: Data counters: procfs reports octets (the sysfs 4-octet words x 4).
_WORDS = {"port_rcv_data", "port_xmit_data"}
#: ``node_infiniband_state_id`` -> the sysfs state word (``4: ACTIVE``).
PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_MAX_COUNTER = 2**63


@dataclass
class NicReading:
    """One scrape of one node_exporter: per ``(node, device, port)``, counters and state."""

    ports: dict[tuple[str, str, int], dict[str, int]] = field(default_factory=dict)
    states: dict[tuple[str, str, int], str] = field(default_factory=dict)
    nodename: str | None = None

    @property
    def nodes(self) -> set[str]:
        return {n for n, _, _ in self.ports} | {n for n, _, _ in self.states}


def read_node_exporter(samples: Iterable[Sample], node: str | None, fallback_node: str) -> NicReading:
    """Group node_exporter's InfiniBand samples by node, device and port (sysfs counter names).

    >>> from vigil.producers.exporters.exposition import parse
    >>> r = read_node_exporter(parse(
    ...     'node_uname_info{nodename="gpu-07",release="6.8.0"} 1\\n'
    ...     'node_infiniband_np_cnp_packets_sent_total{device="mlx5_0",port="1"} 1200\\n'
    ...     'node_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 4.0e+06\\n'
    ...     'node_infiniband_state_id{device="mlx5_0",port="1"} 4\\n'), None, "10.0.0.7")
    >>> r.ports, r.states
    ({('gpu-07', 'mlx5_0', 1): {'np_cnp_sent': 1200, 'port_rcv_data': 1000000}}, {('gpu-07', 'mlx5_0', 1): 'ACTIVE'})
    """
    samples = list(samples)
    out = NicReading()
    for s in samples:
        if s.name == "node_uname_info" and s.labels.get("nodename"):
            out.nodename = s.labels["nodename"]
            break
    where_node = node or out.nodename or fallback_node
    for s in samples:
        if not s.name.startswith(_PREFIX):
            continue
        short = s.name[len(_PREFIX):]
        device, port = s.labels.get("device"), s.labels.get("port", "")
        if not device or not port.isdigit() or int(port) < 1:
            continue
        key = (where_node, device, int(port))
        if short == "state_id":
            out.states[key] = PORT_STATES.get(int(s.value), str(int(s.value)))
            continue
        name = _SYSFS.get(short)
        if name is None:
            continue
        value = s.value / 4 if name in _WORDS else s.value
        if not 0 <= value < _MAX_COUNTER:
            continue
        out.ports.setdefault(key, {})[name] = int(value)
    return out


def nic_events(reading: NicReading, now: datetime, cluster: str) -> list[NicCounters]:
    """One ``NicCounters`` per port of the reading that has counters, sorted."""
    return [NicCounters(event_time=now, source=Source(cluster=cluster, node=node), device=device, port=port,
                        counters=dict(sorted(counters.items())), port_state=reading.states.get((node, device, port)))
            for (node, device, port), counters in sorted(reading.ports.items())]
