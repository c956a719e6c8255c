"""The signature catalogue, one family at a time: message texts as the software prints them.

Each case is a line in the wording of the software that prints it (the NVIDIA driver,
PyTorch, NCCL, torchelastic, Slurm, the kernel, UCX, XLA …) with the category and
layer it must get. They guard the pre-filter and the order of the catalogue as
much as the patterns: a new signature that shadows an older one fails here.
"""

from __future__ import annotations

import json

import pytest

from tests.support.paths import FIXTURES
from trainguard.benchmarks.corpus import CORPUS_DIR, EXCERPTS_PATH
from trainguard.detectors.catalogue import CATALOGUE
from trainguard.detectors.signatures import family_of, looks_fatal, match_line

CASES = [
    # GPU lost, in its many wordings
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "xid_79", "hardware"),
    (
        "NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F)",
        "gpu_lost",
        "hardware",
    ),
    ("Unable to determine the device handle for GPU 0000:81:00.0: Unknown Error", "gpu_lost", "hardware"),
    (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover",
        "gpu_lost",
        "hardware",
    ),
    ("I1203 10:00:00.000 health.go:120] 'nvidia.com/gpu' device marked unhealthy: GPU-1a2b", "gpu_lost", "hardware"),
    ("slurmstepd: error: NVML: Failed to get usage(15): GPU is lost", "gpu_lost", "hardware"),
    ("GPU 00000000:3B:00.0: GPU requires reset", "gpu_lost", "hardware"),
    (
        "1c:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000] (rev ff)",
        "gpu_lost",
        "hardware",
    ),
    # Agents naming an Xid
    ("XidCriticalError: Xid=48 on Device=GPU-5c8e, the device will go unhealthy.", "xid_48", "hardware"),
    ("Processing event {Device:{Handle:0xc0} EventType:8 EventData:79 GpuInstanceId:0}", "xid_79", "hardware"),
    # NVIDIA's catalog decides layers: an application fault, a GSP firmware timeout, a cause named in the line
    ("NVRM: Xid (PCI:0000:1a:00): 13, Graphics Exception: ESR 0x57e7b0=0x81e0017", "xid_13", "application"),
    (
        "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response",
        "xid_119",
        "system",
    ),
    (
        "NVRM: Xid (PCI:0000:9b:00): 45, pid=7, name=python, Ch 00000008 caused by previous Xid 149",
        "xid_149",
        "hardware",
    ),
    ("nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b}", "sxid", "hardware"),
    # Driver / runtime without GPUs: system software
    ("Failed to initialize NVML: Driver/library version mismatch", "gpu_missing", "system"),
    ("RuntimeError: CUDA error: no CUDA-capable device is detected", "gpu_missing", "system"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "gpu_missing", "system"),
    # PCIe
    (
        "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer",
        "pcie_fatal",
        "hardware",
    ),
    # ECC
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ecc_dbe", "hardware"),
    (
        "[  511.304636] EDAC MC0: 1 CE single-symbol chipkill ECC on P0_Node0_Channel5_Dimm0",
        "host_memory_ecc",
        "hardware",
    ),
    # CUDA, the application's own
    (
        "../aten/src/ATen/native/cuda/Indexing.cu:1284: indexSelectLargeIndex: block: [5,0,0], thread: [64,0,0] "
        "Assertion `srcIndex < srcSelectDimSize` failed.",
        "cuda_device_assert",
        "application",
    ),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_device_assert", "application"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_illegal_address", "application"),
    ("RuntimeError: CUDA error: invalid configuration argument", "cuda_illegal_address", "application"),
    (
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "cuda_arch_mismatch",
        "application",
    ),
    (
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa)`",
        "cuda_library_error",
        "application",
    ),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", "cuda_environment", "system"),
    ("RuntimeError: CUDA error: initialization error", "cuda_environment", "system"),
    # OOM: the job's own (device) and the host's
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", "oom", "application"),
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406 bytes.",
        "oom",
        "application",
    ),
    ("h100-1:2607512:4363182 [3] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'", "oom", "application"),
    ("[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB", "host_oom", "system"),
    ("slurmstepd: error: Detected 1 oom-kill event(s) in step 3495064.0 cgroup.", "host_oom", "system"),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.", "host_oom", "system"),
    ("Killed", "host_oom", "system"),
    # NCCL and torch.distributed
    (
        "[rank1]:[E1002 18:16:40.662 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600000 milliseconds",
        "nccl_timeout",
        "system",
    ),
    ("[E ProcessGroupNCCL.cpp:488] Some NCCL operations have failed or timed out.", "nccl_timeout", "system"),
    (
        "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 5 Rank 0] Heartbeat monitor timed out! Process will be terminated",
        "nccl_timeout",
        "system",
    ),
    ("RuntimeError: Timed out initializing process group in store based barrier on rank: 7", "nccl_timeout", "system"),
    (
        "gpu-1:93598:49225 [5] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<17943> failed : "
        "Software caused connection abort",
        "nccl_error",
        "system",
    ),
    ("include/shm.h:28 NCCL WARN Call to posix_fallocate failed: No space left on device", "nccl_error", "system"),
    (
        "node-231:42367:42367 [1] transport/nvls.cc:254 NCCL WARN Cuda failure 401 'the operation cannot be performed'",
        "nccl_error",
        "system",
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error",
        "nccl_error",
        "system",
    ),
    # Every thread we hold blames the launch or the library build (ranks pinned to one GPU, a mismatched NCCL).
    ("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", "nccl_error", "system"),
    (
        "RuntimeError: ProcessGroupWrapper: Monitored Barrier encountered error running collective",
        "collective_mismatch",
        "application",
    ),
    (
        "[W506 00:43:56.240 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=3): Connection reset by peer",
        "rendezvous",
        "system",
    ),
    (
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store "
        "has failed.",
        "rendezvous",
        "system",
    ),
    (
        "[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to "
        "(10.0.0.1, 29500)",
        "rendezvous",
        "system",
    ),
    # InfiniBand / RoCE: the physical link (hardware) and the fabric's software (system)
    (
        "ib_mlx5_log.c:139  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81 hw_synd 0/0)",
        "ib_link",
        "hardware",
    ),
    (
        "trn-83:5067:8933 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.197.7.83<54862> with "
        "status=12 opcode=0 len=0 vendor err 129",
        "ib_link",
        "hardware",
    ),
    ("NCCL WARN NET/IBP : Got completion with error 5, opcode 0, len 0, vendor err 249", "ib_link", "hardware"),
    ("NCCL WARN NET/IB : Got async event : local catastrophic error", "ib_link", "hardware"),
    ("mlx5_core 0000:3b:00.0 ibp59s0: Link down", "ib_link", "hardware"),
    ("        Physical state: Polling", "ib_link", "hardware"),
    ("mlx5_core 0000:03:00.0: Port module event: module 0, Cable unplugged", "ib_link", "hardware"),
    (
        "gpu-1:165099:194770 [0] misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Network is "
        "unreachable",
        "ib_link",
        "system",
    ),
    # Process deaths
    (
        "E0813 06:19:49.809000 161210 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 2 (pid: 829535) of binary: /usr/bin/python3",
        "process_crash",
        "system",
    ),
    (
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL",
        "process_crash",
        "system",
    ),
    ("srun: error: node-3: task 289: Bus error", "process_crash", "system"),
    ("Fatal Python error: Segmentation fault", "segfault", "system"),
    (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR",
        "process_crash",
        "system",
    ),
    (
        "slurmstepd: error: *** JOB 867816 ON hgx-1175 CANCELLED AT 2021-05-11T12:06:17 DUE TO TIME LIMIT ***",
        "job_cancelled",
        "system",
    ),
    ("srun: error: Node failure on node-17", "node_fail", "hardware"),
    ("watchdog: BUG: soft lockup - CPU#12 stuck for 22s! [python:4242]", "host_kernel", "system"),
    # Numerics
    (
        "04/24 02:03:38 - mmengine - INFO - Epoch(train) [17][ 50/290] grad_norm: nan  loss: 209.1800",
        "nan_loss",
        "application",
    ),
    ("FloatingPointError: Loss became infinite or NaN at iteration=1234!", "nan_loss", "application"),
    ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.00390625", "nan_loss", "application"),
    # Host memory in words the GPU-memory signatures would otherwise claim (Ray, C++ allocators)
    (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "host_oom",
        "system",
    ),
    ("terminate called after throwing an instance of 'std::bad_alloc'", "host_oom", "system"),
    ("a non-zero exit code. Per user-direction, the job has been aborted.", "process_crash", "system"),
    (
        "E1027 15:10:59.012564 3266428 cuda_dnn.cc:456] Loaded runtime CuDNN library: 9.10.1 but source was "
        "compiled with: 9.13.1.  CuDNN library needs to have matching major version",
        "cuda_environment",
        "system",
    ),
    # Third pass (sets 4a/4b): Slurm could not launch, a node failure seen by salloc, the driver out of
    # memory, Gloo's timeout, cuBLAS's own error wording, XLA reserving memory
    (
        "slurmstepd: error: execve(): /tmp/slurmd/job00089/slurm_script: No such file or directory",
        "job_launch_failed",
        "system",
    ),
    ("srun: error: Task launch for 36.0 failed on node cn207: Job credential expired", "job_launch_failed", "system"),
    ("salloc: error: Node failure on worker-1", "node_fail", "hardware"),
    ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY]", "host_oom", "system"),
    (
        "[rank2]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
        "waiting 1800000ms for recv operation to complete",
        "nccl_timeout",
        "system",
    ),
    ("cuBLAS API failed with status 15", "cuda_library_error", "application"),
    # Sets 5a/5b: CUDA error 2 by number (Caffe, Lua Torch), CuPy's and vLLM's OOM, Paddle's device assert,
    # cuFFT, Triton out of shared memory, a worker's segfault, a CPU without the wheel's instructions
    (
        "F0903 14:31:26.106397 92421 syncedmem.cpp:56] Check failed: error == cudaSuccess (2 vs. 0)  out of memory",
        "oom",
        "application",
    ),
    (
        "THCudaCheck FAIL file=/tmp/cutorch/lib/THC/generic/THCStorage.cu line=66 error=2 : out of memory",
        "oom",
        "application",
    ),
    (
        "Exception in main training loop: out of memory to allocate 205520896 bytes (total 16068929536 bytes)",
        "oom",
        "application",
    ),
    (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        "oom",
        "application",
    ),
    (
        "Error: /paddle/paddle/phi/kernels/gpu/bce_loss_kernel.cu:42 "
        "Assertion `(x >= static_cast<T>(0)) && (x <= one)` failed. Input is expected to be within the interval "
        "[0, 1], but received nan.",
        "cuda_device_assert",
        "application",
    ),
    ("RuntimeError: cuFFT error: CUFFT_INTERNAL_ERROR", "cuda_library_error", "application"),
    ("{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 5e-05, 'epoch': 0.54}", "nan_loss", "application"),
    (
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 65536.",
        "cuda_error",
        "application",
    ),
    ("ERROR: Unexpected segmentation fault encountered in worker.", "segfault", "system"),
    ("Illegal instruction (core dumped)", "illegal_instruction", "application"),
    # Set 5a: RDMA keys and registrations, NVML through a device plugin, Horovod's NCCL call, TensorFlow's
    # kernel launch out of memory, Ray's memory monitor, JAX's coordination service, pod eviction, CUDA's
    # contained error in words
    (
        "[vegas06:14879:0] dc_verbs.c:614  UCX  ERROR Send completion with error on qp 0x6214: remote access error "
        "syndrome 0x88",
        "ib_link",
        "system",
    ),
    ("  Failed status 4: wr_id 0 syndrom 0x51", "ib_link", "system"),
    ("Couldn't allocate MR", "ib_link", "system"),
    (
        "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: unable to get device link "
        "information: error calling nvml.Init: Unknown Error, which is unexpected",
        "gpu_missing",
        "system",
    ),
    (
        "horovod.common.exceptions.HorovodInternalError: ncclAllReduce failed: unhandled cuda error",
        "nccl_error",
        "system",
    ),
    (
        "Non-OK-status: GpuLaunchKernel (FillPhiloxRandomKernelLaunch <Distribution>, num_blocks, block_size, 0, "
        "d.stream (), gen, data, size, dist) status: Internal: out of memory",
        "oom",
        "application",
    ),
    (
        "(raylet) node_manager.cc:2963: System memory low at node with IP 172.17.0.2. Used memory (23.63GB) / total "
        "capacity (33.28GB) (0.709971) exceeds threshold 0.7, killing latest task with name Leaker.__init__",
        "host_oom",
        "system",
    ),
    ("RPC: /tensorflow.CoordinationService/RegisterTask", "rendezvous", "system"),
    ("  Warning  Evicted    <invalid>  kubelet  The node had condition: [DiskPressure].", "job_evicted", "system"),
    (
        "torch.AcceleratorError: CUDA error: Invalid access of peer GPU memory over nvlink or a hardware error",
        "gpu_contained_error",
        "hardware",
    ),
    # Sets 6a/6b: MPI runtimes, heap corruption, JAX's coordination service and key-value exchange, Paddle's
    # launcher, Gloo, Kubernetes crash loops, NCCL's bootstrap retries (a storm), DCGM diagnostics, NVRTC
    ("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "process_crash", "system"),
    ("An MPI communication peer process has unexpectedly disconnected.  This", "process_crash", "system"),
    ("ORTE has lost communication with a remote daemon.", "process_crash", "system"),
    ("*** An error occurred in MPI_Init_thread", "process_crash", "system"),
    (
        "*** Error in `python': malloc(): smallbin double linked list corrupted: 0x00007f9dfc2cc060 ***",
        "process_crash",
        "system",
    ),
    (
        "E external/xla/xla/pjrt/distributed/client.cc:96] Coordination service agent in error status: "
        "DEADLINE_EXCEEDED: Deadline Exceeded",
        "rendezvous",
        "system",
    ),
    (
        "Execution of replica 0 failed: DEADLINE_EXCEEDED: GetKeyValue() timed out with key: devices=[0,1]",
        "nccl_timeout",
        "system",
    ),
    ("LAUNCH ERROR 2022-11-21 02:35:54,385 Container failed !!!", "process_crash", "system"),
    (
        "[rank8]:[E ProcessGroupGloo.cpp:144] Gloo connectFullMesh failed with [pair.cc:144] no error",
        "rendezvous",
        "system",
    ),
    (
        "pytorchjob-example-82cjcqdz-master-0         0/2     CrashLoopBackOff   8          2m32s",
        "process_crash",
        "system",
    ),
    ("ValueError:Network outputs is NAN! Stop Training", "nan_loss", "application"),
    ("RuntimeError: nvrtc: error: invalid value for --gpu-architecture (-arch)", "cuda_environment", "system"),
    ("|                           | Fail - GPU: 0                                  |", "dcgm_diag_failed", "hardware"),
    (
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to [::ffff:10.0.0.7]:29500 "
        "(errno: 110 - Connection timed out).",
        "rendezvous",
        "system",
    ),
    (
        "E tensorflow/compiler/xla/xla_client/xla_util.cc:88]   (1) RESOURCE_EXHAUSTED: Attempting to reserve 6.48G "
        "at the bottom of memory. That was not possible. There are 6.78G free, 0B reserved, and 3.33G reservable.",
        "oom",
        "application",
    ),
    # Set 7b: the kernel's older OOM-killer wording, autograd's anomaly mode, Paddle's NCCL wording, a
    # DataLoader worker that died (shared memory, by the threads' diagnoses).
    ("[3017506.733819] Out of memory: Kill process 31862 (python) score 974 or sacrifice child", "host_oom", "system"),
    ("RuntimeError: Function 'SolveBackward' returned nan values in its 0th output.", "nan_loss", "application"),
    (
        "OSError: (External)  Nccl error, unhandled cuda error  "
        "(at /paddle/paddle/fluid/platform/collective_helper.cc:100)",
        "nccl_error",
        "system",
    ),
    ("RuntimeError: DataLoader worker (pid(s) 31) exited unexpectedly", "process_crash", "system"),
    # Set 7a: host memory as the machine-check decoder prints it, DCGM's health watches, nvidia-smi's ERR!,
    # UCX's transport errors (the fabric's software), JAX's coordination barrier.
    ("kernel: [Hardware Error]: Error Status: Uncorrected, software restartable error.", "host_memory_ecc", "hardware"),
    ("kernel: EDAC amd64 MC1: CE ERROR_ADDRESS= 0xf075b2410", "host_memory_ecc", "hardware"),
    (
        "ERROR [1514002:1514004] [[Health]] Detected a WARNING in health system Thermal: 'Detected clocks event",
        "gpu_health",
        "hardware",
    ),
    (
        "|ERR!   68C    P2             99W /  130W |       1MiB /  20475MiB |     93%      Default |",
        "gpu_health",
        "hardware",
    ),
    (
        "[cn1364:318457:0]      ib_mlx5_dv.c:430  UCX  ERROR   mlx5dv_devx_obj_create(QP) failed on mlx5_0, "
        "syndrome 0x2c4154: Remote I/O error",
        "ib_link",
        "system",
    ),
    ("[c512-027:613829:0:613829] ib_mlx5_log.c:179  Remote operation error on mlx5_0:1/IB", "ib_link", "system"),
    (
        "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: PjRT_Client_Connect.",
        "nccl_timeout",
        "system",
    ),
    # Set 8a: ibv_devinfo's PORT_INIT, Open MPI's openib queues, the driver asking for a reset, edac-util and
    # NHC, Slurm unable to kill a step.
    ("    state:    PORT_INIT (2)", "ib_link", "system"),
    (
        "[rc013][[5397,1],43][btl_openib.c:222:adjust_cq] cannot resize completion queue, error: 16",
        "ib_link",
        "system",
    ),
    (
        "[373871.354096] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
        "(0x00000062) returned from status @ kernel_channel.c:2827",
        "gpu_reset_required",
        "hardware",
    ),
    (
        "[2020-12-14T09:44:56.002] [63532.0] error: *** STEP 63532.0 STEPD TERMINATED ON cn117 AT "
        "2020-12-14T09:44:56 DUE TO JOB NOT ENDING WITH SIGNALS ***",
        "process_crash",
        "system",
    ),
    # Set 8b: Paddle's launcher, XLA's device buffer.
    (
        "ERROR 2021-05-24 17:17:14,611 launch_utils.py:545] ABORT!!! Out of all 4 trainers, the trainer process "
        "with rank=[3] was aborted. Please check its log.",
        "process_crash",
        "system",
    ),
    (
        "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
        "allocate 196.00M. That was not possible. There are 134.44M free.",
        "oom",
        "application",
    ),
]


