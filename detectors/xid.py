"""NVIDIA's Xid catalog, and what each code means for the job and the node.

The table is NVIDIA's own (vendored in ``detectors/data/xid-catalog.csv``, 172
codes, with the immediate and the investigatory resolution of each). The
resolution decides everything here, so no code is hand-picked:

=====================================  =================================================
immediate resolution                   verdict
=====================================  =================================================
``RESTART_APP``                        the application's own fault when NVIDIA says to
                                       check the application (``CHECK_APP/CUDA``,
                                       ``WORKFLOW_XID_13/31``); otherwise a transient
                                       fault of the layer the investigation points to
                                       (hardware, or system for ``INVESTIGATE_SW``):
                                       restart, no quarantine
``RESET_GPU``                          the GPU needs a reset: drain the node (hardware;
                                       system when NVIDIA says to investigate software,
                                       e.g. GSP firmware timeouts 119/120)
``RESTART_BM`` / ``RESTART_VM`` /      hardware that needs the node out of service: drain
``CONTACT_SUPPORT`` / ``CHECK_MECHANICALS``
``WORKFLOW_XID_48``                    a double-bit ECC error: drain, remap, reset
``WORKFLOW_NVLINK_ERR`` / ``…NVLINK5…``  an NVLink fault: drain
``WORKFLOW_XID_45``                    clean-up after another error: a cascade that waits
                                       for the Xid that caused it
``UPDATE_SWFW`` / ``CHECK_UVM``        system software (firmware / the UVM driver)
(any, for the GPU's firmware)          system when the error is the driver's or its
                                       micro-controllers' own (micro-controller halt,
                                       context-switch timeout, GSP, "driver firmware
                                       error"): the node is still drained when NVIDIA
                                       says reset, but the part is usually sound
``IGNORE`` / ``XID_154``               evidence only: never an action on its own
=====================================  =================================================

>>> info = xid_info(79)
>>> info.mnemonic, info.layer, info.transient, info.remedy, info.drains
('ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS', 'hardware', False, 'RESTART_BM', True)
>>> xid_info(13).layer, xid_info(119).layer, xid_info(94).transient, xid_info(63).evidence_only
('application', 'system', True, True)
>>> xid_info(62).layer, xid_info(62).drains  # PMU halt: firmware, still a reset
('system', True)
>>> xid_info(9999).remedy  # a code newer than the catalogue: treated as CONTACT_SUPPORT
'CONTACT_SUPPORT'
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "xid-catalog.csv"

# Remedies that need the node out of service (a reset, a reboot, a technician).
NODE_REMEDIES = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "CONTACT_SUPPORT",
        "CHECK_MECHANICALS",
        "UPDATE_SWFW",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
    }
)
EVIDENCE_ONLY = frozenset({"IGNORE", "XID_154"})
_APPLICATION_CHECKS = frozenset({"CHECK_APP/CUDA", "WORKFLOW_XID_13", "WORKFLOW_XID_31"})
_SOFTWARE_CHECKS = frozenset({"INVESTIGATE_SW", "INVESTIGATE_SW_USER", "UPDATE_SWFW"})
# The GPU's firmware and the driver's micro-controllers failing (PMU/SEC2 halt, FECS "driver firmware
# error", context-switch timeouts, GSP): every thread we hold with such an Xid (62, 109, 119) was
# diagnosed as the driver stack, and the corpus labels them so; the reset NVIDIA asks for still drains.
_FIRMWARE = re.compile(r"micro-controller|[Ff]irmware|by driver|Context Switch Timeout|GSP")
# Codes whose row carries no resolution (the newest drivers' codes), resolved by their description.
_UNRESOLVED: dict[int, str] = {
    162: "IGNORE",  # power smoothing capability re-engaged
    163: "IGNORE",  # power smoothing capability disengaged
    164: "IGNORE",  # power smoothing circuitry: low lifetime reached (plan a replacement)
    165: "CONTACT_SUPPORT",  # power smoothing circuitry: lifetime exhausted
    166: "RESET_GPU",  # confidential-computing traffic before the link was configured
    167: "RESTART_BM",  # PCIe fatal timeout
    168: "RESET_GPU",  # errors in the write-protected region
    169: "RESET_GPU",  # internal micro-controller halt
    170: "RESET_GPU",  # interrupt seen in CC mode
    171: "IGNORE",  # details of an Xid 48 (that Xid decides)
    172: "IGNORE",  # details of an Xid 48 (that Xid decides)
}
# Families as operators (and the corpus labels) group Xids: memory faults are ECC trouble.
_ECC_CODES = frozenset({48, 63, 64, 92, 94, 95, 140, 171, 172})


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's immediate resolution
    investigatory: str
    layer: str  # hardware | system | application
    transient: bool | None
    cascade: bool = False  # reported after (and because of) another error

    @property
    def remedy(self) -> str:
        return self.immediate

    @property
    def drains(self) -> bool:
        """Whether NVIDIA's first response needs the node out of service."""
        return self.immediate in NODE_REMEDIES

    @property
    def evidence_only(self) -> bool:
        return self.immediate in EVIDENCE_ONLY

    @property
    def family(self) -> str:
        return "ecc_error" if self.code in _ECC_CODES else "gpu_xid_hardware"


def _verdict(immediate: str, investigatory: str) -> tuple[str, bool | None, bool]:
    """``(layer, transient, cascade)`` from NVIDIA's two resolutions."""
    software = investigatory in _SOFTWARE_CHECKS
    if immediate == "RESTART_APP":
        if investigatory in _APPLICATION_CHECKS:
            return "application", True, False  # the first time is the user's call; a repeat is persistent
        return ("system" if software else "hardware"), True, False
    if immediate == "WORKFLOW_XID_45":
        return "system", True, True
    if immediate == "CHECK_UVM":
        return "system", True, False
    if immediate in ("UPDATE_SWFW",):
        return "system", False, False
    if immediate in EVIDENCE_ONLY:
        layer = "application" if investigatory in _APPLICATION_CHECKS else ("system" if software else "hardware")
        return layer, None, False
    # RESET_GPU, RESTART_BM/VM, CONTACT_SUPPORT, CHECK_MECHANICALS, the ECC and NVLink workflows.
    return ("system" if software else "hardware"), False, False


@cache
def catalog() -> dict[int, XidInfo]:
    """Every Xid code NVIDIA documents, with its verdict."""
    out: dict[int, XidInfo] = {}
    with CATALOG_PATH.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            code = int(row["code"])
            immediate = row["immediate_resolution"].strip() or _UNRESOLVED.get(code, "CONTACT_SUPPORT")
            investigatory = row["investigatory_resolution"].strip()
            layer, transient, cascade = _verdict(immediate, investigatory)
            if layer == "hardware" and _FIRMWARE.search(row["description"]):
                layer = "system"
            out[code] = XidInfo(
                code, row["mnemonic"], row["description"], immediate, investigatory, layer, transient, cascade
            )
    return out


def xid_info(code: int) -> XidInfo:
    """The verdict for ``code``; a code the catalogue does not know yet is treated as CONTACT_SUPPORT."""
    known = catalog().get(code)
    if known is not None:
        return known
    return XidInfo(code, "UNKNOWN", "not in NVIDIA's catalog", "CONTACT_SUPPORT", "", "hardware", False)
