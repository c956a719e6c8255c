"""The detector protocol: built-in detectors follow it, and a detector written elsewhere plugs in by config."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from trainguard.dataflows.config import ConfigError, load_settings
from trainguard.detectors.crash import CrashDetector
from trainguard.detectors.events import GpuSample, LogRecord
from trainguard.detectors.gpu_health import GpuHealth
from trainguard.detectors.monitor import JobMonitor
from trainguard.detectors.protocol import Detector, check_plugin
from trainguard.detectors.settings import DetectorSettings


def test_the_event_driven_built_in_detectors_follow_the_protocol() -> None:
    crash, health = CrashDetector(), GpuHealth()
    assert isinstance(crash, Detector) and isinstance(health, Detector)
    line = LogRecord(ts=1.0, job_id="7", node="n1", line="RuntimeError: CUDA error: an illegal memory access")
    sample = GpuSample(ts=1.0, node="n1", gpu=0, xid=79)
    # Each takes any event and answers only for its own kind.
    assert [f.category for f in crash.observe(line)] == ["cuda_illegal_address"] and crash.observe(sample) == []
    assert [f.category for f in health.observe(sample)] == ["xid_79"] and health.observe(line) == []


def test_a_plugin_named_in_the_settings_sees_the_jobs_events_and_its_findings_become_anomalies() -> None:
    settings = DetectorSettings(plugins=["tests.support.toy_detector:silent_rank"])
    mon = JobMonitor("42", settings)
    for t in range(0, 60, 5):
        mon.observe(LogRecord(ts=float(t), job_id="42", node="n1", rank=0, line=f"rank 0 step {t}"))
        if t < 10:
            mon.observe(LogRecord(ts=float(t), job_id="42", node="n2", rank=1, line=f"rank 1 step {t}"))
    restored = pickle.loads(pickle.dumps(mon))  # a recovery snapshot keeps the plugin's state
    (anomaly,) = restored.advance(60.0)
    assert (anomaly.kind, anomaly.category, anomaly.job_id, anomaly.ranks) == ("hang", "silent_rank", "42", [1])
    assert restored.advance(70.0) == []  # once


def test_a_monitor_without_plugins_restores_from_a_snapshot_written_before_them() -> None:
    mon = JobMonitor("1")
    state = mon.__dict__.copy()
    del state["plugins"]
    old = JobMonitor.__new__(JobMonitor)
    old.__setstate__(state)
    assert old.plugins == [] and old.advance(10.0) == []


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("tests.support.toy_detector", "must be written 'package.module:factory'"),
        ("tests.support.toy_detector:nope", "cannot be loaded"),
        ("no_such_package.mod:Factory", "No module named 'no_such_package'"),
        ("collections:Counter", "cannot build a detector"),  # importable, but not a detector factory
        ("os.path:join", "cannot build a detector"),
    ],
)
def test_a_plugin_that_cannot_be_loaded_is_one_sentence_at_config_time(tmp_path: Path, spec: str, says: str) -> None:
    config = tmp_path / "tg.yaml"
    config.write_text(f"detectors:\n  plugins: [{spec!r}]\n")
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    message = str(err.value)
    assert says in message and "detectors.plugins" in message and "\n" not in message
    with pytest.raises(ValueError):
        check_plugin(spec, DetectorSettings())


def test_a_plugin_that_raises_is_switched_off_and_the_job_is_still_watched(caplog: pytest.LogCaptureFixture) -> None:
    settings = DetectorSettings(plugins=["tests.support.toy_detector:Broken"])
    mon = JobMonitor("9", settings)
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    for t in range(3):
        mon.observe(LogRecord(ts=float(t), job_id="9", node="n1", rank=0, line=f"step {t}"))
    assert mon.plugins == [] and "switched off" in caplog.text
    (crash,) = mon.observe(LogRecord(ts=5.0, job_id="9", node="n1", rank=0, line=line))
    assert crash.category == "cuda_illegal_address"
