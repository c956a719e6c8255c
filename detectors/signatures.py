"""The log signature catalogue: one table of fatal and suspicious log lines.

Each :class:`Signature` names a regular expression, the category and layer of the
failure it reveals, and whether it is a *cascade* (a symptom every rank prints
after some other rank failed, such as the NCCL watchdog timeout) or a *root*
(an error that can start an incident). Order matters: the first match wins, so
specific signatures come before general ones.

>>> m = match_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
>>> m.signature.category, m.signature.layer, m.fields["xid"], m.fields["pci"]
('xid_79', 'hardware', '79', '0000:3b:00')
>>> match_line("iteration 10/ 100 | elapsed time per iteration (ms): 512.3") is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Signature:
    id: str
    pattern: str
    category: str
    layer: str  # hardware | system | application | unknown
    kind: str = "crash"
    cascade: bool = False
    transient: bool | None = None
    severity: str = "fatal"  # fatal | error | warning
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))


@dataclass(frozen=True, slots=True)
class SignatureMatch:
    signature: Signature
    fields: dict[str, str]


# NVIDIA's Xid catalogue, reduced to what decides an action: the layer to blame,
# whether a restart of the application is enough (transient), and a short name.
XID_CLASSES: dict[int, tuple[str, bool | None, str]] = {
    13: ("application", True, "graphics engine exception"),
    31: ("application", True, "GPU memory page fault"),
    43: ("application", True, "GPU stopped processing"),
    45: ("system", True, "preemptive cleanup after another error"),
    48: ("hardware", False, "double-bit ECC error"),
    61: ("hardware", False, "internal micro-controller breakpoint"),
    62: ("hardware", False, "internal micro-controller halt"),
    63: ("hardware", True, "ECC page retirement or row remap recorded"),
    64: ("hardware", False, "ECC page retirement or row remap failure"),
    74: ("hardware", False, "NVLink error"),
    79: ("hardware", False, "GPU has fallen off the bus"),
    92: ("hardware", False, "high single-bit ECC error rate"),
    94: ("hardware", True, "contained ECC error"),
    95: ("hardware", False, "uncontained ECC error"),
    119: ("hardware", False, "GSP RPC timeout"),
    120: ("hardware", False, "GSP error"),
    140: ("hardware", False, "unrecovered ECC error"),
}

XID_SIGNATURE_ID = "nvrm_xid"

CATALOGUE: tuple[Signature, ...] = (
    # --- GPU driver (kernel log) -------------------------------------------------
    Signature(
        XID_SIGNATURE_ID,
        r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)",
        "xid",  # refined to xid_<code> by the matcher
        "hardware",
    ),
    Signature("nvswitch_sxid", r"SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)", "sxid", "hardware"),
    Signature(
        "gpu_lost",
        r"GPU is lost|fallen off the bus|RmInitAdapter failed|rm_init_adapter failed",
        "xid_79",
        "hardware",
        transient=False,
    ),
    # --- CUDA ----------------------------------------------------------------------
    Signature(
        "cuda_ecc",
        r"(?i)uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
        "ecc_dbe",
        "hardware",
        transient=False,
    ),
    Signature(
        "cuda_oom",
        r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
        "oom",
        "application",
        transient=False,
    ),
    Signature(
        "cuda_illegal_address",
        r"illegal memory access|misaligned address",
        "cuda_illegal_address",
        "application",
        transient=False,
    ),
    Signature("cuda_device_assert", r"device-side assert", "cuda_device_assert", "application", transient=False),
    Signature("cuda_launch_failure", r"unspecified launch failure", "cuda_launch_failure", "hardware"),
    Signature("cublas_cudnn", r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+", "cuda_library_error", "application"),
    Signature("cuda_error", r"CUDA error: |CUDAError|cuda runtime error", "cuda_error", "unknown"),
    # --- Network -------------------------------------------------------------------
    Signature("ib_retry_exceeded", r"[Tt]ransport retry count exceeded", "ib_link", "hardware"),
    Signature(
        "nccl_ib_error",
        r"NCCL WARN NET/IB.*(?:error|status=)\s*\d+|NET/IB : Got async event : port error",
        "ib_link",
        "hardware",
    ),
    Signature("ibv_wc_error", r"IBV_WC_\w+|CQ state error", "ib_link", "hardware"),
    # --- NCCL / torch.distributed ----------------------------------------------------
    Signature(
        "nccl_watchdog_timeout",
        r"Watchdog caught collective operation timeout|collective operation timeout|"
        r"NCCL (?:communicator|work) .*timed out",
        "nccl_timeout",
        "system",
        kind="crash",
        cascade=True,
        transient=True,
    ),
    Signature(
        "nccl_error",
        r"NCCL error|ncclSystemError|ncclRemoteError|ncclInternalError|"
        r"unhandled system error|remote process exited",
        "nccl_error",
        "system",
        transient=True,
    ),
    Signature(
        "tcpstore",
        r"TCPStore|RendezvousError|rendezvous.*(?:failed|timed out)",
        "rendezvous",
        "system",
        cascade=True,
        transient=True,
    ),
    Signature(
        "elastic_child_failed",
        r"ChildFailedError|failed \(exitcode: (?P<exit_code>-?\d+)\)",
        "process_crash",
        "unknown",
        cascade=True,
    ),
    # --- Process -----------------------------------------------------------------------
    Signature(
        "host_oom_killer",
        r"Out of memory: Killed process|oom-kill|oom_kill|OOM Killed|"
        r"Some of your processes may have been killed by the cgroup out-of-memory handler",
        "host_oom",
        "application",
    ),
    Signature("segfault", r"Segmentation fault|SIGSEGV|segfault at", "segfault", "application"),
    Signature("sigabrt", r"SIGABRT|Aborted \(core dumped\)", "process_crash", "application"),
    # --- Numerics --------------------------------------------------------------------------
    Signature(
        "nan_loss",
        r"(?i)loss[^|]{0,40}?\b(?:nan|inf)\b|Model diverged with loss = NaN",
        "nan_loss",
        "application",
        transient=False,
    ),
    # --- Scheduler ---------------------------------------------------------------------------
    Signature("slurm_node_fail", r"DUE TO NODE FAILURE|NODE_FAIL", "node_fail", "hardware"),
    Signature("slurm_time_limit", r"DUE TO TIME LIMIT", "time_limit", "application", severity="error"),
)

# Cheap pre-filter: almost every line is progress or info; one search for any of
# these words skips the full catalogue for them.
_PREFILTER = re.compile(
    r"Xid|XID|GPU is lost|fallen off|RmInit|rm_init|ECC|CUDA|cuda|NCCL|Watchdog|timed out|"
    r"illegal|misaligned|assert|launch failure|CUBLAS|CUDNN|retry count|IBV_WC|CQ state|"
    r"TCPStore|Rendezvous|rendezvous|ChildFailed|exitcode|Out of memory|oom|OOM|"
    r"Segmentation|SIG|segfault|Aborted|nan|NaN|inf\b|DUE TO|NODE_FAIL|out-of-memory"
)


def match_line(line: str) -> SignatureMatch | None:
    """The first catalogue signature matching ``line``, with extracted fields."""
    if _PREFILTER.search(line) is None:
        return None
    for sig in CATALOGUE:
        m = sig.regex.search(line)
        if m is None:
            continue
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        if sig.id == XID_SIGNATURE_ID:
            return SignatureMatch(_xid_signature(int(fields["xid"])), fields)
        return SignatureMatch(sig, fields)
    return None


def _xid_signature(code: int) -> Signature:
    layer, transient, _name = XID_CLASSES.get(code, ("hardware", None, "unlisted Xid"))
    return _XID_SIGS.setdefault(
        code,
        Signature(f"{XID_SIGNATURE_ID}_{code}", CATALOGUE[0].pattern, f"xid_{code}", layer, transient=transient),
    )


_XID_SIGS: dict[int, Signature] = {}