@pytest.mark.parametrize(
    ("line", "notice"),
    [
        ("kernel: [Hardware Error]: Error Status: Corrected error, no action required.", True),
        ("[  511.304636] EDAC MC0: 1 CE single-symbol chipkill ECC on P0_Node0_Channel5_Dimm0", True),
        ("EDAC MC0: 1 UE multi-symbol chipkill ECC on P0_Node0_Channel5_Dimm0", False),
        ("[Hardware Error]: Error Status: Uncorrected, software containable error.", False),  # AMD's decoder
        ("mce: [Hardware Error]: System Fatal error.", False),
    ],
)
def test_a_corrected_host_memory_error_is_told_and_an_uncorrected_one_takes_the_node_out(
    line: str, notice: bool
) -> None:
    found = match_line(line)
    assert found is not None and found.signature.category == "host_memory_ecc"
    assert (found.signature.notice, found.signature.severity) == ((True, "warning") if notice else (False, "fatal"))


@pytest.mark.parametrize(
    ("line", "layer"),
    [
        ("\t\tPhysical state: Polling", "hardware"),  # no light: a cable, a port
        ("mlx5_core 0000:0c:00.1: Port module event: module 1, Cable unplugged", "hardware"),  # an empty cage
        ("\t\tPhysical state: Disabled", "system"),  # an administrator's choice
        ("\t\t\tstate:\t\t\tPORT_INIT (2)", "system"),  # linked, no subnet manager
        ("mlx5_0 port 1 ==> ibp26s0 (Down)", "system"),
        (
            "ERROR:  nhc:  Health check failed:  check_hw_ib:  No IB port mlx5_0:1 is ACTIVE (LinkUp 200 Gb/sec).",
            "system",
        ),
    ],
)
def test_a_port_shown_down_by_a_status_dump_is_told_never_acted_on(line: str, layer: str) -> None:
    """ibstat and friends list every port, and nodes have ports down by design (an unused second port)."""
    m = match_line(line)
    assert m is not None and (m.signature.category, m.signature.layer) == ("ib_link", layer)
    assert (m.signature.notice, m.signature.kind) == (True, "node_unhealthy")
    assert match_line("\t\tState: Down") is None  # the physical state line that follows says which


