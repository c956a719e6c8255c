"""The log signature catalogue: one table of fatal and suspicious log lines.

Each :class:`Signature` names a regular expression, the category and layer of the
failure it reveals, whether it is a *cascade* (a symptom every rank prints after
some other rank failed, such as the NCCL watchdog timeout) or a *root* (an error
that can start an incident), a transient/persistent hint, and an optional
``extract`` pattern for fields (NCCL op/seqnum/timeout, exit code, PCI bus id).
Order matters: the first match wins, so specific signatures come before general
ones. ``warning`` signatures only count when they come as a storm (``storm``
lines within ``storm_window_s``).

>>> m = match_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
>>> m.signature.category, m.signature.layer, m.fields["xid"], m.fields["pci"]
('xid_79', 'hardware', '79', '0000:3b:00')
>>> m = match_line("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
...                "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds")
>>> m.signature.cascade, m.fields["op"], m.fields["seqnum"], m.fields["timeout_ms"]
(True, 'ALLREDUCE', '469508', '1800000')
>>> match_line("failed (exitcode: -11) local_rank: 0 (pid: 5275)").signature.layer
'application'
>>> match_line("iteration 10/ 100 | elapsed time per iteration (ms): 512.3 | number of nan iterations: 0") is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace


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
    extract: str = ""
    storm: int = 0  # warnings: this many lines within storm_window_s make an anomaly
    storm_window_s: float = 300.0
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    extract_regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))
        object.__setattr__(self, "extract_regex", re.compile(self.extract) if self.extract else None)


@dataclass(frozen=True, slots=True)
class SignatureMatch:
    signature: Signature
    fields: dict[str, str]


# NVIDIA's Xid catalogue, reduced to what decides an action: the layer to blame,
# whether restarting the application is enough (transient), and a short name.
# 13/31/43 are raised by the application's own kernels; 119/120 are GSP
# firmware faults (a GPU reset clears them).
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
    119: ("system", True, "GSP RPC timeout"),
    120: ("system", True, "GSP error"),
    140: ("hardware", False, "unrecovered ECC error"),
}

# Exit status of a rank as torchrun reports it (negative: killed by that signal).
EXIT_CODE_LAYERS: dict[int, tuple[str, str]] = {
    -11: ("application", "segfault"),  # SIGSEGV: the process's own bug
    -6: ("application", "process_crash"),  # SIGABRT: an assert or std::terminate
    -9: ("system", "process_crash"),  # SIGKILL: OOM killer, scheduler, watchdog
    -7: ("system", "process_crash"),  # SIGBUS: shared memory or a failing host
    -15: ("system", "process_crash"),  # SIGTERM: told to stop
}

_XID = "nvrm_xid"
_EXIT = "elastic_exitcode"
_NCCL_FIELDS = r"SeqNum=(?P<seqnum>\d+), OpType=(?P<op>\w+)(?:.*?Timeout\(ms\)=(?P<timeout_ms>\d+))?"
_PCI = r"(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)"

CATALOGUE: tuple[Signature, ...] = (
    # --- GPU driver (kernel log) ---------------------------------------------------
    Signature(_XID, r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)", "xid", "hardware"),
    Signature("nvswitch_sxid", r"SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)", "sxid", "hardware"),
    Signature("gpu_lost", r"GPU is lost|fallen off the bus", "gpu_lost", "hardware", transient=False, extract=_PCI),
    Signature(
        "gpu_init_failed",
        r"RmInitAdapter failed|rm_init_adapter failed|Cannot attach gpu",
        "gpu_init_failed",
        "hardware",
        transient=False,
        extract=_PCI,
    ),
    Signature(
        "cuda_contained", r"CUDA_ERROR_CONTAINED|cudaErrorContained", "gpu_contained_error", "hardware", transient=True
    ),
    # --- CUDA ------------------------------------------------------------------------
    Signature(
        "cuda_ecc",
        r"(?i)uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
        "ecc_dbe",
        "hardware",
        transient=False,
    ),
    # PyTorch's caching allocator says "Tried to allocate": the job asked for too much.
    Signature("cuda_oom", r"CUDA out of memory|OutOfMemoryError", "oom", "application", transient=False),
    # The same error from a plain CUDA runtime call, with no allocator message, is
    # what a failing device produces (BLOOM tr1-13B: a faulty GPU, re-allocated).
    Signature("cuda_oom_runtime", r"CUDA error: out of memory|cudaErrorMemoryAllocation", "oom", "hardware"),
    Signature(
        "cuda_illegal_address",
        r"illegal memory access|misaligned address",
        "cuda_illegal_address",
        "application",
        transient=False,
    ),
    Signature("cuda_device_assert", r"device-side assert", "cuda_device_assert", "application", transient=False),
    # A launch failure surfacing in the NCCL watchdog is the device failing under a
    # collective; in the application's own stream it is the application's kernel.
    Signature(
        "cuda_launch_failure_watchdog",
        r"watchdog thread terminated with exception: CUDA error: "
        r"unspecified launch failure",
        "cuda_launch_failure",
        "hardware",
    ),
    Signature("cuda_launch_failure", r"unspecified launch failure", "cuda_launch_failure", "application"),
    Signature("cuda_unknown_error", r"CUDA error: unknown error|cudaErrorUnknown", "cuda_unknown_error", "hardware"),
    Signature("cublas_cudnn", r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+", "cuda_library_error", "application"),
    Signature("cuda_error", r"CUDA error: |cuda runtime error", "cuda_error", "unknown"),
    # --- Network -----------------------------------------------------------------------
    Signature("ib_retry_exceeded", r"[Tt]ransport retry count exceeded", "ib_link", "hardware"),
    Signature(
        "nccl_ib_error",
        r"NCCL WARN NET/IB.*(?:error|status=)\s*\d+|NET/IB : Got async event : port error",
        "ib_link",
        "hardware",
    ),
    Signature("ibv_wc_error", r"IBV_WC_\w+|CQ state error|ibv_poll_cq failed", "ib_link", "hardware"),
    # A NIC that trained down to a lower link speed or width still works, slowly: every
    # collective of every job on the node waits for it.
    Signature(
        "nic_link_degraded",
        r"(?i)mlx5_core.*link (?:speed|width) (?:degraded|downgraded)|"
        r"\bib\d+:.*(?:speed|width) (?:degraded|downgraded)",
        "nic_degraded",
        "hardware",
        kind="straggler",
        severity="warning",
    ),
    # --- NCCL / torch.distributed ----------------------------------------------------------
    Signature(
        "nccl_watchdog_timeout",
        r"Watchdog caught collective operation timeout|collective operation timeout|"
        r"NCCL (?:communicator|work) .*timed out",
        "nccl_timeout",
        "system",
        cascade=True,
        transient=True,
        extract=_NCCL_FIELDS,
    ),
    Signature(
        "nccl_error",
        r"NCCL error|ncclSystemError|ncclRemoteError|ncclInternalError|"
        r"unhandled system error|remote process exited|NCCL WARN Net : .*failed|"
        r"NCCL WARN .*Failed to execute operation",
        "nccl_error",
        "system",
        transient=True,
    ),
    Signature(
        "tcpstore",
        r"TCPStore|RendezvousError|RendezvousTimeoutError|rendezvous.*(?:failed|timed out)",
        "rendezvous",
        "system",
        cascade=True,
        transient=True,
    ),
    Signature(
        "gloo_connection",
        r"gloo.*(?:Connection reset by peer|Connection closed by peer|Read error)",
        "rendezvous",
        "system",
        cascade=True,
        transient=True,
    ),
    Signature(_EXIT, r"exitcode\s*:\s*(?P<exit_code>-?\d+)", "process_crash", "unknown", cascade=True),
    Signature("elastic_child_failed", r"ChildFailedError", "process_crash", "unknown", cascade=True),
    # --- Process --------------------------------------------------------------------------------
    Signature(
        "host_oom_killer",
        r"Out of memory: Killed process|oom-kill|oom_kill|OOM Killed|"
        r"Some of your processes may have been killed by the cgroup out-of-memory handler",
        "host_oom",
        "application",
    ),
    Signature("segfault", r"Segmentation fault|SIGSEGV|segfault at", "segfault", "application"),
    Signature("sigabrt", r"SIGABRT|Aborted \(core dumped\)", "process_crash", "application"),
    # --- Numerics ----------------------------------------------------------------------------------
    Signature(
        "nan_loss",
        r"(?i)\bloss[^|]{0,40}?\b(?:nan|inf)\b|grad norm:\s*(?:nan|inf)\b|"
        r"Model diverged with loss = NaN|NanLossDuringTrainingError",
        "nan_loss",
        "application",
        kind="numerics",
        transient=False,
    ),
    Signature(
        "loss_scale_overflow",
        r"OVERFLOW! Rank \d+ Skipping step|Gradient overflow\.\s+Skipping step",
        "nan_loss",
        "application",
        kind="numerics",
        severity="warning",
        storm=20,
        storm_window_s=600,
    ),
    # --- Host / PCIe --------------------------------------------------------------------------------
    Signature(
        "pcie_aer_corrected",
        r"AER: Corrected error|PCIe Bus Error: severity=Corrected",
        "pcie_aer",
        "hardware",
        kind="gpu_degraded",
        severity="warning",
        storm=50,
        storm_window_s=60,
    ),
    # --- Scheduler ---------------------------------------------------------------------------------------
    Signature("slurm_node_fail", r"DUE TO NODE FAILURE|NODE_FAIL", "node_fail", "hardware"),
    Signature("slurm_time_limit", r"DUE TO TIME LIMIT", "time_limit", "application", severity="error"),
    # --- Last resort: an uncaught Python exception that no signature above explains is the
    # training script's own (transient unknown: the history step calls it persistent on a repeat).
    Signature(
        "python_exception",
        r"^(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?(?P<exception>[A-Z]\w*(?:Error|Exception)): ",
        "python_exception",
        "application",
    ),
)

# Coarse families, as operators (and the excerpt benchmark) group failures.
FAMILIES: dict[str, str] = {
    "nccl_timeout": "nccl_timeout",
    "nccl_error": "nccl_error",
    "ib_link": "ib_link_error",
    "ecc_dbe": "ecc_error",
    "oom": "oom",
    "host_oom": "oom",
    "nan_loss": "nan_loss",
    "process_crash": "process_crash",
    "segfault": "process_crash",
    "rendezvous": "process_crash",
    "sxid": "gpu_xid_hardware",
    "gpu_lost": "gpu_xid_hardware",
    "gpu_init_failed": "gpu_xid_hardware",
    "gpu_contained_error": "gpu_xid_hardware",
    "pcie_aer": "other",
    "nic_degraded": "ib_link_error",
}


def family_of(category: str) -> str:
    """The coarse family of a category (Xids split by whether the application caused them)."""
    if category in FAMILIES:
        return FAMILIES[category]
    if category.startswith("xid_"):
        code = int(category[4:]) if category[4:].isdigit() else -1
        return "cuda_error" if XID_CLASSES.get(code, ("",))[0] == "application" else "gpu_xid_hardware"
    if category.startswith("cuda_"):
        return "cuda_error"
    return "other"


# Cheap pre-filter: almost every line is progress or info; one search for any of
# these words skips the full catalogue for them.
_PREFILTER = re.compile(
    r"Xid|XID|GPU is lost|fallen off|RmInit|rm_init|Cannot attach|CONTAINED|Contained|ECC|CUDA|cuda|NCCL|"
    r"Watchdog|timed out|illegal|misaligned|assert|launch failure|CUBLAS|CUDNN|retry count|IBV_WC|CQ state|"
    r"ibv_|mlx5_core|TCPStore|Rendezvous|rendezvous|gloo|ChildFailed|exitcode|Out of memory|oom|OOM|Segmentation|SIG|"
    r"segfault|Aborted|nan|NaN|inf\b|OVERFLOW|overflow|AER|DUE TO|NODE_FAIL|out-of-memory|cudaError|Error: |Exception: "
)
_RANK = re.compile(r"\[(?:rank|Rank )(\d{1,6})\]")


def match_line(line: str) -> SignatureMatch | None:
    """The first catalogue signature matching ``line``, with extracted fields."""
    if _PREFILTER.search(line) is None:
        return None
    for sig in CATALOGUE:
        m = sig.regex.search(line)
        if m is None:
            continue
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        if sig.extract_regex is not None:
            extra = sig.extract_regex.search(line)
            if extra is not None:
                fields.update({k: v for k, v in extra.groupdict().items() if v is not None})
        rank = _RANK.search(line)
        if rank is not None:
            fields.setdefault("rank", rank[1])
        return SignatureMatch(_refine(sig, fields), fields)
    return None


_REFINED: dict[tuple[str, str], Signature] = {}


def _refine(sig: Signature, fields: dict[str, str]) -> Signature:
    """Signatures whose meaning depends on a code: Xid number, rank exit status."""
    if sig.id == _XID:
        code = int(fields["xid"])
        layer, transient, _name = XID_CLASSES.get(code, ("hardware", None, "unlisted Xid"))
        key = (sig.id, str(code))
        if key not in _REFINED:
            _REFINED[key] = replace(sig, id=f"{_XID}_{code}", category=f"xid_{code}", layer=layer, transient=transient)
        return _REFINED[key]
    if sig.id == _EXIT and "exit_code" in fields:
        code = int(fields["exit_code"])
        if code not in EXIT_CODE_LAYERS:
            return sig
        layer, category = EXIT_CODE_LAYERS[code]
        key = (sig.id, str(code))
        if key not in _REFINED:
            _REFINED[key] = replace(sig, category=category, layer=layer)
        return _REFINED[key]
    return sig


def classify_text(text: str) -> SignatureMatch | None:
    """The signature that names a multi-line excerpt: the first root error, else the first cascade or warning."""
    first: SignatureMatch | None = None
    for line in text.splitlines():
        m = match_line(line)
        if m is None:
            continue
        if not m.signature.cascade and m.signature.severity != "warning":
            return m
        first = first or m
    return first
