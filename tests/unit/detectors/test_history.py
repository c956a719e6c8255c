"""Attribution from history: lemon nodes, repeated GPU faults, application errors that come back."""

from __future__ import annotations

from trainguard.detectors.events import Anomaly
from trainguard.detectors.history import HistoryAttributor


def anomaly(
    job: str,
    ts: float,
    category: str = "cuda_launch_failure",
    layer: str = "application",
    transient: bool | None = False,
    nodes: tuple[str, ...] = ("n7",),
    gpus: tuple[str, ...] = (),
) -> Anomaly:
    return Anomaly(
        anomaly_id=f"{job}-{ts}",
        detected_at=ts,
        kind="crash",
        category=category,
        layer=layer,
        transient=transient,
        job_id=job,
        nodes=list(nodes),
        gpus=list(gpus),
    )


def test_a_node_failing_three_different_jobs_is_a_lemon():
    hist = HistoryAttributor()
    assert hist.revise(anomaly("1", 0.0)).layer == "application"
    assert hist.revise(anomaly("1", 100.0)).layer == "application"  # the same job again is not a second job
    assert hist.revise(anomaly("2", 200.0)).layer == "application"
    third = hist.revise(anomaly("3", 300.0))
    assert (third.layer, third.transient) == ("hardware", False) and "lemon" in third.evidence[-1]
    assert hist.revise(anomaly("4", 300.0, nodes=("n8",))).layer == "application"  # other nodes unaffected


def test_lemon_history_expires():
    hist = HistoryAttributor(window_s=3600.0)
    for i, job in enumerate(("1", "2")):
        hist.revise(anomaly(job, i * 10.0))
    assert hist.revise(anomaly("3", 10_000.0)).layer == "application"


def test_the_same_gpu_fault_twice_is_persistent_hardware():
    hist = HistoryAttributor()
    first = hist.revise(anomaly("1", 0.0, "xid_94", "hardware", True, gpus=("n1/3",)))
    assert first.transient is True  # a contained ECC error: restarting the application may be enough…
    second = hist.revise(anomaly("2", 500.0, "xid_94", "hardware", True, nodes=("n1",), gpus=("n1/3",)))
    assert second.transient is False  # …but not when it happens again on the same GPU
    other = hist.revise(anomaly("3", 600.0, "xid_94", "hardware", True, nodes=("n2",), gpus=("n2/3",)))
    assert other.transient is True


def test_an_application_error_back_after_a_restart_is_persistent():
    hist = HistoryAttributor()
    assert hist.revise(anomaly("5", 0.0, "rendezvous", "application", True, nodes=())).transient is True
    again = hist.revise(anomaly("5", 900.0, "rendezvous", "application", True, nodes=()))
    assert again.transient is False and "after a restart" in again.evidence[-1]