@pytest.mark.parametrize(
    "line",
    [
        "        D D D D D D D D D D D D D D D D D D",  # dcgmi nvlink -s, one GPU's row
        "|                           | GPU 0's NvLink link 0 is currently down   |",  # dcgmi diag on a PCIe GPU
        "errorCode: DCGM_FR_NVLINK_DOWN",  # DCGM's NVLink watch, after every SXM boot too
        "NVML: Unable to retrieve NVLink information as all links are inActive",
        "ERROR:  nhc:  Health check failed:  check_nvlink_status: GPU 0 has nvlinks inactive:     Link 4: Inactive",
    ],
)
def test_an_nvlink_status_report_is_told_never_acted_on(line: str) -> None:
    """PCIe GPUs without NVLink report every link down, and SXM links are down while they train after a boot."""
    m = match_line(line)
    assert m is not None and (m.signature.category, m.signature.layer) == ("nvlink_down", "hardware")
    assert (m.signature.notice, m.signature.kind, m.signature.remedy) == (True, "gpu_degraded", None)
    failing = match_line("RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution")
    assert failing is not None and not failing.signature.notice  # a link that fails under a job is acted on
    assert (failing.signature.category, failing.signature.layer, failing.signature.transient) == (
        "nvlink_error",
        "hardware",
        False,
    )


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("errors: DCGM_FR_NVLINK_DOWN Detected 1 uncorrectable ECC error", "ecc_dbe"),
        (
            "mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
            "ib_link",
        ),
    ],
)
def test_a_line_that_names_a_real_failure_beside_a_status_is_read_as_the_failure(line: str, category: str) -> None:
    m = match_line(line)
    assert m is not None and m.signature.category == category and not m.signature.notice


