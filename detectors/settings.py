"""Tunable detector parameters, grouped per detector (defaults are justified in docs/running.md, "Configuration")."""

from __future__ import annotations

import msgspec

from trainguard.detectors.gpu_health import GpuHealthSettings
from trainguard.detectors.history import HistorySettings


class HangSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    floor_s: float = 55.0
    factor: float = 5.0
    warmup_steps: int = 3
    startup_grace_s: float = 600.0
    pause_grace_s: float = 900.0
    busy_grace_s: float = 600.0  # GPUs still computing near training power: evaluation or a long step
    confirm_s: float = 15.0  # GPUs spinning in NCCL this long after the last step (two samples) is a hang


class StragglerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Job level: sustained step-time rise against the job's own rolling median.
    ratio: float = 1.25
    consecutive: int = 5
    baseline_steps: int = 30
    warmup_steps: int = 5
    # Rank level (NVRx-style scores on per-rank compute or step times).
    rank_threshold: float = 0.75
    rank_window: int = 5
    rank_consecutive: int = 5
    rank_eval_s: float = 5.0  # score ranks at most this often (event time)
    # A job-level slowdown is pinned on a rank whose relative score is below this.
    localise_below: float = 0.9
    # GPU peer comparison: robust z-score that makes a GPU the odd one out.
    peer_z: float = 4.0
    cooldown_s: float = 900.0


class CrashSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    cascade_hold_s: float = 10.0
    # Lines of one incident keep arriving for as long as the NCCL watchdog
    # timeout (10 min by default) after the root error: group them all.
    group_window_s: float = 1200.0


class DetectorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    hang: HangSettings = msgspec.field(default_factory=HangSettings)
    straggler: StragglerSettings = msgspec.field(default_factory=StragglerSettings)
    crash: CrashSettings = msgspec.field(default_factory=CrashSettings)
    gpu: GpuHealthSettings = msgspec.field(default_factory=GpuHealthSettings)
    history: HistorySettings = msgspec.field(default_factory=HistorySettings)
    # How long a finished job's state is kept for stragglers of its telemetry.
    linger_s: float = 600.0
