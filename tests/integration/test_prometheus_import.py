"""History from a real Prometheus (Debian's binary) scraping dcgm-exporter pages → a replay that finds the faults."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
from typer.testing import CliRunner

from tests.support import dcgm_exporter as fake
from tests.support.prometheus import prometheus_binary, running_prometheus, wait_for_scrapes
from trainguard.agents.dcgm import DcgmExporterScraper
from trainguard.cli.app import app
from trainguard.dataflows.pipeline import replay_in_process

ROUND_S = 1.0
ROUNDS = 11


def _faults(anomalies: list) -> set[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    return {(a.category, tuple(a.nodes), tuple(a.gpus)) for a in anomalies}


def test_imported_history_finds_what_the_live_scrape_found(tmp_path: Path):
    prometheus_binary()
    rounds = fake.WallRounds(ROUND_S)
    exporters = [fake.FakeExporter(node, rounds) for node in fake.NODES]
    live: list[dict] = []
    try:
        with running_prometheus(tmp_path / "prometheus", [e.address for e in exporters], ROUND_S) as url:
            scraper = DcgmExporterScraper([e.address for e in exporters])
            wait_for_scrapes(url, len(exporters))
            start = rounds.begin()
            while rounds() < ROUNDS:  # the live path, beside Prometheus, on the same pages
                live += [record for _, record in scraper.poll()]
                time.sleep(ROUND_S)
            time.sleep(2 * ROUND_S)  # Prometheus' last scrape
            end = time.time()
            out = tmp_path / "replay"
            span = ["--start", f"{start:.3f}", "--end", f"{end:.3f}", "--step", "1s", "--chunk-steps", "5"]
            result = CliRunner().invoke(app, ["import-prometheus", url, "--out", str(out), *span])
            assert result.exit_code == 0, result.output
            assert "GPU samples" in result.output
            # Bad input is one sentence: a wrong metric pattern, a server that is not there.
            nothing = CliRunner().invoke(
                app, ["import-prometheus", url, "-o", str(tmp_path / "x"), "--start", "0", "--end", "60"]
            )
            assert nothing.exit_code == 2 and "holds no dcgm-exporter series" in nothing.output
    finally:
        for exporter in exporters:
            exporter.close()
    parts = sorted((out / "gpu").glob("part-*.parquet"))
    assert len(parts) >= 3  # chunked: no chunk holds the whole range
    rows = [row for part in parts for row in pq.read_table(part).to_pylist()]
    assert {row["node"] for row in rows} == set(fake.NODES) and {row["gpu"] for row in rows} == set(range(fake.GPUS))
    assert [row["xid"] for row in rows if row["xid"]] == [79]  # once: when the last Xid changed

    imported = _faults(replay_in_process(out).anomalies)
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    (live_dir / "gpu.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in live))
    assert imported == _faults(replay_in_process(live_dir).anomalies)
    assert ("xid_79", (fake.XID_NODE,), (f"{fake.XID_NODE}/{fake.XID_GPU}",)) in imported
    assert ("ecc_sbe_burst", (fake.SBE_NODE,), (f"{fake.SBE_NODE}/{fake.SBE_GPU}",)) in imported


def test_an_unreachable_prometheus_is_one_sentence(tmp_path: Path):
    result = CliRunner().invoke(
        app, ["import-prometheus", "http://127.0.0.1:9", "-o", str(tmp_path), "--start", "0", "--step", "1x"]
    )
    assert result.exit_code == 2 and "is not a duration" in result.output
    result = CliRunner().invoke(app, ["import-prometheus", "http://127.0.0.1:9", "-o", str(tmp_path), "--start", "0"])
    assert result.exit_code == 2 and "cannot query Prometheus at http://127.0.0.1:9" in result.output
    assert "Traceback" not in result.output