@pytest.mark.parametrize(
    "line",
    [
        "ucp_ep.c:1224 UCX  ERROR ep 0x7f: error 'Connection reset by remote peer' on CM lane will not be handled "
        "since no error callback is installed",  # part of a peer's normal close
        "W bfc_allocator.cc:246] Allocator (GPU_0_bfc) ran out of memory trying to allocate 34.00GiB with "
        "freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be "
        "performance gains if more memory were available.",
        "best_val_loss: inf",
        "[rank0]: best_eval_loss: inf",
        "min_val_loss = inf",
        "Best loss: inf",
        "Validation loss decreased (inf --> 0.685432).  Saving model ...",
        "   Reason=Kill task failed [root@2024-05-01T10:00:00]",  # scontrol's record of an earlier drain
        "mc0: csrow2: 1 Corrected Errors",  # edac-util's count since boot
    ],
)
def test_healthy_lines_that_look_like_failures_match_nothing(line: str) -> None:
    assert match_line(line) is None


@pytest.mark.parametrize(
    ("line", "category", "layer", "notice"),
    [
        (
            "[n1][[51298,1],2][btl_openib_component.c:3496:handle_wc] from n1 to: n2 error polling LP CQ with status "
            "RETRY EXCEEDED ERROR status number 12 for wr_id 0x5a1 opcode 0  vendor error 129 qp_idx 0",
            "ib_link",
            "hardware",
            False,
        ),
        ("mc0: 2 Uncorrected Errors with no DIMM info", "host_memory_ecc", "hardware", False),
        (
            "check_hw_mcelog:  MCEs detected - 3 UNcorrected memory errors detected (limit of 0/day).",
            "host_memory_ecc",
            "hardware",
            False,
        ),
        (
            "check_hw_edac:  ECC errors detected - 31 corrected memory errors detected (limit of 9).",
            "host_memory_ecc",
            "hardware",
            True,
        ),
    ],
)
def test_counts_and_statuses_of_real_faults(line: str, category: str, layer: str, notice: bool) -> None:
    m = match_line(line)
    assert m is not None and (m.signature.category, m.signature.layer, m.signature.notice) == (category, layer, notice)


