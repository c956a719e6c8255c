"""Raw log import: launcher prefixes, timestamp formats, and files with no timestamps."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import replay
from trainguard.agents.logimport import LogImportError, detect_node, import_lines, import_log, import_logs
from trainguard.cli.app import app
from trainguard.detectors.logprefix import find_timestamp, parse_prefix


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-11-04T11:41:27.602Z step", "2024-11-04T11:41:27.602+00:00"),
        ("[2024-11-04 11:41:27,602] [INFO] [loss_scaler.py:190]", "2024-11-04T11:41:27.602+00:00"),
        ("2024-11-04T13:41:27+02:00 x", "2024-11-04T11:41:27+00:00"),
        ("[rank1]:[E410 01:50:33.889423318 ProcessGroupNCCL.cpp:1895] [PG ID 0]", "2024-04-10T01:50:33.889423+00:00"),
        ("E1218 20:27:21.426000 12 x.cpp:1] boom", "2024-12-18T20:27:21.426+00:00"),
        ("Dec  2 11:38:46 worker4 kernel: NVRM: GPU 0000:0a:00.0", "2024-12-02T11:38:46+00:00"),
        ("[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43", "2024-07-31T23:14:18+00:00"),
    ],
)
def test_timestamp_formats(text: str, expected: str):
    ts = find_timestamp(text, year=2024)
    assert ts is not None
    assert ts == pytest.approx(datetime.fromisoformat(expected).timestamp(), abs=1e-6)


def test_rank_prefixes():
    assert parse_prefix("12: hello", 2024).rank == 12
    assert parse_prefix("12: hello", 2024).text == "hello"
    assert parse_prefix("[rank3]: boom", 2024).rank == 3
    assert parse_prefix("[default7]: iteration 5", 2024).rank == 7
    assert parse_prefix("plain", 2024).rank is None
    assert parse_prefix("E1399 99:99:99.1 nonsense date", 2024).ts is None


def test_slurm_output_becomes_log_records_that_the_flow_understands(tmp_path: Path):
    out_file = tmp_path / "slurm-4242.out"
    out_file.write_text(
        "starting job\n"
        "0: 2026-12-01T10:00:00Z iteration 1/ 100 | elapsed time per iteration (ms): 1000.0 |\n"
        "0: 2026-12-01T10:00:01Z iteration 2/ 100 | elapsed time per iteration (ms): 1000.0 |\n"
        "3: [rank3]:[E1201 10:00:02.500 ProcessGroupNCCL.cpp:607] RuntimeError: CUDA error: an illegal memory "
        "access was encountered\n"
        "3:   what():  continuation line without a stamp\n"
    )
    records = list(import_log(out_file, node="gpu-node-07", year=2026))
    assert [r["rank"] for r in records] == [None, 0, 0, 3, 3]
    assert records[0]["ts"] == records[1]["ts"]  # before the first stamp: back-filled
    assert records[4]["ts"] == records[3]["ts"]  # continuation inherits
    assert {r["job_id"] for r in records} == {"4242"} and {r["node"] for r in records} == {"gpu-node-07"}
    path, count = import_logs([out_file], tmp_path / "replay", node="gpu-node-07", year=2026)
    assert count == 5 and json.loads(path.read_text().splitlines()[0])["job_id"] == "4242"
    result = replay(tmp_path / "replay")
    assert [(a.kind, a.category, a.job_id, a.ranks) for a in result.anomalies] == [
        ("crash", "cuda_illegal_address", "4242", [3])
    ]


def test_file_without_timestamps_is_refused_with_one_sentence(tmp_path: Path):
    path = tmp_path / "slurm-1.out"
    path.write_text("hello\nworld\n")
    with pytest.raises(LogImportError, match=r"has no line with a timestamp I can read"):
        list(import_log(path))
    with pytest.raises(LogImportError, match="does not exist"):
        list(import_log(tmp_path / "missing.out"))


MIXED_YEARS = (
    "[2024-07-31 23:14:10,100] [INFO] [megatron] iteration 100/ 1000 | elapsed time per iteration (ms): 1000.0\n"
    "[rank3]:[E731 23:14:12.5 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n"
    "[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
)


def test_yearless_stamps_take_the_year_of_the_logs_full_stamps(tmp_path: Path) -> None:
    """A 2024 log written today: its glog lines belong to 2024, not to the file's year."""
    path = tmp_path / "slurm-9.out"
    path.write_text(MIXED_YEARS)  # mtime: now (2026)
    warnings: list[str] = []
    records = list(import_log(path, warnings=warnings))
    years = [datetime.fromtimestamp(r["ts"], UTC).year for r in records]
    assert years == [2024, 2024, 2024] and [r["ts"] for r in records] == sorted(r["ts"] for r in records)
    # --year still overrides, and a year that puts lines far from their neighbours is pointed out.
    assert datetime.fromtimestamp(next(import_log(path, year=2023))["ts"], UTC).year == 2024  # full stamps keep theirs
    far = tmp_path / "far.log"
    far.write_text("2024-07-31T23:14:10Z step 1\n[E0201 10:00:00.1 x.cpp:1] boom\n")
    warnings = []
    list(import_log(far, warnings=warnings))
    assert any("more than a day" in w for w in warnings)


def test_a_year_boundary_is_crossed_the_right_way() -> None:
    recs = import_lines(["2024-12-31T23:59:58Z step 1", "[E0101 00:00:01.0 x.cpp:1] boom"], fallback_year=2026)
    assert recs[1]["ts"] - recs[0]["ts"] == pytest.approx(3.0)


@pytest.mark.parametrize(
    "line",
    [
        "    host      : gpu-node-07",
        "SLURMD_NODENAME=gpu-node-07",
        "Dec  2 11:38:46 gpu-node-07 kernel: [ 1.0] NVRM: Xid (PCI:0000:3b:00): 79",
        "2024-12-02T11:38:46+0000 gpu-node-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79",
    ],
)
def test_the_node_is_taken_from_the_log_when_it_names_it(line: str) -> None:
    assert detect_node(["step 1", line]) == "gpu-node-07"


def test_import_logs_cli_names_the_node_and_stamps_a_log_without_time(tmp_path: Path) -> None:
    runner = CliRunner()
    (tmp_path / "slurm-3.out").write_text(MIXED_YEARS + "    host      : gpu-node-07\n")
    done = runner.invoke(app, ["import-logs", str(tmp_path / "slurm-3.out"), "--out", str(tmp_path / "a")])
    assert done.exit_code == 0, done.output
    result = replay(tmp_path / "a")
    assert {n for a in result.anomalies for n in a.nodes} == {"gpu-node-07"}  # not "drain_node unknown"
    (tmp_path / "plain.log").write_text("step 1\nstep 2\nSegmentation fault (core dumped)\n")
    args = ["import-logs", str(tmp_path / "plain.log"), "--out", str(tmp_path / "b"), "--node", "n1"]
    done = runner.invoke(app, [*args, "--start", "2024-07-31T00:00:00Z", "--interval", "2"])
    assert done.exit_code == 0, done.output
    stamps = [json.loads(line)["ts"] for line in (tmp_path / "b" / "logs.jsonl").read_text().splitlines()]
    assert stamps == [1722384000.0, 1722384002.0, 1722384004.0]
