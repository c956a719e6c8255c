"""Every Xid code NVIDIA documents gets a layer and an action from NVIDIA's own resolution."""

from __future__ import annotations

import csv

import pytest

from tests.support.paths import THIRD_PARTY
from trainguard.actions.policy import Policy, PolicyConfig
from trainguard.detectors.events import GpuSample, LogRecord
from trainguard.detectors.gpu_health import GpuHealth
from trainguard.detectors.monitor import JobMonitor, NodeMonitor
from trainguard.detectors.signatures import family_of, match_line
from trainguard.detectors.xid import CATALOG_PATH, catalog, xid_info

XID_LOG = "../shared/datasets/nvidia-xid-catalog/dmesg-with-xid-119.log"


def _line(code: int) -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python, Ch 00000008"


def _actions(code: int) -> list[str]:
    mon = JobMonitor("9")
    mon.nodes = ["n1"]
    found = mon.observe(LogRecord(ts=100.0, job_id="9", node="n1", source="kernel", line=_line(code)))
    found += mon.end_of_input(200.0)
    policy = Policy(PolicyConfig())
    return sorted({x.action for a in found for x in policy.decide(a)})


def test_the_vendored_catalog_is_nvidias_whole_table() -> None:
    with CATALOG_PATH.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 172 == len(catalog())
    assert (CATALOG_PATH.parent / "xid-catalog.LICENSE").is_file()


def test_every_code_resolves_to_a_layer_and_an_action() -> None:
    for code, info in catalog().items():
        assert info.layer in ("hardware", "system", "application"), code
        m = match_line(_line(code))
        assert m is not None and m.signature.category == f"xid_{code}", code
        assert family_of(m.signature.category) in ("gpu_xid_hardware", "ecc_error")
        assert _actions(code) or info.evidence_only, f"Xid {code} ({info.immediate}) decided nothing"


@pytest.mark.parametrize(
    ("code", "resolution", "layer", "actions"),
    [
        (79, "RESTART_BM", "hardware", ["drain_node", "requeue_job"]),  # fallen off the bus
        (64, "RESET_GPU", "hardware", ["drain_node", "requeue_job"]),  # row remap failure
        (119, "RESET_GPU", "system", ["drain_node", "requeue_job"]),  # GSP timeout: software, still a reset
        (62, "RESET_GPU", "system", ["drain_node", "requeue_job"]),  # micro-controller halt: firmware
        (109, "RESET_GPU", "system", ["drain_node", "requeue_job"]),  # context-switch timeout: the driver's
        (61, "CONTACT_SUPPORT", "hardware", ["drain_node", "requeue_job"]),
        (54, "CHECK_MECHANICALS", "hardware", ["drain_node", "requeue_job"]),  # auxiliary power
        (48, "WORKFLOW_XID_48", "hardware", ["drain_node", "requeue_job"]),  # double-bit ECC
        (149, "WORKFLOW_NVLINK5_ERR", "hardware", ["drain_node", "requeue_job"]),
        (74, "WORKFLOW_NVLINK_ERR", "hardware", ["drain_node", "requeue_job"]),
        (78, "UPDATE_SWFW", "system", ["drain_node", "requeue_job"]),
        (13, "RESTART_APP", "application", ["notify"]),  # the application's own kernel: the user's call
        (31, "RESTART_APP", "application", ["notify"]),
        (94, "RESTART_APP", "hardware", ["requeue_job"]),  # contained ECC error: retried, no quarantine
        (159, "CHECK_UVM", "system", ["requeue_job"]),
        (45, "WORKFLOW_XID_45", "system", ["requeue_job"]),  # clean-up after another error, alone
        (63, "IGNORE", "hardware", []),  # a row remap recorded: evidence only
        (43, "IGNORE", "hardware", []),
        (154, "XID_154", "hardware", []),
    ],
)
def test_one_code_per_resolution_class(code: int, resolution: str, layer: str, actions: list[str]) -> None:
    info = xid_info(code)
    assert (info.immediate, info.layer) == (resolution, layer)
    assert _actions(code) == actions


def test_ignored_xids_only_warn_in_a_burst_and_never_drain() -> None:
    node = NodeMonitor("n7")
    lines = [LogRecord(ts=100.0 + i, node="n7", source="kernel", line=_line(63)) for i in range(3)]
    found = [a for rec in lines for a in node.observe(rec)]
    assert [(a.category, a.severity) for a in found] == [("xid_63", "warning")]
    assert [x.action for x in Policy(PolicyConfig()).decide(found[0])] == ["notify"]
    health = GpuHealth()
    samples = [GpuSample(ts=10.0 * i, node="n7", gpu=0, xid=63) for i in range(1, 4)]
    assert [f.severity for s in samples for f in health.observe(s)] == ["warning"]


