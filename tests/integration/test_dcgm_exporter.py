"""dcgm-exporter as a GPU source: real HTTP pages in its format → the anomalies NVML records give."""

from __future__ import annotations

from pathlib import Path

import msgspec
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from tests.conftest import summary
from tests.support import dcgm_exporter as fake
from trainguard.agents.dcgm import DcgmExporterScraper, GpuFrames
from trainguard.agents.sweeps import as_sweeps
from trainguard.cli.app import app
from trainguard.dataflows.pipeline import replay_in_process
from trainguard.detectors.events import GpuSample, decode

T0 = 1_796_300_000.0
ROUNDS = 10


def _write(directory: Path, records: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "gpu.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in records))
    return directory


def test_scraped_pages_find_the_same_anomalies_as_the_same_telemetry_through_nvml_records(tmp_path: Path):
    current = {"round": 0}
    exporters = [fake.FakeExporter(node, lambda: current["round"]) for node in fake.NODES]
    try:
        scraper = DcgmExporterScraper([e.address for e in exporters])
        scraped = []
        for round_ in range(ROUNDS):
            current["round"] = round_
            scraped += [record for _, record in scraper.poll(now=T0 + 10 * round_)]
    finally:
        for exporter in exporters:
            exporter.close()
    assert scraper.problems() == []
    assert len(scraped) == ROUNDS * len(fake.NODES) * fake.GPUS
    first = next(r for r in scraped if (r["node"], r["gpu"]) == ("gpu-node-a", 3))
    assert first["uuid"] == fake.uuid("gpu-node-a", 3) and first["pci_bus_id"] == fake.pci_bus_id(3)
    assert first["util_pct"] == 97.0 and first["temp_c"] == 64.0 and first["ecc_sbe_total"] == 0
    assert first["remapped_rows_failed"] == 0 and first["xid"] is None
    assert all(isinstance(decode("gpu", msgspec.json.encode(r)), GpuSample) for r in scraped)
    xids = [(r["node"], r["gpu"], r["ts"]) for r in scraped if r["xid"]]
    assert xids == [(fake.XID_NODE, fake.XID_GPU, T0 + 10 * fake.XID_FROM)]  # reported once, when it appeared

    from_dcgm = replay_in_process(_write(tmp_path / "dcgm", scraped)).anomalies
    nvml = fake.nvml_records([(r, T0 + 10 * r) for r in range(ROUNDS)])
    from_nvml = replay_in_process(_write(tmp_path / "nvml", nvml)).anomalies
    assert summary(from_dcgm) == summary(from_nvml)
    # The same scrapes sent as one sweep record per node (collect-gpu --sweeps): the same anomalies.
    sweeps = [record for _, record in as_sweeps([("gpu", r) for r in scraped])]
    assert len(sweeps) == ROUNDS * len(fake.NODES) and all(len(s["gpus"]) == fake.GPUS for s in sweeps)
    assert summary(replay_in_process(_write(tmp_path / "sweeps", sweeps)).anomalies) == summary(from_dcgm)
    found = {(a.category, tuple(a.nodes), tuple(a.gpus)) for a in from_dcgm}
    assert ("xid_79", (fake.XID_NODE,), (f"{fake.XID_NODE}/{fake.XID_GPU}",)) in found
    assert ("ecc_sbe_burst", (fake.SBE_NODE,), (f"{fake.SBE_NODE}/{fake.SBE_GPU}",)) in found


def test_fields_left_out_by_default_are_null_and_unknown_series_are_ignored():
    page = fake.page("gpu-node-a", 0, ecc=False)  # dcgm-exporter's default counters: no ECC
    page += '# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"} 0.7\n'
    page += 'DCGM_FI_DEV_GPU_UTIL{gpu="0",GPU_I_ID="1",Hostname="gpu-node-a"} 3\n'  # a MIG instance: not the GPU
    page += 'DCGM_FI_DEV_GPU_UTIL{device="nvswitch0"} 5\n'  # no gpu label: not a GPU series
    samples = GpuFrames().samples(page, ts=T0, fallback_node="10.0.0.7")
    assert len(samples) == fake.GPUS
    assert "ecc_sbe_total" not in samples[0] and samples[0]["util_pct"] == 97.0
    assert all(isinstance(decode("gpu", msgspec.json.encode(s)), GpuSample) for s in samples)
    nameless = GpuFrames().samples('DCGM_FI_DEV_GPU_TEMP{gpu="1"} 40\n', ts=T0, fallback_node="10.0.0.7")
    assert [(s["node"], s["gpu"], s["temp_c"]) for s in nameless] == [("10.0.0.7", 1, 40.0)]


def test_collect_gpu_scrapes_every_target_and_an_unreachable_one_is_a_warning(tmp_path: Path):
    exporter = fake.FakeExporter("gpu-node-a", lambda: 0)
    dead = "127.0.0.1:9"  # discard port: nothing listens
    out = tmp_path / "gpu.jsonl"
    failures = REGISTRY.get_sample_value("trainguard_agent_failures_total", {"agent": "dcgm-exporter"}) or 0.0
    try:
        args = ["collect-gpu", "--dcgm-exporter", f"{exporter.address},{dead}", "--out", str(out)]
        result = CliRunner().invoke(app, [*args, "--count", "2", "--interval", "0.5"])
        alone = CliRunner().invoke(app, ["collect-gpu", "--dcgm-exporter", dead, "--out", str(tmp_path / "x.jsonl")])
    finally:
        exporter.close()
    assert result.exit_code == 0, result.output
    assert result.output.count(f"cannot scrape http://{dead}/metrics") == 2  # one warning line per failed scrape
    records = [msgspec.json.decode(line) for line in out.read_bytes().splitlines()]
    assert len(records) == 2 * fake.GPUS and {r["node"] for r in records} == {"gpu-node-a"}
    counted = REGISTRY.get_sample_value("trainguard_agent_failures_total", {"agent": "dcgm-exporter"})
    assert counted == failures + 2  # one failed scrape in each of two polls (a failed first poll ends the run)
    assert alone.exit_code == 2 and "check the dcgm-exporter address" in alone.output
    assert "Traceback" not in alone.output
