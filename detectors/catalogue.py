"""The log signature catalogue: one table of fatal and suspicious log lines, as real software prints them.

Each :class:`Signature` names a regular expression, the category and layer of the
failure it reveals, whether it is a *cascade* (a symptom every rank prints after
some other rank failed, such as the NCCL watchdog timeout) or a *root* (an error
that can start an incident), a transient/persistent hint, and an optional
``extract`` pattern for fields (NCCL op/seqnum/timeout, exit code, PCI bus id).
Order matters: the first match wins, so specific signatures come before general
ones. ``warning`` signatures only count when they come as a storm (``storm``
lines within ``storm_window_s``). ``weak`` roots (a bare Python exception) do not
outrank a cascade already held: the exception is usually that cascade surfacing.

The families were grown from real excerpts (``../shared/datasets/real-log-corpus/tune.jsonl``,
never from its holdout part) and from NVIDIA's, PyTorch's, NCCL's, Slurm's and
the kernel's own message texts. Layers follow the diagnosis operators reach:
process deaths reported by launchers and schedulers, NCCL/c10d/socket/shared
memory trouble, GSP firmware and host OOM kills are *system*; device memory,
lost GPUs, PCIe/NVLink/InfiniBand physical faults are *hardware*; the job's own
kernels, allocations and numerics are *application*.
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
    extract: str = ""
    storm: int = 0  # warnings: this many lines within storm_window_s make an anomaly
    storm_window_s: float = 300.0
    weak: bool = False  # a last-resort root that does not outrank a held cascade
    remedy: str | None = None  # what the node needs (NVIDIA's vocabulary: RESET_GPU, RESTART_BM, ...)
    notice: bool = False  # what it reports is a warning to notify, never an action
    # Literal words one of which every line the pattern matches contains: the (slower) regex is
    # tried only when one is there. Empty: always tried. tests/unit/detectors/test_catalogue.py guards them.
    anchors: tuple[str, ...] = ()
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    extract_regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))
        object.__setattr__(self, "extract_regex", re.compile(self.extract) if self.extract else None)


# What launchers and log collectors put in front of a line: ``srun -l``'s rank, ``[rankN]:``,
# torchrun's ``[defaultN]:``, Open MPI's ``--tag-output``, Ray's actor tag, pdsh's host, the CRI
# stamp and stream of Kubernetes' container logs, compose's service column, ``kubectl --prefix``,
# journald's host and unit, Python logging's stamp and level (ERROR and above). A pattern that must
# start the line allows any of them first, so the same failure is read the same way however it was
# collected.
ENVELOPE = (
    # Atomic alternatives and bounded runs: what an envelope matched is never re-split, so a line of
    # repeated prefixes or long runs of spaces costs linear time (a plain group backtracked exponentially).
    # Logging levels: only ERROR and above (a WARNING that quotes an exception is not a crash).
    # Indentation comes first and once: inside the repeated group, a long run of spaces cost quadratic time.
    r"[ \t]{0,16}(?>\s*\d{1,6}: |\[(?:rank|default)\d{1,6}\]:\s*|\[\d{1,6},\d{1,6}\]<std(?:out|err|diag)>:\s*|"
    r"\((?:[\w.-]{1,64} )?pid=\d{1,10}(?:, ip=[\d.]{1,40})?\)\s+|[a-z][\w.-]{0,62}\d: |"
    r"\d{4}-\d\d-\d\dT[\d:.]{1,24}(?:Z|[+-]\d\d:?\d\d)? std(?:out|err) [FP] |[\w.-]{1,64}\s+\| |"
    r"\[pod/[^\]]{1,200}\] |[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S{1,64} [\w./@-]{1,64}(?:\[\d{1,10}\])?: |"
    r"\[?\d{4}-\d\d-\d\d[ T][\d:.,]{1,32}\]?\s*(?:-\s*)?(?:[\w.]{1,64}\s*-\s*)?"
    r"\[?(?:ERROR|CRITICAL|FATAL)\]?\s*(?:[-:]\s*)?(?:\[[\w.]{1,64}:\d{1,6}:\w{1,64}\]\s*)?|"
    r"(?:ERROR|CRITICAL):[\w.]{1,64}:|"
    # glog / klog at E or F; Hydra's, rich's and loguru's layouts at ERROR or above.
    r"[EF]\d{4} \d\d:\d\d:\d\d\.\d{1,9}\s{1,16}\d{1,10} [\w./-]{1,128}:\d{1,6}\] |"
    r"\[\d{4}-\d\d-\d\d [\d:.,]{1,32}\]\[[\w.]{1,64}\]\[(?:ERROR|CRITICAL|FATAL)\] - |"
    r"\[\d\d:\d\d:\d\d\] (?:ERROR|CRITICAL)\s{1,16}|"
    r"\d{4}-\d\d-\d\d [\d:.]{1,32} \| (?:ERROR|CRITICAL)\s{0,16}\| [\w.:<>-]{1,128} - )*"
)

XID = "nvrm_xid"
EXIT = "elastic_exitcode"
_NCCL_FIELDS = r"SeqNum=(?P<seqnum>\d+), OpType=(?P<op>\w+)(?:.*?Timeout\(ms\)=(?P<timeout_ms>\d+))?"
PCI = r"(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)"
_SYS = "system"
_HW = "hardware"
_APP = "application"

CATALOGUE: tuple[Signature, ...] = (
    # --- GPU driver (kernel log) and GPU health agents ------------------------------------------------------
    # "Xid (PCI:0000:3b:00): 45, ... caused by previous Xid 149": the earlier Xid is the cause.
    Signature(
        XID,
        r"\bXid \((?:PCI:)?(?P<pci>[^)]*)\):? (?P<xid>\d+)"
        # NVLink 5 Xids print their severity: "145, [pid=…, name=…, ]RLW_RXPIPE Nonfatal XC0 i0 Link 13".
        r"(?:, (?:pid=\d+, name=[^,]{0,64}, )?[\w ]{1,60}? (?P<xid_severity>Nonfatal) XC ?\d)?"
        r"(?:.*?caused by previous Xid (?P<cause_xid>\d+))?",
        "xid",
        _HW,
    ),
    # Kubernetes device plugins, DCGM and node agents that name an Xid they saw.
    Signature(
        "agent_xid",
        r"XidCriticalError: Xid=(?P<xid>\d+)|EventType:8 EventData:(?P<xid2>\d+)|"
        r"DCGM_FI_DEV_XID_ERRORS\S*\s+(?P<xid3>[1-9]\d*)\b|\bXID[ =:]+(?P<xid4>\d{1,3})\b.*(?i:unhealthy)|"
        r"(?i:detected xid(?: error)?\W+)(?P<xid5>\d{1,3})\b|(?i:xid error )(?P<xid6>\d{1,3})\b|"
        r"\bXid (?P<xid7>\d{1,3}), [A-Z][A-Z0-9_]{3,}|Found XID errors: (?P<xid8>\d{1,3})\b",  # ... NHC
        "xid",
        _HW,
        anchors=("Xid", "XID", "xid", "EventType:8"),
    ),
    # NVSwitch errors: the driver says whether the switch survived. A non-fatal SXid is a warning that
    # matters in a burst; a fatal one takes the fabric (and every GPU behind it) down: drain and reset.
    Signature(
        "nvswitch_sxid_nonfatal",
        r"SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+), Non-fatal",
        "sxid",
        _HW,
        kind="gpu_degraded",
        severity="warning",
        storm=3,
        storm_window_s=3600.0,
        notice=True,
    ),
    Signature(
        "nvswitch_sxid",
        r"SXid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)",
        "sxid",
        _HW,
        transient=False,
        remedy="CONTACT_SUPPORT",
    ),
    # DCGM's health watches name the subsystem (thermal, power, memory, PCIe, NVLink) that tripped;
    # nvidia-smi prints ERR! in a field it cannot read (a fan, a sensor: the GPU may still compute).
    Signature(
        "gpu_health_warning",
        r"Detected a (?:WARNING|FAILURE|ERROR) in health system \w+|DCGM_HEALTH_RESULT_(?:WARN|FAIL)|"
        r"\|\s*ERR!\s|\bERR!\s+\d+W\s*/",
        "gpu_health",
        _HW,
        kind="gpu_degraded",
        severity="warning",
        storm=1,
        notice=True,
        anchors=("health system", "DCGM_HEALTH_RESULT", "ERR!"),
    ),
    Signature(
        "gpu_lost",
        r"GPU is lost|fallen off the bus|NV_ERR_GPU_IS_LOST|GPU lost from the bus|"
        r"Unable to determine the device handle for (?:GPU )?[0-9a-fA-F:.]+: (?:Unknown Error|GPU is lost)|"
        r"\b[0-9a-f]{2}:[0-9a-f]{2}\.0 (?:VGA compatible|3D) controller: NVIDIA Corporation.*\(rev ff\)|"
        r"nvidia \S+: AER: can't recover|NVRM: GPU [0-9a-fA-F:.]+: GPU has fallen off|"
        r"device (?:is |was )?marked unhealthy|[Mm]arking (?:it|device \S+) unhealthy|GPU requires reset|"
        r"NVML_ERROR_GPU_IS_LOST|GPU has fallen off|Unable to determine the device handle for GPU\d+",
        "gpu_lost",
        _HW,
        transient=False,
        extract=PCI,
        remedy="RESTART_BM",
        anchors=(
            "lost",
            "LOST",
            "fallen",
            "device handle",
            "rev ff",
            "AER",
            "unhealthy",
            "requires reset",
        ),
    ),
    # The driver's status for "this GPU needs a reset" comes after the error that caused it (a GSP timeout,
    # an Xid): it waits for that cause, and alone says what NVIDIA's resolution would (reset the GPU).
    Signature(
        "gpu_reset_required",
        r"NV_ERR_RESET_REQUIRED",
        "gpu_reset_required",
        _HW,
        cascade=True,
        transient=False,
        remedy="RESET_GPU",
        anchors=("RESET_REQ",),
    ),
    # DCGM's diagnostics table: a test failed on a GPU.
    Signature(
        "dcgm_diag_failed",
        r"\|\s*Fail - GPU: \d+",
        "dcgm_diag_failed",
        _HW,
        transient=False,
        anchors=("Fail - GPU",),
    ),
    Signature(
        "gpu_init_failed",
        r"RmInitAdapter failed|rm_init_adapter failed|Cannot attach gpu|NVRM: GPU [0-9a-fA-F:.]+: Failed to enable",
        "gpu_init_failed",
        _HW,
        transient=False,
        extract=PCI,
        remedy="RESET_GPU",
    ),
    # A node (or container) where the driver sees no GPU at all: the driver or the runtime, not a part.
    Signature(
        "no_gpu_found",
        r"No devices were found|No devices found\. Waiting indefinitely|NVRM: No NVIDIA (?:graphics adapter|GPU) "
        r"(?:probed|found)|NVIDIA probe routine was not called|Failed to initialize NVML: |NVML: Driver Not Loaded|"
        r"nvml\.Init: Unknown Error|"
        r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver|"
        r"(?i:no cuda-capable device is detected)|CUDA-capable devices? (?:is|are) busy or unavailable|"
        r"Driver/library version mismatch|[Ii]mpossible to initialize nvidia nvml|"
        r"cudaErrorNoDevice|CUDA_ERROR_NO_DEVICE|cudaErrorDevicesUnavailable|system not yet initialized|"
        r"cudaErrorSystemNotReady|"
        r"Found no NVIDIA driver on your system|NVIDIA driver on your system is too old",
        "gpu_missing",
        _SYS,
        transient=False,
        anchors=(
            "No devices",
            "No NVIDIA",
            "probe routine",
            "NVML",
            "nvml",
            "NVIDIA-SMI",
            "cuda-capable",
            "CUDA-capable",
            "cudaError",
            "CUDA_ERROR",
            "system not yet",
            "mismatch",
            "NVIDIA driver",
        ),
    ),
    Signature(
        "pcie_fatal",
        r"PCIe Bus Error: severity=Uncorrected \(Fatal\)|AER: (?:Multiple )?Uncorrected \(Fatal\) error|"
        r"Surprise Down Error|AER: device recovery failed",
        "pcie_fatal",
        _HW,
        transient=False,
        extract=PCI,
        remedy="RESTART_BM",
    ),
    Signature(
        "cuda_contained",
        # cudaErrorContained as CUDA prints it in words.
        r"CUDA_ERROR_CONTAINED|cudaErrorContained|Invalid access of peer GPU memory over nvlink or a hardware error",
        "gpu_contained_error",
        _HW,
        transient=True,
    ),
    # --- GPU memory (ECC) ------------------------------------------------------------------------------------
    Signature(
        "cuda_ecc",
        r"(?i:uncorrectable ECC error)|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable|ECC_DBE_VOL_TOTAL`?\s*\|"
        r"\s*[1-9]|double bit ECC error",
        "ecc_dbe",
        _HW,
        transient=False,
        remedy="WORKFLOW_XID_48",
        anchors=("ECC", "ecc", "double bit"),
    ),
    Signature(
        "ecc_sbe_storm",
        r"ECC_SBE_(?:VOL|AGG)_TOTAL`?\s*\|\s*[\d,.eE+]{6,}|(?i:single[- ]bit ECC errors? (?:rate|storm|exceeded))|"
        r"(?i:retired pages? pending)|remapped_rows_pending\W+[1-9]|ROW_REMAP_FAILURE`?\s*\|\s*[1-9]",
        "ecc_sbe_burst",
        _HW,
        kind="gpu_degraded",
        transient=False,
        anchors=("ECC", "remap", "retired", "ROW_REMAP", "single", "Single"),
    ),
    # Host memory: an uncorrected error (EDAC "UE"; the AMD decoder's "Uncorrected, ..." and "System Fatal
    # error") takes the node out; a corrected one (EDAC "CE", "Corrected error, no action required", the
    # kernel's "Machine check events logged") is a degrading DIMM to tell operators about. "DRAM ECC error
    # detected" comes with both, so the status line decides.
    Signature(
        "host_ecc",
        r"EDAC (?:\w+ )?MC\d+: (?:\d+ )?UE |\[Hardware Error\]: .*(?:Uncorrected[ ,]|System Fatal error)|"
        r"\b[1-9]\d* Uncorrected Errors\b|\b[1-9]\d* [Uu][Nn]corrected memory errors detected",  # edac-util, NHC
        "host_memory_ecc",
        _HW,
        kind="gpu_degraded",
        transient=False,
        anchors=("EDAC", "Hardware Error", "orrected"),
    ),
    Signature(
        "host_ecc_corrected",
        r"EDAC (?:\w+ )?MC\d+: (?:\d+ )?CE |\[Hardware Error\]: .*Corrected error|Machine check events logged|"
        r"\b[1-9]\d* corrected memory errors detected \(limit",  # NHC, over its limit (edac-util's count is cumulative)
        "host_memory_ecc",
        _HW,
        kind="gpu_degraded",
        severity="warning",
        storm=1,
        notice=True,
        anchors=("EDAC", "Hardware Error", "Machine check", "orrected"),
    ),
    # --- CUDA ------------------------------------------------------------------------------------------------
    # Host memory, in words that the GPU-memory signatures below would otherwise claim (Ray's
    # ``OutOfMemoryError`` is its memory monitor killing a worker) or that no OOM wording has.
    Signature(
        "host_memory_exhausted",
        r"running low on memory|ray\.exceptions\.OutOfMemoryError|std::bad_alloc|MemoryError: Unable to allocate|"
        # The GPU driver itself cannot get memory (system memory, or unified memory on Grace/GB10 hosts).
        r"NVRM: [^\n]{0,200}?NV_ERR_NO_MEMORY|"
        r"System memory low at node .* killing",
        "host_oom",
        _SYS,
        transient=False,
        anchors=("memory", "bad_alloc", "MemoryError", "NV_ERR_NO_MEMORY"),
    ),
    # PyTorch's caching allocator says "Tried to allocate": the job asked for too much.
    Signature(
        "cuda_oom",
        r"CUDA out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED: Out of memory|Resource exhausted: Out of memory|"
        r"NCCL WARN Cuda failure '?out of memory|Failed to CUDA calloc|CUBLAS_STATUS_ALLOC_FAILED|"
        r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation: out of memory|HIP out of memory|"
        # (TF's allocator also says so when "the caller indicates that this is not a failure": a retry.)
        r"ran out of memory (?:trying|while trying) to allocate(?!.*not a failure)|"
        r"Allocator \(GPU_\d+_bfc\) ran out of memory(?!.*not a failure)|"
        r"OOM when allocating tensor|torch\.OutOfMemoryError|cudaMalloc (?:failed|retry failed).*out of memory|"
        r"ResourceExhaustedError.*(?:OOM|[Oo]ut of memory)|XlaRuntimeError: RESOURCE_EXHAUSTED|"
        r"RESOURCE_EXHAUSTED: (?:Failed to allocate|Attempting to (?:allocate|reserve)|Error allocating device buffer)|"
        r"Resource exhausted: Attempting to allocate|"
        r"Out of memory error on GPU \d+|memory::allocation::BadAlloc|"
        # Older frameworks name CUDA's error 2 (cudaErrorMemoryAllocation) by number; CuPy and vLLM in their words.
        r"cuda runtime error \(2\) : out of memory|error=2 : out of memory|\(2 vs\. 0\)\s+out of memory|"
        r"out of memory to allocate \d+ bytes|No available memory for the cache blocks|"
        r"Non-OK-status: .*status: Internal: out of memory",
        "oom",
        _APP,
        transient=False,
    ),
    # The same error from a plain CUDA runtime call, with no allocator message, is
    # what a failing device produces (BLOOM tr1-13B: a faulty GPU, re-allocated).
    Signature("cuda_oom_runtime", r"CUDA error: out of memory|cudaErrorMemoryAllocation", "oom", _HW),
    # NCCL reporting a CUDA call that failed under it (not out of memory: above).
    Signature(
        "nccl_cuda_failure",
        r"NCCL WARN Cuda failure|NCCL WARN .*(?:cuMem|cuMulticast|NVLS).*failed|ncclUnhandledCudaError|"
        r"Failed to bind NVLink SHARP",
        "nccl_error",
        _SYS,
        transient=True,
    ),
    Signature(
        "cuda_illegal_address",
        r"illegal memory access|misaligned address|illegal instruction|an illegal address|cudaErrorIllegalAddress|"
        r"CUDA_ERROR_ILLEGAL_ADDRESS|invalid configuration argument|too many resources requested for launch|"
        r"operation not permitted when stream is capturing|CUDA error: invalid argument|"
        r"CUDA error: invalid resource handle|CUDA error: an illegal|Warp Out-of-range Address|"
        r"CUDA_EXCEPTION_\d+",
        "cuda_illegal_address",
        _APP,
        transient=False,
    ),
    # A kernel's own assert, as the device prints it (one line per failing thread), or as the host reports it.
    Signature(
        "cuda_device_assert",
        r"device-side assert|\.cu:\d+: .*block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion|"
        r"\.cu:\d+:? .*Assertion `.*` failed|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion",
        "cuda_device_assert",
        _APP,
        transient=False,
    ),
    # A launch failure surfacing in the NCCL watchdog is the device failing under a
    # collective; in the application's own stream it is the application's kernel.
    Signature(
        "cuda_launch_failure_watchdog",
        r"watchdog thread terminated with exception: CUDA error: unspecified launch failure",
        "cuda_launch_failure",
        _HW,
    ),
    Signature("cuda_launch_failure", r"unspecified launch failure", "cuda_launch_failure", _APP),
    Signature("cuda_unknown_error", r"CUDA error: unknown error|cudaErrorUnknown", "cuda_unknown_error", _HW),
    # The CUDA stack (driver, toolkit, cuDNN) that does not fit the GPU or the build: environment, not code.
    Signature(
        "cuda_environment",
        r"CUDNN_STATUS_INTERNAL_ERROR|CUDNN_STATUS_NOT_INITIALIZED|CUDA driver version is insufficient|"
        r"cudaErrorInsufficientDriver|forward compatibility was attempted on non supported HW|"
        r"cuda runtime error \((?:35|3)\)|CUDA_ERROR_NOT_INITIALIZED|cudaErrorInitializationError|"
        r"CUDA error: initialization error|Cuda failure '?initialization error|"
        r"operation cannot be performed in the present state|PTX JIT compiler library not found|"
        r"peer access is not supported between these two devices|"
        r"CUDA error: operation not supported|cudaErrorNotSupported|CUDA error: CUDA driver version|"
        r"PTX was compiled with an unsupported toolchain|UNSUPPORTED_PTX_VERSION|cudaErrorUnsupportedPtxVersion|"
        r"Loaded runtime CuDNN library: .* but source was compiled with|"
        r"nvrtc: error: invalid value for --gpu-architecture",
        "cuda_environment",
        _SYS,
        transient=False,
    ),
    Signature(
        "cuda_arch_mismatch",
        r"no kernel image is available for execution|with CUDA capability sm_\d+ is not compatible with the current "
        r"PyTorch installation|invalid device function|cudaErrorNoKernelImageForDevice",
        "cuda_arch_mismatch",
        _APP,  # the framework build the job brought: its environment, not the node's
        transient=False,
    ),
    Signature(
        "cublas_cudnn",
        r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|CUBLAS failure|kernel execution error\.|CUFFT_\w+|cuFFT error|"
        r"CUSOLVER_STATUS_\w+|CUSPARSE_STATUS_\w+|CURAND_STATUS_\w+|NVRTC_ERROR_\w+|"
        r"cuBLAS API failed with status \d+",
        "cuda_library_error",
        _APP,
    ),
    # A kernel asks for more of a GPU's resources than it has (Triton's shared-memory check).
    Signature(
        "kernel_out_of_resources",
        r"OutOfResources: out of resource: shared memory|triton\.runtime\.errors\.OutOfResources",
        "cuda_error",
        _APP,
        transient=False,
        anchors=("OutOfResources",),
    ),
    # CUDA's own word for an NVLink fault under a job (cudaErrorNvlinkUncorrectable): the link, not the code.
    Signature(
        "nvlink_uncorrectable",
        r"uncorrectable NVLink error|cudaErrorNvlinkUncorrectable|CUDA_ERROR_NVLINK_UNCORRECTABLE",
        "nvlink_error",
        _HW,
        transient=False,
        remedy="WORKFLOW_NVLINK_ERR",
        anchors=("NVLink", "Nvlink", "NVLINK"),
    ),
    Signature(
        "cuda_error",
        r"CUDA error: |cuda runtime error|CUDA Error: |THCudaCheck FAIL|GPUassert: |CUDA status Error",
        "cuda_error",
        _APP,
    ),
    # --- Network: InfiniBand / RoCE / EFA -------------------------------------------------------------------
    Signature(
        "ib_retry_exceeded",
        r"[Tt]ransport retry count(?:er)? exceeded|retry exceeded error|RETRY EXCEEDED ERROR",
        "ib_link",
        _HW,
        transient=True,
    ),
    # UCX failing to set up its RDMA resources (locked-memory limits, a missing device): configuration.
    Signature(
        "ucx_setup_failure",
        r"UCX\s+ERROR .*(?:ibv_\w+\(.*\) failed|Failed to create)|Failed to create UCP worker",
        "ib_link",
        _SYS,
        transient=False,
        anchors=("UCX", "UCP"),
    ),
    Signature(
        "nic_link_lost",
        r"NETDEV WATCHDOG: \S+ \(mlx\d_core\): transmit queue \d+ timed out|\bib\d+: carrier lost",
        "ib_link",
        _HW,
        transient=True,
        anchors=("NETDEV", "carrier"),
    ),
    # UCX's transport errors (endpoint timeouts, remote operation errors, receiver-not-ready retries, a QP
    # it cannot create): every thread we hold diagnosed the fabric's software or its configuration. Not any
    # "UCX ERROR": UCX prints one for each transport it then falls back from.
    Signature(
        "ucx_transport_error",
        # (not "... will not be handled since no error callback is installed": part of a peer's normal close)
        r"UCX\s+ERROR (?!.*no error callback is installed).*(?:Endpoint timeout|Connection reset by remote peer|"
        r"Input/output error|Remote I/O error|"
        r"[Tt]ransport error|devx_obj_create\(QP\) failed)|"
        r"RNR retry count exceeded|Remote operation error|Failed to resolve UCX endpoint",
        "ib_link",
        _SYS,
        transient=True,
        anchors=("UCX", "RNR", "Remote operation"),
    ),
    # The port went down (a flap): transient unless it repeats on the node (see detectors.history).
    Signature("ib_port_error", r"Got async event : port error|IBV_EVENT_PORT_ERR", "ib_link", _HW, transient=True),
    Signature(
        "ib_async_fatal",
        r"Got async event : (?:local catastrophic error|device fatal)|(?:LOC_CATAS_ERROR|IBV_EVENT_DEVICE_FATAL)",
        "ib_link",
        _HW,
        transient=False,
    ),
    Signature(
        "nccl_ib_completion_error",
        r"NET/IBP?\s*:.*(?:completion|Got completion).*(?:error|status=)\s*\d+|"
        r"NET/IB.*(?:vendor err|status=\d+)|IBV_WC_(?!SUCCESS)\w+|CQ state error|ibv_poll_cq failed|"
        r"wc status\s*=?\s*(?:12|5)\b",
        "ib_link",
        _HW,
        transient=True,
    ),
    # The kernel says the physical link went (no cable, no light, a module fault): the part or the cable.
    Signature(
        "ib_port_physical_down",
        r"Port module event(?:\[error\])?: .*(?:[Ee]rror|overheat|power budget|[Tt]emperature)|"
        r"mlx5_core \S+: .*link down|mlx5_\d+/\d+: port \d+ (?:went )?down|insufficient power on the PCIe slot|"
        r"\bib\w*\d+: (?:Link|link) (?:is )?down\b",
        "ib_link",
        _HW,
        transient=True,
        anchors=("Port module", "mlx5", "ib", "insufficient power"),
    ),
    # Status dumps (ibstat, ibv_devinfo, ibdev2netdev, NHC) list every port, and a node has ports that are
    # down by design (an unused second port, an Ethernet port without a cable, IPoIB netdevs on a pure IB
    # fabric): what they show is told, never acted on. No light (Polling, LinkDown) points at a part;
    # Disabled is an administrator's choice, PORT_INIT and an unassigned LID (65535) a subnet manager's,
    # NHC's "no port ACTIVE" either.
    Signature(
        "ib_port_status_physical",
        # A cable unplugged is a state too: an empty cage at boot, or a hand; a port a job used fails it loudly.
        r"(?i:physical[_ ]state:?\s*(?:POLLING|LinkDown))|Port module event: .*Cable unplugged",
        "ib_link",
        _HW,
        kind="node_unhealthy",
        severity="warning",
        storm=1,
        notice=True,
        anchors=("hysical", "Port module"),
    ),
    Signature(
        "ib_port_status_logical",
        r"(?i:physical[_ ]state:?\s*DISABLED)|\(Down\)\s*$|\bstate:\s+PORT_INIT\b|Base lid:\s*65535\b|"
        r"check_hw_ib:\s+No IB port \S+ is ACTIVE",
        "ib_link",
        _SYS,
        kind="node_unhealthy",
        severity="warning",
        storm=1,
        notice=True,
    ),
    # The verbs layer refuses the configuration: the fabric's software, not a part.
    Signature(
        "ib_port_logical_down",
        r"Port number \d+ state is Down|Couldn't set the link layer|Couldn't get context for the device",
        "ib_link",
        _SYS,
        transient=False,
    ),
    Signature(
        "ib_setup_failed",
        r"Call to ibv_\w+ failed|ibv_\w+ failed with error|ncclIbRoceGetVersionNum|NET/OFI Couldn't|"
        r"mlx5_load_one failed|mlx5_core.*(?:handle_hca_cap failed|probe of .* failed)|"
        r"transport/net_ib\.cc:\d+ -> \d|send completion with error|local protection error|NET/OFI.*ERROR|"
        r"NET/IB : Unable to open device|"
        # Access and protection errors are keys and registrations (software, GPUDirect set-up), not the link.
        r"[Rr]emote access error\b|Couldn't allocate MR|[Ff]ailed to create MR|ibv_reg_mr failed|"
        r"Failed status [45]: wr_id|"
        # Open MPI's openib transport: completion queues it cannot resize or poll (the device is busy).
        r"cannot resize completion queue|error polling [HL]P CQ with -?\d+ errno",
        "ib_link",
        _SYS,
        transient=False,
    ),
    # A NIC that trained down to a lower link speed or width still works, slowly: every
    # collective of every job on the node waits for it.
    Signature(
        "nic_link_degraded",
        r"(?i)mlx5_core.*link (?:speed|width) (?:degraded|downgraded)|"
        r"\bib\d+:.*(?:speed|width) (?:degraded|downgraded)",
        "nic_degraded",
        _HW,
        kind="straggler",
        severity="warning",
        anchors=("degraded", "downgraded"),
    ),
    # --- NCCL / torch.distributed --------------------------------------------------------------------------
    Signature(
        "nccl_invalid_usage",
        r"ncclInvalidUsage|invalid usage of NCCL|Duplicate GPU detected|ncclInvalidArgument",
        "nccl_error",
        _SYS,
        transient=False,
    ),
    Signature(
        "nccl_watchdog_timeout",
        r"Watchdog caught collective operation timeout|collective operation timeout|"
        r"NCCL (?:communicator|work) .*timed out|Some NCCL operations have failed or timed out|"
        r"failure detected by watchdog at work sequence id|Timeout at NCCL work|"
        r"watchdog got stuck for \d+ seconds|Heartbeat monitor timed out|detected no heartbeat of its watchdog|"
        r"Timed out initializing process group in store based barrier|got error: Socket Timeout|"
        r"DEADLINE_EXCEEDED: Barrier timed out|cluster registration failed|"
        r"timed out in blocking wait|NCCL_BLOCKING_WAIT.*timed out|Operation timed out!?\s*$|"
        # Gloo's collectives (CPU groups, barriers) time out in their own words.
        r"gloo.*Timed out waiting \d+ms for (?:recv|send) operation|"
        # XLA's NCCL id exchange through the coordination key-value store.
        r"GetKeyValue\(\) timed out with key",
        "nccl_timeout",
        _SYS,
        cascade=True,
        transient=True,
        extract=_NCCL_FIELDS,
    ),
    # SHARP/CollNet cannot be set up: NCCL says so and uses point-to-point instead. Recognised (so the
    # line is not taken for an unexplained failure), never an anomaly: a warning without a storm size.
    Signature(
        "collnet_unavailable",
        r"SHARP coll init error|Cannot initialize CollNet, using point-to-point",
        "collnet_unavailable",
        _SYS,
        severity="warning",
    ),
    Signature(
        "nccl_shm",
        r"Error while creating shared memory segment|posix_fallocate failed|failed to extend /dev/shm|"
        r"NCCL WARN .*(?:shm|/dev/shm).*(?:No space left|failed)|unable to allocate shared memory",
        "nccl_error",
        _SYS,
        transient=False,
    ),
    Signature(
        "nccl_socket",
        r"NCCL WARN (?:socket\w*|Net|NET/Socket|Socket)\b.*(?:failed|closed|reset|refused|timed out|abort)|"
        r"WARN Socket creation failed|socketStartConnect: Connect to .* failed|Connection closed by remote peer|"
        r"NCCL WARN Call to (?:connect|recv|send|accept|bind) .*failed|NCCL WARN socketPollConnect|"
        r"socketStartConnect: exceeded retries|"
        # NCCL's return-code trace (``transport/net.cc:515 -> 2``): 2 is ncclSystemError, 6 ncclRemoteError.
        r"NCCL INFO [\w/.-]+\.(?:cc|h|cu|cpp):\d+ -> [26]\b",
        "nccl_error",
        _SYS,
        transient=True,
    ),
    Signature(
        "nccl_error",
        r"N(?:CCL|ccl) error|ncclSystemError|ncclRemoteError|ncclInternalError|unhandled cuda error|"
        r"unhandled system error|remote process exited|NCCL WARN Net : .*failed|nccl\w+ failed: unhandled cuda error|"
        r"NCCL WARN .*Failed to execute operation|NCCL WARN .*(?:Error|error|failed)\b",
        "nccl_error",
        _SYS,
        transient=True,
    ),
    # The c10d watchdog died of something its line does not name (it names timeouts and CUDA errors above).
    Signature(
        "nccl_watchdog_exception",
        r"watchdog thread terminated with exception",
        "nccl_timeout",
        _SYS,
        cascade=True,
        transient=True,
    ),
    # NCCL's bootstrap retrying a refused connection: every rank prints it about once a second while a
    # slow peer starts, so it is evidence only; giving up ("exceeded retries") is the failure (nccl_socket).
    Signature(
        "nccl_connect_retry",
        r"NCCL INFO Call to connect returned Connection refused, retrying",
        "nccl_error",
        _SYS,
        severity="warning",
    ),
    # Collective stall warnings (Horovod's stall inspector, XLA's rendezvous): a warning once, a stall
    # when they keep coming (they also show up in runs that then finish fine).
    # Horovod's stall inspector lists the collectives waiting a minute or more, each with its missing ranks.
    # One warning alone also comes in runs that then finish fine; two stalled ops named are worth telling
    # operators (a storm of the warning itself is the stall below; the hang detector decides the rest).
    Signature(
        "horovod_stalled_ops",
        r"\[missing ranks: [\d, ]+\]",
        "collective_stall",
        _SYS,
        kind="straggler",
        severity="warning",
        storm=2,
        storm_window_s=900.0,
        notice=True,
        anchors=("missing ranks",),
    ),
    Signature(
        "collective_stall_warning",
        r"waiting for remainder of ranks for more than \d+ seconds|not all of them arrived on time|"
        r"has been waiting for .* and may be stuck",
        "nccl_timeout",
        _SYS,
        severity="warning",
        storm=3,
        storm_window_s=900.0,
        transient=True,
    ),
    # A communicator torn down because of an earlier failure: that failure is the story.
    Signature(
        "nccl_aborted",
        r"NCCL communicator was aborted|ncclCommAbort|Abort COMPLETE|communicator .* aborted",
        "nccl_error",
        _SYS,
        cascade=True,
        transient=True,
    ),
    # Mismatched collectives across ranks are the program's bug.
    Signature(
        "collective_mismatch",
        r"Monitored Barrier encountered error|CollectiveFingerPrint|Detected mismatch between collectives|"
        r"Mismatched collective detected",
        "collective_mismatch",
        _APP,
        transient=False,
    ),
    Signature(
        "tcpstore",
        r"TCPStore|RendezvousError|RendezvousTimeoutError|RendezvousClosedError|RendezvousConnectionError|"
        r"rendezvous.*(?:failed|timed out)|\[c10d\] The client socket has timed out|"
        # ... failed to connect: but errno 22 / 97 is an address family (IPv6) the client then retries past.
        r"\[c10d\] The client socket has failed to connect(?!.*\(errno: (?:22|97) - )|"
        r"\[c10d\].*(?:Connection reset by peer|Connection refused|recvValue failed|Read callback failed)|"
        r"connect\(\) timed out\. Original timeout|c10d store has failed|DistStoreError|DistNetworkError|"
        r"server socket has failed to (?:listen|bind)|Timed out waiting for clients|"
        r"Timed out after \d+ seconds waiting for clients|EADDRINUSE|[Aa]ddress already in use|"
        # JAX/XLA multi-host: the coordination service is the rendezvous.
        r"RPC: /tensorflow\.CoordinationService/(?:RegisterTask|Barrier|WaitForAllTasks)|"
        r"Coordination service agent in error status|has been set to ERROR in coordination service|"
        r"Gloo connectFullMesh failed",
        "rendezvous",
        _SYS,
        cascade=True,
        transient=True,
        anchors=(
            "TCPStore",
            "Rendezvous",
            "rendezvous",
            "c10d",
            "connect()",
            "DistStore",
            "DistNetwork",
            "socket",
            "waiting for clients",
            "EADDRINUSE",
            "already in use",
            "CoordinationService",
            "oordination service",
            "connectFullMesh",
        ),
    ),
    Signature(
        "gloo_connection",
        r"gloo.*(?:Connection reset by peer|Connection closed by peer|Read error)",
        "rendezvous",
        _SYS,
        cascade=True,
        transient=True,
    ),
    # --- Process deaths, as launchers and schedulers report them --------------------------------------------
    Signature(
        EXIT,
        r"exitcode\s*:\s*(?P<exit_code>-?\d+)|exits? with return code\s*=?\s*(?P<exit_code2>-?\d+)",
        "process_crash",
        _SYS,
        cascade=True,
        # torchelastic: "failed (exitcode: -9) local_rank: 2 (pid: 5109) of binary ..." — the process id
        # names the rank once the rank's probe has reported it (its records carry their pid).
        extract=r"(?:local_rank:\s*(?P<local_rank>\d+)\s+)?\(pid:\s*(?P<pid>\d+)\)",
    ),
    Signature(
        "elastic_child_failed",
        r"ChildFailedError|Root Cause \(first observed failure\)",
        "process_crash",
        _SYS,
        cascade=True,
    ),
    # MPI runtimes, launchers and orchestrators reporting that a process of the job died or never started.
    Signature(
        "runtime_lost_process",
        r"An MPI communication peer process has unexpectedly disconnected|"
        r"ORTE has lost communication with a remote daemon|An error occurred in MPI_Init|\*\*\* MPI_ERRORS_ARE_FATAL|"
        r"MPI_ABORT was invoked|\*\*\* Process received signal \*\*\*|"
        r"LAUNCH ERROR [^\n]{0,80}?(?:Container failed|Pod failed)|Container rank \d+ status failed|"
        r"\bCrashLoopBackOff\b|(?i:back-off (?:\S+ )?restarting failed container)|"
        r"ABORT!!! Out of all \d+ trainers",  # Paddle's launcher
        "process_crash",
        _SYS,
        cascade=True,
        anchors=(
            "MPI",
            "ORTE",
            "Process received signal",
            "LAUNCH ERROR",
            "Container rank",
            "CrashLoopBackOff",
            "restarting failed container",
            "ABORT!!!",
        ),
    ),
    # glibc found the heap corrupted and aborts the process (a native bug somewhere in the stack).
    Signature(
        "heap_corruption",
        r"\*\*\* Error in `[^`]*': |double free or corruption|free\(\): invalid (?:pointer|size)|"
        r"malloc\(\): \S.*corrupted|corrupted size vs\. prev_size",
        "process_crash",
        _SYS,
        transient=False,
        anchors=("Error in `", "double free", "free(): invalid", "corrupted"),
    ),
    Signature(
        "launcher_killed",
        r"Received \d+ death signal, shutting down workers|sigkill_handler\]|Killing subprocess \d+|"
        r"WTERMSIG \d+|srun: error: .*: tasks? [\d,-]+: (?:Killed|Terminated|Exited with exit code [1-9]\d*)|"
        r"Force Terminated (?:job|StepId)|terminated with signal SIG\w+|terminated with exit code [1-9]|"
        r"exited on signal \d+|died with <Signals\.SIG\w+|Signal \d+ \(SIG\w+\) received by PID|"
        r"mpirun noticed that process rank|process returned a non-zero exit code|"
        r"Per user-direction, the job has been aborted|"
        r"exit(?:ed)? (?:with )?(?:code|status) (?:13[4-9]|143)\b|Worker group FAILED|"
        r"[Cc]hild process .*(?:terminated|died|killed)|BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES|"
        r"(?i:exit code)\W{0,3}\(?(?:13[4-9]|143)\)?",
        "process_crash",
        _SYS,
        cascade=True,
        anchors=(
            "death signal",
            "sigkill",
            "Killing",
            "WTERMSIG",
            "srun",
            "Force Terminated",
            "terminated",
            "exited",
            "died with",
            "Signal",
            "mpirun",
            "non-zero exit",
            "exit code",
            "exit status",
            "Worker group",
            "hild process",
            "BAD TERMINATION",
            "Exit Code",
            "137",
            "139",
            "143",
            "134",
            "135",
            "136",
            "138",
        ),
    ),
    Signature(
        "host_oom_killer",
        r"Out of memory: Kill(?:ed)? process|oom-kill|oom_kill|OOM Killed|Out Of Memory\s*$|"
        r"Some of your processes may have been killed by the cgroup out-of-memory handler|"
        r"(?:^|[\]\s|:>])(?:Killed|已杀死)\s*$|task \d+: Out Of Memory|Memory cgroup out of memory|"
        r"[Ee]xceeded (?:job |step )?"
        r"memory limit|is killed by signal: Killed|invoked oom-killer|exit (?:code|status) 137\b|OOMKilled|"
        r"The node was low on resource: memory|killed due to memory pressure|\b\d+ Killed\s{2,}\S",
        "host_oom",
        _SYS,
        transient=False,
        anchors=("oom", "OOM", "Out of memory", "Out Of Memory", "Killed", "已杀死", "memory", "137"),
    ),
    Signature(
        "shm_bus_error",
        r"Unexpected bus error encountered in worker|insufficient shared memory \(shm\)|: Bus error\b|"
        r"Caught signal 7 \(Bus error|"
        r"DataLoader worker \(pid.*\) is killed by signal: Bus error|"
        r"DataLoader worker \(pid\(s\) [\d, ]+\) exited unexpectedly",
        "process_crash",
        _SYS,
        transient=False,
    ),
    # A binary built for instructions this CPU lacks (a prebuilt wheel using AVX): the job's build, not the node.
    Signature(
        "illegal_instruction",
        r"Illegal instruction \(core dumped\)|Fatal Python error: Illegal instruction|"
        r"(?:killed by|received|terminated by|got) signal SIGILL|Signals\.SIGILL",
        "illegal_instruction",
        _APP,
        transient=False,
        anchors=("Illegal instruction", "SIGILL"),
    ),
    Signature(
        "segfault",
        r"Segmentation fault|SIGSEGV|segfault at|Signals\.SIGSEGV|Fatal Python error: (?:Aborted|Bus error)|"
        r"Unexpected segmentation fault encountered in worker",
        "segfault",
        _SYS,
    ),
    Signature(
        "sigabrt",
        r"SIGABRT|Aborted\s+\(core dumped\)|\bAborted \(core dumped\)",
        "process_crash",
        _SYS,
        anchors=("SIGABRT", "Aborted"),
    ),
    Signature(
        "ray_worker_died",
        r"The actor is dead because its worker process has died|RayActorError|Worker exit type: SYSTEM_ERROR",
        "process_crash",
        _SYS,
        transient=True,
    ),
    Signature(
        "host_kernel_panic",
        r"Kernel panic|kernel BUG at",
        "host_kernel",
        _SYS,
        transient=True,
        anchors=("Kernel panic", "kernel BUG"),
    ),
    # The node's kernel is struggling (a CPU stuck, a task blocked in the kernel, a file server gone): real
    # trouble, but jobs often ride it out (soft lockups while a large checkpoint is written) — a notice;
    # the hang detector decides whether the job stopped.
    Signature(
        "host_kernel_trouble",
        r"soft lockup - CPU#\d+ stuck|blocked for more than \d+ seconds|task:\S+\s+state:D stack:|"
        r"nfs: server \S+ not responding|LustreError: .*(?:timed out|evicted)|Lustre: .*(?:lost|evict)",
        "host_kernel",
        _SYS,
        kind="node_unhealthy",
        severity="warning",
        storm=1,
        notice=True,
    ),
    # Kubernetes evicts a pod when its node runs short (memory has its own signature above).
    Signature(
        "pod_evicted",
        r"The node had condition: \[(?:DiskPressure|PIDPressure|MemoryPressure)\]|"
        r"The node was low on resource: (?:ephemeral-storage|pids)",
        "job_evicted",
        _SYS,
        transient=True,
        anchors=("node had condition", "low on resource"),
    ),
    # --- Scheduler -------------------------------------------------------------------------------------------
    Signature(
        "slurm_node_fail",
        r"DUE TO NODE FAILURE|NODE_FAIL|(?:srun|salloc|sbatch): error: Node failure on",
        "node_fail",
        _HW,
    ),
    # Slurm could not start the job's processes on a node (its spool, its credentials, its daemon).
    Signature(
        "slurm_launch_failed",
        r"slurmstepd: error: execve\(\)|srun: error: Task launch for \S+ failed on node|"
        r"failed on node \S+: Job credential expired|slurmstepd: error: [^\n]{0,200}?(?:setup failed|prolog failed)",
        "job_launch_failed",
        _SYS,
        transient=True,
        anchors=("slurmstepd", "Task launch", "credential"),
    ),
    # Slurm could not kill the job's processes (stuck in the kernel: a driver or a filesystem): it drains
    # the node itself.
    Signature(
        "slurm_unkillable",
        r"STEPD TERMINATED ON \S+ AT \S+ DUE TO JOB NOT ENDING WITH SIGNALS|node\(s\)=\S+: Kill task failed",
        "process_crash",
        _SYS,
        transient=False,
        anchors=("STEPD TERMINATED", "Kill task failed"),
    ),
    Signature(
        "slurm_cancelled",
        r"CANCELLED AT \S+ DUE TO (?:TIME LIMIT|PREEMPTION|JOB REQUEUE)",
        "job_cancelled",
        _SYS,
        severity="error",
    ),
    # --- Numerics --------------------------------------------------------------------------------------------
    Signature(
        "nan_loss",
        # The loss's own value: the gap may not run into the next metric (``grad_norm 1.03 (nan)`` is an
        # AMP running average that a skipped step made NaN, not the loss).
        # (Not a best/min/previous loss initialised to inf, nor early stopping's "(inf --> 0.68)".)
        # Each alternative starts with its word (the look-behinds follow it), so a search skips to the
        # word instead of trying every position: Megatron prints "lm loss" and "nan" on every step.
        r"(?i:loss(?<!\wloss)(?<!best loss)(?<!min loss)(?<!prev loss)(?:(?!grad|norm\b)[^|]){0,40}?"
        r"\b(?:nan|inf)\b(?! -->))|"
        r"(?i:grad[ _]norm\W{0,3}(?:nan|inf)\b)|"
        r"(?i:\b(?=\w*loss\W)(?<!best )(?<!min )(?<!prev )(?!(?:best|min|prev|lowest)_)\w*loss"
        r"(?:\W{1,3}|[:=]?\s{1,12})(?:nan|inf)\b(?! -->))|"
        r"Model diverged with loss = NaN|NanLossDuringTrainingError|(?i:loss is (?:nan|inf))|"
        r"Loss became infinite or NaN|(?i:non-finite (?:loss|grad))|is non-finite|Inf/NaN|NaN/Inf|"
        r"found NaN in|returned nan values in its \d+\w\w output|"
        r"(?i:(?:output(?<!\woutput)s?|logit(?<!\wlogit)s|prediction(?<!\wprediction)s?) (?:is|are|became) nan\b)|"
        r"[Ll]oss scale already at minimum|Minimum loss scale reached|Training has diverged|"
        r"(?i:detected (?:nan|inf)\b)|(?i:nan or inf found)",
        "nan_loss",
        _APP,
        kind="numerics",
        transient=False,
        anchors=(
            "nan",
            "NaN",
            "inf",
            "Inf",
            "NAN",
            "INF",
            "non-finite",
            "Non-finite",
            "diverged",
            "NanLoss",
            "Minimum loss scale",
            "loss scale already",
            "found NaN",
        ),
    ),
    # The dynamic loss scaler gave up: the scale fell below one, so every step overflows.
    Signature(
        "loss_scale_collapse",
        r"(?:reducing (?:loss scale )?to|loss_scale\s*:)\s*(?:0\.\d+|\d(?:\.\d+)?e-\d+|[\d.]*[a-f][\w.]*-\d{2,})\b|"
        r"[Aa]ttempted loss scale: [01], reducing to [01]\b",
        "nan_loss",
        _APP,
        kind="numerics",
        transient=False,
        anchors=("reducing", "loss_scale", "loss scale"),
    ),
    Signature(
        "loss_scale_overflow",
        r"OVERFLOW! Rank \d+ Skipping step|Gradient overflow\.\s+Skipping step",
        "nan_loss",
        _APP,
        kind="numerics",
        severity="warning",
        storm=20,
        storm_window_s=600,
    ),
    # --- Host / PCIe -------------------------------------------------------------------------------------------
    Signature(
        "pcie_aer_corrected",
        r"AER: Corrected error|PCIe Bus Error: severity=Corrected",
        "pcie_aer",
        _HW,
        kind="gpu_degraded",
        severity="warning",
        storm=50,
        storm_window_s=60,
    ),
    # Late in the table, so that a line naming a real failure too (an ECC code beside it) is read as that.
    # NVLink status reports (dcgmi's link table, DCGM's NVLink watch, NHC, NVML's "all links are
    # inActive") are told, never acted on: a PCIe GPU without NVLink hardware reports every link
    # down, and SXM links are down for a while after every boot while they train (NVIDIA/NVSentinel
    # #1481 and #1701: 214 of 288 GB200 nodes "down" in 3.5 weeks, none faulty). A link that fails
    # under a job shows as Xid 74, an uncorrectable NVLink error or NCCL failing, all acted on.
    Signature(
        "nvlink_down",
        "^" + ENVELOPE + r"\s*(?:D\s+){4,}D\s*$|(?i:nvlink.*links? (?:is |are )?(?:all )?(?:down|inactive))\b|"
        r"NvLink link \d+ is currently down|\bDCGM_FR_NVLINK_DOWN\b",
        "nvlink_down",
        _HW,
        kind="gpu_degraded",
        severity="warning",
        storm=1,
        notice=True,
        anchors=("D ", "nvlink", "NVLink", "NvLink", "NVLINK"),
    ),
    # --- Last resort: an uncaught Python exception that no signature above explains is the
    # training script's own (the history step calls it persistent on a repeat).
    Signature(
        "python_exception",
        "^" + ENVELOPE + r"(?:[\w.]+\.)?(?P<exception>[A-Z]\w*(?:Error|Exception)): ",
        "python_exception",
        _APP,
        weak=True,
    ),
)

# Lines that look fatal but that no signature explains: kept, and reported as
# ``crash/unclassified`` when the job then stops or ends (never dropped silently).
FATAL_LOOKING = re.compile(
    "^" + ENVELOPE + r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::|$)|"
    r"terminate called after throwing|Assertion .* failed|\bFATAL\b|\bFatal error\b|Segmentation fault|"
    r"core dumped|exit(?:ed with)? (?:code|status)\s*[:=]?\s*[1-9]|\bpanic\b|Traceback \(most recent call last\)|"
    r"\bF\d{4} \d\d:\d\d:\d\d|"
    # The words runtimes, launchers and RPC layers use when a process or a peer is gone (measured on six
    # sets of real excerpts at first contact: 7 more failures kept, no healthy or noise excerpt flagged;
    # "ERROR … failed" was left out: monitoring agents print it about themselves).
    r"DEADLINE_EXCEEDED|\bUNAVAILABLE: |(?:^|[\s:>\]|])(?:Killed|Aborted)\s*$|"
    r"\bhas (?:failed|died|crashed|been killed)\b(?! to )|\bunexpectedly (?:disconnected|exited|terminated|died)\b|"
    r"\bwill (?:now )?(?:abort|terminate)\b|\bFAILED\b"
)

# Coarse families, as operators (and the excerpt benchmarks) group failures.
FAMILIES: dict[str, str] = {
    "nccl_timeout": "nccl_timeout",
    "collective_stall": "nccl_timeout",
    "gpu_health": "gpu_xid_hardware",
    "gpu_reset_required": "gpu_xid_hardware",
    "nccl_error": "nccl_error",
    "ib_link": "ib_link_error",
    "nic_degraded": "ib_link_error",
    "ecc_dbe": "ecc_error",
    "ecc_sbe_burst": "ecc_error",
    "host_memory_ecc": "ecc_error",
    "row_remap_pending": "ecc_error",
    "row_remap_failure": "ecc_error",
    "oom": "oom",
    "host_oom": "oom",
    "nan_loss": "nan_loss",
    "process_crash": "process_crash",
    "segfault": "process_crash",
    "illegal_instruction": "process_crash",
    "rendezvous": "process_crash",
    "job_cancelled": "process_crash",
    "collective_mismatch": "process_crash",
    "sxid": "gpu_xid_hardware",
    "gpu_lost": "gpu_xid_hardware",
    "gpu_init_failed": "gpu_xid_hardware",
    "gpu_missing": "gpu_xid_hardware",
    "gpu_contained_error": "gpu_xid_hardware",
    "pcie_fatal": "gpu_xid_hardware",
    "nvlink_down": "gpu_xid_hardware",
    "nvlink_error": "gpu_xid_hardware",
    "pcie_aer": "other",
    "host_kernel": "process_crash",
    "node_fail": "gpu_xid_hardware",
    "job_launch_failed": "process_crash",
    "job_evicted": "process_crash",
    "collnet_unavailable": "other",
    "dcgm_diag_failed": "gpu_xid_hardware",
    "cuda_environment": "cuda_error",
    "python_exception": "process_crash",
    "unclassified": "unknown",
}

# Cheap pre-filter: almost every line is progress or info. A line that contains none of these
# words (one Aho-Corasick pass, ~0.5 µs) and does not match PREFILTER_PATTERN skips the catalogue.
# tests/unit/detectors/test_catalogue.py checks that every case it knows passes the filter. A word that
# contains another word of the list adds nothing (matches overlap), so none is listed.
PREFILTER_WORDS: tuple[str, ...] = (
    "ABORT!!!",
    "AER",
    "Abort",
    "Allocator",
    "Assertion",
    "Attempting to allocate",
    "BAD TERMINATION",
    "BadAlloc",
    "Base lid",
    "Bus error",
    "CONTAINED",
    "CQ state",
    "CUBLAS",
    "CUDA",
    "CUDNN",
    "CUFFT",
    "CURAND",
    "CUSOLVER",
    "CUSPARSE",
    "Call to connect returned",
    "Cannot attach",
    "Caught signal",
    "ChildFailed",
    "CollNet",
    "CollectiveFingerPrint",
    "Connect",
    "Contained",
    "Container rank",
    "CoordinationService",
    "Couldn't get context",
    "CrashLoopBackOff",
    "CuDNN",
    "Cuda",
    "DCGM_HEALTH",
    "DUE TO",
    "DistNetwork",
    "DistStoreError",
    "Down",
    "Duplicate GPU",
    "EADDRINUSE",
    "ECC",
    "EDAC",
    "ERR!",
    "EXIT CODE",
    "Error in `",
    "Error: ",
    "EventType:8",
    "Evicted",
    "Exception: ",
    "Exit Code",
    "Exit code",
    "Fail - GPU",
    "Failed status",
    "Failed to allocate",
    "Failed to enable",
    "Fatal Python",
    "Flushed",
    "Force Terminated",
    "GPU is lost",
    "GPU lost",
    "GPU_IS_LOST",
    "GetKeyValue",
    "HIP",
    "Hardware Error",
    "Heartbeat",
    "IBV_",
    "Illegal instruction",
    "Kernel panic",
    "Killed",
    "Killing",
    "LAUNCH ERROR",
    "LOC_CATAS",
    "Link",
    "Lustre",
    "MPI_",
    "Machine check",
    "Memory cgroup",
    "MemoryError",
    "Monitored Barrier",
    "NAN",
    "NCCL",
    "NET/",
    "NETDEV",
    "NODE_FAIL",
    "NVIDIA driver",
    "NVIDIA-SMI",
    "NVLINK",
    "NVML",
    "NVRTC",
    "NV_ERR_NO_MEMORY",
    "NaN",
    "No NVIDIA",
    "No devices",
    "Node failure",
    "OFI",
    "OOM",
    "ORTE has lost",
    "OVERFLOW",
    "Out Of Memory",
    "Out of memory",
    "OutOfResources",
    "PORT_INIT",
    "PTX",
    "Per user-direction",
    "Physical",
    "Port module",
    "Process received signal",
    "RESET_REQ",
    "RESOURCE_EXHAUSTED",
    "RNR",
    "RayActorError",
    "Remote access",
    "Remote operation",
    "Rendezvous",
    "Resource exhausted",
    "ResourceExhausted",
    "RmInit",
    "Root Cause",
    "SHARP coll",
    "SIG",
    "STEPD TERMINATED",
    "SYSTEM_ERROR",
    "Segmentation",
    "Socket",
    "State:",
    "System memory low",
    "TCPStore",
    "Timed out",
    "Timeout",
    "UCX",
    "Unable to open device",
    "Warp",
    "Watchdog",
    "Worker group",
    "XID",
    "Xid",
    "XlaRuntime",
    "abort",
    "abric",
    "actor is dead",
    "allocate MR",
    "already in use",
    "arrived on time",
    "assert",
    "async event",
    "bad_alloc",
    "blocked for more",
    "bus error",
    "c10d",
    "cache blocks",
    "carrier",
    "check_hw_ib",
    "compatible with the current",
    "completion queue",
    "connectFullMesh",
    "corrupted",
    "create MR",
    "credential expired",
    "cuDNN",
    "cuFFT",
    "cuda",
    "death signal",
    "detected xid",
    "device handle",
    "died with",
    "diverged",
    "double free",
    "exit code",
    "exit status",
    "exitcode",
    "exited",
    "failed",
    "fallen off",
    "free(): invalid",
    "gloo",
    "health system",
    "hild process",
    "ibv_",
    "illegal",
    "infinite",
    "insufficient power",
    "invalid argument",
    "invalid configuration",
    "invalid device",
    "invalid resource",
    "invalid usage",
    "kernel BUG",
    "kernel execution",
    "kernel image",
    "killed by signal",
    "launch failure",
    "launch timed",
    "link",
    "loss scale",
    "loss_scale",
    "low on resource",
    "may be stuck",
    "memory limit",
    "memory pressure",
    "misaligned",
    "mismatch",
    "missing ranks",
    "mlx5",
    "mpirun",
    "nan",
    "ncclInvalid",
    "node had condition",
    "non-finite",
    "non-zero exit",
    "not responding",
    "not supported",
    "nvml",
    "nvrtc",
    "oom",
    "oordination service",
    "orrected",
    "out of memory",
    "out-of-memory",
    "overflow",
    "peer access",
    "peer process has unexpectedly",
    "physical",
    "polling HP CQ",
    "polling LP CQ",
    "present state",
    "probe routine",
    "protection error",
    "received by PID",
    "reducing",
    "refused",
    "reg_mr",
    "remainder of ranks",
    "remap",
    "remote access error",
    "rendezvous",
    "requires reset",
    "retired",
    "retry",
    "return code",
    "rev ff",
    "rm_init",
    "running low on memory",
    "segfault",
    "segmentation fault",
    "shared memory",
    "shm",
    "sigkill",
    "slurmstepd: error",
    "socket",
    "soft lockup",
    "srun: error",
    "state:D",
    "stream is capturing",
    "system not yet",
    "terminated with",
    "timed out",
    "too many resources",
    "unhealthy",
    "waiting for clients",
    "watchdog",
    "wc status",
    "xid error",
    "已杀死",
)
PREFILTER_PATTERN = re.compile(r"D\s+D\s+D|\b[Ii]nf\b|GPU\d")
