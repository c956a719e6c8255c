"""A stand-in for NVIDIA's dcgm-exporter: its /metrics page, in its format, over real HTTP.

The page follows dcgm-exporter's output (``# HELP``/``# TYPE`` per field, one series per
GPU with the ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` and
``DCGM_FI_DRIVER_VERSION`` labels) for the fields of its ``etc/default-counters.csv``, with
the ECC counters that file leaves commented out switched on (``ecc=False`` leaves them out).

The telemetry is a timeline of rounds (:func:`telemetry`): two nodes of four GPUs at work;
from round 4 GPU 1 of ``gpu-node-a`` gains 60 corrected ECC errors a round (a burst), and
from round 6 GPU 2 of ``gpu-node-b`` reports Xid 79 (fallen off the bus).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NODES = ("gpu-node-a", "gpu-node-b")
GPUS = 4
SBE_NODE, SBE_GPU, SBE_FROM = "gpu-node-a", 1, 4
XID_NODE, XID_GPU, XID_FROM = "gpu-node-b", 2, 6

# (field, type, help) as in dcgm-exporter's default counters file
_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", None),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "temp_c"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "pcie_replay_total"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "util_pct"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid"),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", None),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "mem_used_mib"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors", None),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors", None),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", None),
)
_ECC = (
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.", "ecc_sbe_total"),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.", "ecc_dbe_total"),
)


def telemetry(node: str, gpu: int, round_: int) -> dict[str, float]:
    """What one GPU reports in one round (wire-contract names; ``xid`` is the last Xid, 0 for none)."""
    sbe = 60 * (round_ - SBE_FROM + 1) if (node, gpu) == (SBE_NODE, SBE_GPU) and round_ >= SBE_FROM else 0
    xid = 79 if (node, gpu) == (XID_NODE, XID_GPU) and round_ >= XID_FROM else 0
    return {
        "sm_clock_mhz": 1980.0,
        "temp_c": 61.0 + gpu,
        "power_w": 512.5,
        "pcie_replay_total": 0,
        "util_pct": 97.0,
        "xid": xid,
        "mem_used_mib": 61_440.0,
        "ecc_sbe_total": sbe,
        "ecc_dbe_total": 0,
    }


def uuid(node: str, gpu: int) -> str:
    return f"GPU-{NODES.index(node):08x}-0000-4000-8000-{gpu:012x}"


def pci_bus_id(gpu: int) -> str:
    return f"00000000:{0x18 + 0x10 * gpu:02X}:00.0"


def page(node: str, round_: int, ecc: bool = True) -> str:
    """The /metrics page of ``node`` in round ``round_``."""
    lines: list[str] = []
    for name, kind, help_, field in _FIELDS + (_ECC if ecc else ()):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for gpu in range(GPUS):
            labels = (
                f'gpu="{gpu}",UUID="{uuid(node, gpu)}",pci_bus_id="{pci_bus_id(gpu)}",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            value: Any = telemetry(node, gpu, round_).get(field, 0) if field else (20_000 if "FB_FREE" in name else 0)
            lines.append(f"{name}{{{labels}}} {value:g}" if isinstance(value, float) else f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def nvml_records(rounds: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """The same telemetry as NVML's collector writes it: a sample per GPU, and an Xid as its own event."""
    out: list[dict[str, Any]] = []
    last: dict[tuple[str, int], float] = {}
    for round_, ts in rounds:
        for node in NODES:
            for gpu in range(GPUS):
                values = telemetry(node, gpu, round_)
                xid = values.pop("xid")
                out.append({"ts": ts, "node": node, "gpu": gpu, "uuid": uuid(node, gpu), **values})
                if (node, gpu) in last and xid and xid != last[(node, gpu)]:
                    out.append({"ts": ts, "node": node, "gpu": gpu, "uuid": uuid(node, gpu), "xid": xid})
                last[(node, gpu)] = xid
    return out


class FakeExporter:
    """Serves one node's page over HTTP on a free loopback port; ``round_of()`` picks the round."""

    def __init__(self, node: str, round_of: Callable[[], int], ecc: bool = True) -> None:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = page(exporter.node, exporter.round_of(), exporter.ecc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.node, self.round_of, self.ecc = node, round_of, ecc
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class WallRounds:
    """Rounds that follow the wall clock once begun: round ``n`` is served from ``start + n × seconds``."""

    def __init__(self, seconds: float) -> None:
        self.start: float | None = None
        self.seconds = seconds

    def begin(self) -> float:
        self.start = time.time()
        return self.start

    def __call__(self) -> int:
        return 0 if self.start is None else int((time.time() - self.start) / self.seconds)
