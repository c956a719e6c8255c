"""Tunable detector parameters, grouped per detector (defaults are justified in docs/running.md, "Configuration")."""

from __future__ import annotations

from typing import Annotated

import msgspec

from trainguard.detectors.gpu_health import GpuHealthSettings
from trainguard.detectors.history import HistorySettings

# Ranges a config file is checked against (msgspec refuses a value outside them, naming the key).
Seconds = Annotated[float, msgspec.Meta(ge=0)]
Steps = Annotated[int, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=1)]
Positive = Annotated[float, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
AboveOne = Annotated[float, msgspec.Meta(gt=1)]  # a ratio that means "slower than usual"


class HangSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    floor_s: Seconds = 55.0
    factor: Positive = 5.0
    warmup_steps: Steps = 3
    startup_grace_s: Seconds = 600.0
    pause_grace_s: Seconds = 900.0
    busy_grace_s: Seconds = 600.0  # GPUs still computing near training power: evaluation or a long step
    confirm_s: Seconds = 15.0  # GPUs spinning in NCCL this long after the last step (two samples) is a hang


class StragglerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Job level: sustained step-time rise against the job's own rolling median.
    ratio: AboveOne = 1.25
    consecutive: Count = 5
    baseline_steps: Count = 30
    warmup_steps: Steps = 5
    # Rank level (NVRx-style scores on per-rank compute or step times).
    rank_threshold: Fraction = 0.75
    rank_window: Count = 5
    rank_consecutive: Count = 5
    rank_eval_s: Seconds = 5.0  # score ranks at most this often (event time)
    # A job-level slowdown is pinned on a rank whose relative score is below this.
    localise_below: Fraction = 0.9
    # GPU peer comparison: robust z-score that makes a GPU the odd one out.
    peer_z: Positive = 4.0
    cooldown_s: Seconds = 900.0


class CrashSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cascade_hold_s: Seconds = 10.0
    # Lines of one incident keep arriving for as long as the NCCL watchdog
    # timeout (10 min by default) after the root error: group them all.
    group_window_s: Seconds = 1200.0


class DetectorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    hang: HangSettings = msgspec.field(default_factory=HangSettings)
    straggler: StragglerSettings = msgspec.field(default_factory=StragglerSettings)
    crash: CrashSettings = msgspec.field(default_factory=CrashSettings)
    gpu: GpuHealthSettings = msgspec.field(default_factory=GpuHealthSettings)
    # More detectors for every job, each ``"package.module:factory"`` (detectors.protocol.Detector).
    plugins: list[str] = msgspec.field(default_factory=list)
    history: HistorySettings = msgspec.field(default_factory=HistorySettings)
    # How long a finished job's state is kept for stragglers of its telemetry.
    linger_s: Seconds = 600.0
