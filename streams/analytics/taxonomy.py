"""Which failure class and domain each incident kind (and XID code) belongs to, in Python and as SQL."""

from __future__ import annotations

from vigil.streams.analytics.sql import _list

# --- taxonomy ---------------------------------------------------------------

#: Slowdowns: the job keeps running, slower.
FAIL_SLOW_KINDS = ("fail_slow", "straggler", "throttle", "clock_below_peers", "congestion")
#: Signs of trouble that interrupt nothing.
WARNING_KINDS = ("ecc_sbe", "nvlink_errors", "transport_errors", "temperature_outlier")
#: What vigil says about itself.
VIGIL_KINDS = ("recovery_failed", "actuator_circuit_open")

#: kind -> failure domain (Meta's attribution: user code, system software, hardware, network).
DOMAIN_OF_KIND: dict[str, str] = {
    **{k: "hardware" for k in ("node_lost", "ecc_dbe", "ecc_sbe", "nvlink_errors", "throttle",
                               "clock_below_peers", "straggler", "temperature_outlier")},
    **{k: "network" for k in ("congestion", "link_flap", "transport_errors", "nccl_timeout", "connection_reset",
                              "connection_refused", "network_error")},
    **{k: "user_code" for k in ("software_error", "illegal_memory_access")},
    **{k: "system_software" for k in ("process_exit", "task_hang", "cuda_error", "iteration_period_lost",
                                      "recovery_failed", "actuator_circuit_open")},
}
#: XID codes that an application causes, and those of drivers/firmware; the rest are hardware.
XID_USER_CODE = (13, 31, 43, 45, 68, 69)
XID_SYSTEM_SOFTWARE = (32, 38, 61, 109, 119, 120, 154)


def _domain_sql() -> str:
    by_domain: dict[str, list[str]] = {}
    for kind, domain in DOMAIN_OF_KIND.items():
        by_domain.setdefault(domain, []).append(kind)
    arms = [f"kind = 'xid', multiIf(xid_code IN ({_list(XID_USER_CODE)}), 'user_code', "
            f"xid_code IN ({_list(XID_SYSTEM_SOFTWARE)}), 'system_software', 'hardware')",
            "kind = 'fail_slow', multiIf(slowdown_class = 'communication', 'network', "
            "slowdown_class = 'computation', 'hardware', 'system_software')"]
    arms += [f"kind IN ({_list(tuple(kinds))}), '{domain}'" for domain, kinds in by_domain.items()]
    return "multiIf(" + ", ".join(arms) + ", 'unknown')"


def _class_sql() -> str:
    return (f"multiIf(kind IN ({_list(FAIL_SLOW_KINDS)}), 'fail_slow', kind IN ({_list(VIGIL_KINDS)}), 'vigil', "
            f"kind IN ({_list(WARNING_KINDS)}) OR (kind = 'xid' AND severity = 3), 'warning', 'fail_stop')")
