"""Where a job-level finding happened: the rank, GPU, node or NIC to blame.

The job-level detectors see the job's rhythm (every rank's step time is the slowest
rank's); what makes a finding actionable is naming the culprit from the evidence the
other detectors keep — per-rank compute scores, GPU peer comparison, GPU activity
during a stall, kernel lines about a NIC. These functions change the finding in place.
"""

from __future__ import annotations

from trainguard.detectors.findings import Finding
from trainguard.detectors.gpu_activity import Verdict
from trainguard.detectors.gpu_peers import GpuPeers
from trainguard.detectors.ids import gpu_id
from trainguard.detectors.rank_scores import RankScorer

NIC_EVIDENCE_S = 1800.0  # a NIC degradation this recent can explain a slowdown


def localise_straggler(
    f: Finding, ranks: RankScorer, gpus: GpuPeers, nic_warnings: dict[str, float], localise_below: float
) -> Finding:
    """A slow rank (its relative score), else a NIC the kernel said degraded, else the odd GPU out.

    >>> f = localise_straggler(Finding("straggler", "slow_job", "unknown", 0.0, 60.0), RankScorer(), GpuPeers(),
    ...                        {"n3": 30.0}, 0.9)
    >>> f.category, f.nodes
    ('slow_nic', ['n3'])
    """
    slowest = ranks.slowest()
    if slowest is not None and slowest[2] < localise_below:
        rank, node, score = slowest
        f.category, f.ranks, f.nodes, f.confidence = "slow_rank", [rank], [node], 0.85
        f.evidence.append(f"rank {rank} on {node} is slowest (relative score {score:.2f})")
        return f
    slow_nics = sorted(n for n, ts in nic_warnings.items() if f.onset_ts - NIC_EVIDENCE_S <= ts <= f.detected_at)
    if slow_nics:
        f.category, f.nodes, f.confidence = "slow_nic", slow_nics, 0.75
        f.evidence.append(f"NIC link degraded on {', '.join(slow_nics)} (kernel log)")
        return f
    odd = gpus.odd_one_out()
    if odd:
        f.category, f.confidence = "slow_gpu", 0.75
        f.nodes = sorted({node for node, _ in odd})
        f.gpus = [gpu_id(node, gpu) for node, gpu in odd]
        f.evidence.append(f"odd one out among the job's GPUs (clock, heat, power, throttling): {', '.join(f.gpus)}")
    return f


def localise_hang(
    f: Finding, gpus: GpuPeers, activity: Verdict | None, job_nodes: list[str], missing_after_s: float
) -> None:
    """GPUs that stopped reporting, else GPUs idle while their peers spin in NCCL kernels, else the job's nodes."""
    if f.nodes:
        return
    gone = [(node, gpu) for node, gpu, _ in gpus.missing(f.detected_at, missing_after_s)]
    idle = activity.suspects if activity is not None and activity.suspects else gpus.idle_while_peers_spin()
    suspects = gone or idle
    if suspects:
        f.nodes = sorted({node for node, _ in suspects})
        f.gpus = [gpu_id(node, gpu) for node, gpu in suspects]
        f.confidence = max(f.confidence, 0.75)
        why = "stopped reporting" if gone else "idle while peers spin in NCCL kernels"
        f.evidence.append(f"GPU {', '.join(f.gpus)} {why}")
    elif job_nodes:
        f.evidence.append(f"job nodes: {', '.join(job_nodes[:16])}")