def test_the_decoders_header_line_alone_does_not_say_whether_the_error_was_corrected() -> None:
    assert match_line(" kernel:[Hardware Error]: MC4 Error (node 3): DRAM ECC error detected on the NB.") is None


@pytest.mark.parametrize(("line", "category", "layer"), CASES, ids=[c[1] + ":" + c[0][:40] for c in CASES])
def test_real_wordings_get_their_category_and_layer(line: str, category: str, layer: str) -> None:
    m = match_line(line)
    assert m is not None, f"no signature for {line!r}"
    assert (m.signature.category, m.signature.layer) == (category, layer), m.signature.id


LOOK_ALIKES = [
    "[   11.097374] mlx5_core 0004:01:00.0: Port module event: module 0, Cable plugged",
    "hgx-3835:376990:142970 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]",
    "compute-856:22941:22941 [0] NCCL INFO NET/IB : No device found.",
    "hgx-3515:14145:46770 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.",
    "                State: Active",
    "                Physical state: LinkUp",
    "[W924 02:01:18.426 ProcessGroupNCCL.cpp:981] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is the default now",
    "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] step=40, skipped=2, lr=[5e-05]",
    "| Training Device=xla:1/0 Epoch=1 Step=500 Loss=0.00223 Rate=553.79 GlobalRate=349.32 Time=01:53:18",
    "{'loss': 0.0923, 'grad_norm': 2.383980345174379, 'learning_rate': 9.7e-05, 'epoch': 0.38}",
    "Saving checkpoint to /ckpt/global_step2000",
    "iteration     3383/    8000 | lm loss: 7.334521E-01 | grad norm: 0.752 | number of nan iterations:   0 |",
    # Slurm could not enter the submit directory and works from /tmp instead.
    "slurmstepd: error: couldn't chdir to `/root/burst-buffer': No such file or directory: going to /tmp instead",
    # An AMP running average made NaN by a skipped step, next to a finite loss (Swin's meter format).
    "INFO Train: [0/300][4050/5004]   eta 0:17:06 lr 0.000500 time 1.1737 (1.0765)    loss 3.2572 (3.3279)    "
    "grad_norm 1.0323 (nan)  mem 4814MB",
    # c10d tries an address family the host lacks (IPv6), warns, and connects over the next one.
    "[W socket.cpp:601] [c10d] The client socket has failed to connect to [node-a12]:22456 "
    "(errno: 22 - Invalid argument).",
    "[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:29500 "
    "(errno: 97 - Address family not supported by protocol).",
]


