"""The signature catalogue on real log excerpts (shared/datasets/real-log-excerpts.jsonl)."""

from __future__ import annotations

import json

import pytest

from trainguard.benchmarks.corpus import EXCERPTS_PATH as DEFAULT_PATH
from trainguard.benchmarks.corpus import evaluate, score
from trainguard.detectors.events import LogRecord
from trainguard.detectors.monitor import JobMonitor
from trainguard.detectors.signatures import classify_text, family_of, match_line

needs_excerpts = pytest.mark.skipif(
    not DEFAULT_PATH.is_file(),
    reason=f"real log excerpts not found at {DEFAULT_PATH} (shared/datasets is beside the checkout)",
)


@needs_excerpts
def test_the_first_52_real_excerpts_replayed_one_job_each():
    s = score(evaluate(DEFAULT_PATH))
    assert s.excerpts == 52
    assert s.fault_vs_normal >= 0.95 and s.layer >= 0.93 and s.normal_silent == 1.0, s


@needs_excerpts
def test_excerpts_through_the_job_monitor():
    """Normal progress raises nothing; every fatal excerpt becomes one anomaly of the right family."""
    for line in DEFAULT_PATH.read_text().splitlines():
        item = json.loads(line)
        mon = JobMonitor("x")
        found = []
        for i, text in enumerate(item["text"].splitlines()):
            found += mon.observe(LogRecord(ts=1_000_000.0 + i * 0.01, job_id="x", node="n1", line=text))
        found += mon.advance(1_000_100.0)
        match = classify_text(item["text"])
        if item["label"] == "normal_progress":
            assert found == [], item["source"]
        elif match is not None and match.signature.severity == "fatal":
            assert len(found) == 1, item["source"]
            # This set calls application Xids (13, 31, 43) CUDA errors; the corpus and NVIDIA call them Xids.
            family = family_of(found[0].category)
            assert family == item["label"] or found[0].category.startswith("xid_"), item["source"]


def test_fields_are_extracted():
    m = match_line(
        "[rank7]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] [Rank 7] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1580, OpType=ALLGATHER, NumelIn=4, NumelOut=4, Timeout(ms)=600000)"
    )
    assert m is not None and m.fields == {"seqnum": "1580", "op": "ALLGATHER", "timeout_ms": "600000", "rank": "7"}
    gpu = match_line("Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system")
    assert gpu is not None and gpu.fields["pci"] == "0000:02:00.0" and gpu.signature.category == "gpu_lost"
    killed = match_line("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3")
    assert killed is not None and killed.fields["exit_code"] == "-9" and killed.signature.layer == "system"


@pytest.mark.parametrize(
    "line",
    [
        "iteration     3383/    8000 | lm loss: 7.334521E-01 | grad norm: 0.752 | number of nan iterations:   0 |",
        "Saving checkpoint to /ckpt/global_step2000",
        "INFO: NCCL_IB_TIMEOUT set to 22",
        "Epoch 3: 100%|██████████| 500/500 [01:02<00:00,  8.01it/s, loss=0.412, v_num=1]",
        "[2024-11-04 11:41:27,602] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] Grad overflow check done",
        "the infrastructure team reviewed the logs",
    ],
)
def test_ordinary_lines_match_nothing(line: str):
    assert match_line(line) is None