def test_an_nvlink5_xid_that_says_nonfatal_is_evidence_and_a_fatal_one_is_acted_on() -> None:
    """Xids 144-150 print their own severity (gpud reads them the same way)."""
    nonfatal = "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x1 0x0)"
    fatal = "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x0 0x0)"
    node = NodeMonitor("n7")
    told = node.observe(LogRecord(ts=100.0, node="n7", source="kernel", line=nonfatal))
    assert [(a.category, a.severity, a.layer) for a in told] == [("xid_145", "warning", "hardware")]
    assert [x.action for x in Policy(PolicyConfig()).decide(told[0])] == ["notify"]
    for other in (
        "NVRM: Xid (PCI:0000:c5:00): 145, pid=4, name=<unknown>, RLW_SRC_TRACK Nonfatal XC0 i0 Link 17 (0x0)",
        "NVRM: Xid (PCI:0000:c5:00): 144, SAW_MVB Nonfatal XC 00 i 00 Link 2 (0x0)",
    ):
        said = match_line(other)
        assert said is not None and said.signature.notice and said.signature.remedy is None, other
    m = match_line(fatal)
    assert m is not None and (m.signature.category, m.signature.notice, m.signature.severity) == (
        "xid_149",
        False,
        "fatal",
    )
    # A channel torn down because of it: it was fatal to the job, whatever the first line said.
    torn = match_line("NVRM: Xid (PCI:0000:ed:00): 45, pid=18, name=python3, Ch 0000000c caused by previous Xid 145")
    assert torn is not None and (torn.signature.category, torn.signature.notice) == ("xid_145", False)


def test_a_line_naming_an_earlier_xid_is_blamed_on_that_xid() -> None:
    m = match_line("NVRM: Xid (PCI:0000:9b:00): 45, pid=7, name=python, Ch 00000008 caused by previous Xid 149")
    assert m is not None and m.signature.category == "xid_149" and m.signature.remedy == "WORKFLOW_NVLINK5_ERR"


def test_the_real_gsp_timeout_dump_is_one_anomaly_that_resets_the_gpu() -> None:

    from trainguard.agents.logimport import import_lines

    path = THIRD_PARTY / "gpud" / "dmesg-with-xid-119.log"  # gpud's test data, copied with its licence
    mon = JobMonitor("5")
    found = []
    for rec in import_lines(path.read_text().splitlines(), job_id="5", node="gpu-node-4", year=2025):
        found += mon.observe(LogRecord(**{k: v for k, v in rec.items() if v is not None}))
    found += mon.end_of_input(found[-1].detected_at + 60 if found else 2e9)
    opened = [a for a in found if not a.resolved]
    assert [(a.category, a.layer, a.remedy) for a in opened] == [("xid_119", "system", "RESET_GPU")]
    assert {x.action for x in Policy(PolicyConfig()).decide(opened[0])} == {"drain_node", "requeue_job"}


def test_nvswitch_sxids_follow_the_severity_the_driver_prints() -> None:
    fatal = match_line("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 10 sourcetrack timeout error")
    assert fatal is not None and (fatal.signature.layer, fatal.signature.remedy) == ("hardware", "CONTACT_SUPPORT")
    node = NodeMonitor("n3")
    line = "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 28 egress non-posted PRIV error"
    found = [a for i in range(3) for a in node.observe(LogRecord(ts=10.0 + i, node="n3", source="kernel", line=line))]
    assert [(a.category, a.severity) for a in found] == [("sxid", "warning")]  # a burst, notified, never drained


@pytest.mark.parametrize(
    "line",
    [
        "XidCriticalError: Xid=79, Device=GPU-8ca5630b, The device will go unhealthy.",
        'DCGM_FI_DEV_XID_ERRORS{gpu="3"} 79',
        "gpud: detected xid error 79 on GPU 3",
        "kubelet: xid error 79 on device nvidia3",
        "Xid 79, ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS on GPU 3",
        "Found XID errors: 79",
    ],
)
def test_every_wording_an_agent_names_an_xid_in_gets_that_codes_verdict(line: str) -> None:
    m = match_line(line)
    assert m is not None and (m.signature.category, m.signature.remedy) == ("xid_79", "RESTART_BM"), line


def test_an_idle_nodes_status_dump_is_one_notice_and_a_critical_line_is_never_held_back() -> None:
    """dcgmi prints a link row per GPU: one notice tells it; another GPU's Xid notice, or a crash, is news."""
    node = NodeMonitor("n7")
    row = "        D D D D D D D D D D D D D D D D D D"
    dump = [a for i in range(8) for a in node.observe(LogRecord(ts=100.0 + i / 100, node="n7", line=row))]
    assert [(a.category, a.severity) for a in dump] == [("nvlink_down", "warning")]
    later = node.observe(LogRecord(ts=100.0 + 601, node="n7", line=row))
    assert [a.category for a in later] == ["nvlink_down"]  # ten minutes on: told again
    nonfatal = "NVRM: Xid (PCI:0000:{}:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0)"
    per_gpu = [
        a for bus in ("18", "19") for a in node.observe(LogRecord(ts=800.0, node="n7", line=nonfatal.format(bus)))
    ]
    assert len(per_gpu) == 2
    lost = [a for _ in range(2) for a in node.observe(LogRecord(ts=801.0, node="n7", line=_line(79)))]
    assert [(a.category, a.severity) for a in lost] == [("xid_79", "critical")] * 2
