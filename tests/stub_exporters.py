"""STUB dcgm-exporter and node_exporter for tests: a local HTTP server serving their text expositions.

Neither exporter can run here (no GPU, no DCGM, no RDMA devices), so tests serve
what they would serve, in their documented format: the Prometheus text format
0.0.4 with ``# HELP``/``# TYPE`` lines, dcgm-exporter's metric names (its
``etc/default-counters.csv`` fields) and labels (``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``;
``err_code``/``err_msg`` on ``DCGM_FI_DEV_XID_ERRORS``), and node_exporter's
``node_infiniband_*`` names with ``device``/``port`` labels and ``node_uname_info``.
The test sets each GPU's and port's values; the server renders them per request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

XID_TEXT = {0: "", 13: "Graphics Engine Exception", 48: "DBE (Double Bit Error) ECC Error",
            79: "GPU has fallen off the bus"}

_DCGM_HELP = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink flow-control CRC errors."),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink retries."),
    # commented out in the default counters file: served when a test sets them (StubGpu's None: not served)
    "DCGM_FI_DEV_POWER_VIOLATION": ("counter", "Throttling duration due to power constraints (in ns)."),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("counter", "Throttling duration due to thermal constraints (in ns)."),
}
_OPTIONAL = {"DCGM_FI_DEV_POWER_VIOLATION": "power_violation", "DCGM_FI_DEV_THERMAL_VIOLATION": "thermal_violation"}


@dataclass
class StubGpu:
    temp: float = 55.0
    sm_clock: float = 1980.0
    power: float = 650.0
    util: float = 97.0
    reasons: int = 0x0
    xid: int = 0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    fb_used: float = 40000.0
    fb_free: float = 41000.0
    remapped_corr: int = 0
    remapped_unc: int = 0
    nvlink_crc_flit: int = 0
    nvlink_replay: int = 0
    power_violation: int | None = None    # ns held below application clocks, cumulative
    thermal_violation: int | None = None


@dataclass
class StubPort:
    np_cnp_sent: int = 0
    rp_cnp_handled: int = 0
    np_ecn_marked: int = 0
    xmit_wait: int = 0
    link_downed: int = 0
    symbol_error: int = 0
    rcv_data_words: int = 1000
    state_id: int = 4


@dataclass
class StubNode:
    hostname: str
    gpus: list[StubGpu] = field(default_factory=lambda: [StubGpu() for _ in range(4)])
    ports: dict[tuple[str, int], StubPort] = field(default_factory=lambda: {("mlx5_0", 1): StubPort(),
                                                                             ("mlx5_1", 1): StubPort()})


def dcgm_exposition(node: StubNode, hostname_label: bool = True) -> str:
    """What dcgm-exporter 3.3.x serves for ``node``."""
    lines: list[str] = []
    for metric, (kind, text) in _DCGM_HELP.items():
        if metric in _OPTIONAL and all(getattr(g, _OPTIONAL[metric]) is None for g in node.gpus):
            continue
        lines.append(f"# HELP {metric} {text}")
        lines.append(f"# TYPE {metric} {kind}")
        for i, g in enumerate(node.gpus):
            if metric in _OPTIONAL and getattr(g, _OPTIONAL[metric]) is None:
                continue
            labels = (f'gpu="{i}",UUID="GPU-{node.hostname}-{i:04d}",pci_bus_id="00000000:{0x18 + 0x10 * i:02X}:00.0",'
                      f'device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3"')
            if hostname_label:
                labels += f',Hostname="{node.hostname}"'
            labels += ',DCGM_FI_DRIVER_VERSION="550.127.08"'
            value = {
                "DCGM_FI_DEV_SM_CLOCK": g.sm_clock, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_GPU_TEMP": g.temp,
                "DCGM_FI_DEV_POWER_USAGE": g.power, "DCGM_FI_DEV_GPU_UTIL": g.util, "DCGM_FI_DEV_FB_FREE": g.fb_free,
                "DCGM_FI_DEV_FB_USED": g.fb_used, "DCGM_FI_DEV_XID_ERRORS": g.xid,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": g.reasons, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": g.ecc_sbe,
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": g.ecc_dbe, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": g.remapped_corr,
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": g.remapped_unc,
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": g.nvlink_crc_flit,
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": g.nvlink_replay,
                "DCGM_FI_DEV_POWER_VIOLATION": g.power_violation, "DCGM_FI_DEV_THERMAL_VIOLATION": g.thermal_violation,
            }[metric]
            if metric == "DCGM_FI_DEV_XID_ERRORS":
                labels += f',err_code="{g.xid}",err_msg="{XID_TEXT.get(g.xid, "")}"'
            lines.append(f"{metric}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


_NE = {
    "np_cnp_packets_sent_total": ("counter", "The number of CNP packets sent by the Notification Point", "np_cnp_sent"),
    "rp_cnp_packets_handled_total": ("counter", "The number of CNP packets handled by the Reaction Point HCA",
                                     "rp_cnp_handled"),
    "np_ecn_marked_roce_packets_received_total": ("counter", "The number of RoCEv2 packets marked for congestion",
                                                  "np_ecn_marked"),
    "port_transmit_wait_total": ("counter", "Number of ticks during which the port had data to transmit but no data "
                                            "was sent during the entire tick", "xmit_wait"),
    "link_downed_total": ("counter", "Number of times the link failed to recover from an error state and went down",
                          "link_downed"),
    "symbol_error_total": ("counter", "Number of minor link errors detected on one or more physical lanes.",
                           "symbol_error"),
    "port_data_received_bytes_total": ("counter", "Number of data octets received on all links", "rcv_data_words"),
    "state_id": ("gauge", "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, "
                          "5: act defer)", "state_id"),
}


def node_exporter_exposition(node: StubNode) -> str:
    """What node_exporter (with its infiniband and uname collectors) serves for ``node``."""
    lines = ["# HELP node_uname_info Labeled system information as provided by the uname system call.",
             "# TYPE node_uname_info gauge",
             f'node_uname_info{{domainname="(none)",machine="x86_64",nodename="{node.hostname}",'
             f'release="6.8.0-45-generic",sysname="Linux",version="#45-Ubuntu SMP"}} 1',
             "# HELP node_load1 1m load average.", "# TYPE node_load1 gauge", "node_load1 3.2"]
    for short, (kind, text, attr) in _NE.items():
        lines.append(f"# HELP node_infiniband_{short} {text}")
        lines.append(f"# TYPE node_infiniband_{short} {kind}")
        for (device, port), p in sorted(node.ports.items()):
            value = getattr(p, attr)
            if attr == "rcv_data_words":
                value = f"{value * 4:.10e}"  # node_exporter prints octets (words x 4) as a float
            lines.append(f'node_infiniband_{short}{{device="{device}",port="{port}"}} {value}')
    return "\n".join(lines) + "\n"


class StubExporters:
    """One HTTP server: ``/dcgm/<node>/metrics`` and ``/node/<node>/metrics`` per stub node.

    ``down`` holds node names whose endpoints answer 503; ``hits`` counts requests per path.
    """

    def __init__(self, nodes: list[StubNode], hostname_label: bool = True) -> None:
        self.nodes = {n.hostname: n for n in nodes}
        self.hostname_label = hostname_label
        self.down: set[str] = set()
        self.garbage: set[str] = set()
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                parts = self.path.strip("/").split("/")
                with stub.lock:
                    stub.hits[self.path] = stub.hits.get(self.path, 0) + 1
                    if len(parts) != 3 or parts[2] != "metrics" or parts[1] not in stub.nodes:
                        self.send_error(404)
                        return
                    kind, name = parts[0], parts[1]
                    if name in stub.down:
                        self.send_error(503, "exporter down")
                        return
                    node = stub.nodes[name]
                    if name in stub.garbage:
                        body = "<html>this is { not an exposition</html>\n"
                    elif kind == "dcgm":
                        body = dcgm_exposition(node, stub.hostname_label)
                    elif kind == "node":
                        body = node_exporter_exposition(node)
                    else:
                        self.send_error(404)
                        return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def dcgm_url(self, node: str) -> str:
        return f"{self.base}/dcgm/{node}/metrics"

    def node_url(self, node: str) -> str:
        return f"{self.base}/node/{node}/metrics"

    def __enter__(self) -> "StubExporters":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
