"""The NVML collector: field by field, unsupported fields, lost GPUs, Xid events, and no driver at all."""

from __future__ import annotations

import shutil

import pynvml
import pytest
from typer.testing import CliRunner

from tests.support.nvml_standin import NvmlStandIn
from trainguard.agents.nvml_collector import GpuCollector, NvmlUnavailable
from trainguard.cli.app import app
from trainguard.detectors.events import GpuSample, LogRecord, decode
from trainguard.detectors.signatures import match_line


def test_samples_follow_the_wire_contract_and_unsupported_fields_are_null():
    collector = GpuCollector("gpu-node-07", nvml=NvmlStandIn())
    records = collector.sample(now=1_796_205_600.0)
    assert [topic for topic, _ in records] == ["gpu", "gpu", "gpu"]
    first, second, third = (record for _, record in records)
    assert first["util_pct"] == 97.0 and first["power_w"] == pytest.approx(612.345)
    assert first["mem_used_mib"] == pytest.approx(65498251264 / 2**20) and first["nvlink_crc_total"] == 3
    assert first["ecc_sbe_total"] == 12 and first["ecc_dbe_total"] == 0 and first["throttle_reasons"] == 4
    assert second["remapped_rows_pending"] is None and second["nvlink_crc_total"] is None  # NotSupported
    assert third["remapped_rows_pending"] == 1 and third["ecc_dbe_total"] == 1
    assert [r["pci_bus_id"] for r in (first, second, third)] == [
        "00000000:1B:00.0",
        "00000000:2B:00.0",
        "00000000:3B:00.0",
    ]
    import msgspec

    for _, record in records:  # every record decodes as the dataflow would decode it
        assert isinstance(decode("gpu", msgspec.json.encode(record)), GpuSample)


def test_a_lost_gpu_is_reported_once_and_its_samples_stop():
    collector = GpuCollector("gpu-node-07", nvml=NvmlStandIn())
    collector.sample(now=1.0)
    second = collector.sample(now=2_000_000_000.0)
    lost = [record for topic, record in second if topic == "logs"]
    assert len(lost) == 1 and [r["gpu"] for t, r in second if t == "gpu"] == [0, 1]
    import msgspec

    log = decode("logs", msgspec.json.encode(lost[0]))
    assert isinstance(log, LogRecord) and match_line(log.line).signature.category == "gpu_lost"
    third = collector.sample(now=2_000_000_010.0)
    assert [t for t, _ in third] == ["gpu", "gpu"]


def test_xid_events_become_gpu_records_with_the_code():
    collector = GpuCollector("gpu-node-07", nvml=NvmlStandIn())
    events = collector.wait_for_xids(0.2, now=lambda: 1_796_205_605.0)
    assert events == [
        {
            "ts": 1_796_205_605.0,
            "node": "gpu-node-07",
            "gpu": 0,
            "uuid": "GPU-7f3a1c2e-0000-4000-8000-000000000000",
            "xid": 79,
        }
    ]
    assert collector.wait_for_xids(0.05) == []


def test_no_driver_is_one_clear_sentence():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    with pytest.raises(NvmlUnavailable, match="no usable NVIDIA driver on this machine"):
        GpuCollector("n")
    result = CliRunner().invoke(app, ["collect-gpu", "--out", "samples.jsonl"])
    assert result.exit_code == 2
    assert next(line for line in result.output.splitlines() if line.strip()).startswith(
        "error: no usable NVIDIA driver"
    )


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a real NVIDIA GPU and driver")
def test_on_a_real_gpu(tmp_path):
    out = tmp_path / "gpu.jsonl"
    result = CliRunner().invoke(app, ["collect-gpu", "--out", str(out), "--count", "2", "--interval", "1"])
    assert result.exit_code == 0, result.output
    records = [decode("gpu", line) for line in out.read_bytes().splitlines()]
    assert records and all(isinstance(r, GpuSample) for r in records)


def test_samples_a_real_h200_gave_decode_and_keep_a_healthy_gpu_quiet():
    """``tests/fixtures/nvml_h200.jsonl``: what this collector read from a real NVIDIA H200 (driver 580.159.04),
    idle, then under a bf16 matmul loop: real NVML types and values, an unsupported NVLink counter as null."""
    from tests.support.paths import FIXTURES
    from trainguard.detectors.monitor import NodeMonitor

    records = [decode("gpu", line) for line in (FIXTURES / "nvml_h200.jsonl").read_bytes().splitlines()]
    assert len(records) == 9 and all(isinstance(r, GpuSample) for r in records)
    busy = max(records, key=lambda r: r.power_w)
    assert (busy.util_pct, busy.sm_clock_mhz) == (99.0, 1515) and busy.power_w > 200
    assert {r.nvlink_crc_total for r in records} == {None} and {r.pcie_replay_total for r in records} == {1}
    node = NodeMonitor("h200-node")
    assert [a for r in records for a in node.observe(r)] == []