@pytest.mark.parametrize("line", LOOK_ALIKES)
def test_look_alikes_match_nothing(line: str) -> None:
    assert match_line(line) is None


def test_every_signature_has_a_known_layer_and_family() -> None:
    for sig in CATALOGUE:
        assert sig.layer in ("hardware", "system", "application", "unknown"), sig.id
        if sig.category != "xid":
            # "other" (noise, not a job failure): corrected PCIe errors, and lines recognised only so that they
            # are never taken for an unexplained failure (a warning with no storm size never raises an anomaly).
            evidence_only = sig.severity == "warning" and sig.storm == 0
            assert family_of(sig.category) != "other" or sig.category == "pcie_aer" or evidence_only, sig.id


def test_fatal_looking_lines_are_recognised_without_a_signature() -> None:
    assert looks_fatal("terminate called after throwing an instance of 'std::runtime_error'")
    assert looks_fatal("Traceback (most recent call last):")
    assert looks_fatal("F1203 10:00:00.123 trainer.cc:42] Check failed: ok")
    assert not looks_fatal("step 10 | loss 1.23 | 0.5 s/it")
    # How runtimes and RPC layers say a process or a peer is gone (no signature needed to keep the line).
    assert looks_fatal("Task /job:jax_worker/replica:0/task:3 has failed: heartbeat timeout")
    assert looks_fatal("E0412 client.cc:96] Coordination service agent in error status: DEADLINE_EXCEEDED")
    assert looks_fatal("the peer process unexpectedly disconnected")
    assert looks_fatal("Job 1 is already in terminal state FAILED_CONTROLLER") is False  # FAILED_… is one word
    assert looks_fatal("Worker group FAILED. 3/3 attempts left")
    # ... but a warning that an attempt failed is not: the client retries.
    assert not looks_fatal("[W socket.cpp:601] [c10d] The client socket has failed to connect to [node-a12]:22456")


def test_the_prefilter_and_anchors_never_hide_a_signature_from_a_real_line() -> None:
    """Every real line we hold (tune, the first excerpts, the fixture sets; never the holdout) gets the same
    signature through the pre-filter and the anchors as by trying every pattern in order."""
    paths = [FIXTURES / p.name for p in sorted(FIXTURES.glob("extra-real-logs*.jsonl"))]
    paths += [p for p in (CORPUS_DIR / "tune.jsonl", EXCERPTS_PATH) if p.is_file()]
    lines = [
        text for path in paths for row in path.read_text().splitlines() for text in json.loads(row)["text"].splitlines()
    ]
    assert len(lines) > 2000
    hidden = []
    for line in lines:
        raw = next((sig.id for sig in CATALOGUE if sig.regex.search(line)), None)
        found = match_line(line)
        got = None if found is None else found.signature.id
        # A matched Xid is refined to its code (nvrm_xid → nvrm_xid_79): still the same signature.
        if got != raw and not (raw is not None and got is not None and got.startswith(f"{raw}_")):
            hidden.append((raw, got, line[:100]))
    assert hidden == []


def test_a_fault_at_the_end_of_a_very_long_line_is_still_found() -> None:
    bar = "\r 45%|████▌     | 450/1000 [01:02<01:16,  7.19it/s]" * 3000  # ~150 KB of a progress bar on one line
    found = match_line(bar + "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert found is not None and found.signature.category == "cuda_illegal_address"
    assert match_line("LAUNCH ERROR " * 20_000) is None  # long repeated prefixes: clipped, no pathological scan


HOROVOD_STALL = (
    "[1,0]<stderr>:[2019-04-13 13:56:31.861697: W horovod/common/operations.cc:588] One or more tensors were "
    "submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks "
    "for more than 60 seconds."
)


@pytest.mark.parametrize(
    ("stalled_ops", "expected"),
    [(0, []), (2, [("straggler", "collective_stall", "warning")])],
    ids=["a lone warning (also seen in runs that finish)", "with the stalled ops it names"],
)
def test_horovods_stall_report_is_a_notice_when_it_names_its_stalled_ops(stalled_ops: int, expected: list) -> None:
    from trainguard.detectors.events import LogRecord
    from trainguard.detectors.monitor import JobMonitor

    mon = JobMonitor("7")
    lines = [HOROVOD_STALL] + [
        f"[1,0]<stderr>:HorovodBroadcast_dense_{i}_bias_0 [missing ranks: 1]" for i in range(stalled_ops)
    ]
    found = [
        a for i, line in enumerate(lines) for a in mon.observe(LogRecord(ts=10.0 + i, job_id="7", node="n1", line=line))
    ]
    assert [(a.kind, a.category, a.severity) for a in found] == expected


@pytest.mark.parametrize(
    ("line", "notice"),
    [
        ("Kernel panic - not syncing: Fatal exception in interrupt", False),
        ("watchdog: BUG: soft lockup - CPU#98 stuck for 22s! [python:24816]", True),  # jobs often ride it out
        ("INFO: task python3.11:24816 blocked for more than 120 seconds.", True),
        ("[  +0.000049] task:python3.11      state:D stack:    0 pid:24816 ppid: 24796 flags:0x00000002", True),
    ],
)
def test_a_node_kernel_in_trouble_is_a_notice_and_a_panic_is_a_crash(line: str, notice: bool) -> None:
    m = match_line(line)
    assert m is not None and (m.signature.category, m.signature.layer) == ("host_kernel", "system")
    assert (m.signature.notice, m.signature.kind) == ((True, "node_unhealthy") if notice else (False, "crash"))
