"""Tunable detector parameters, grouped per detector (defaults are justified in docs/running.md, "Configuration")."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from trainguard.detectors.gpu_health import GpuHealthSettings
from trainguard.detectors.history import HistorySettings
from trainguard.detectors.xid import NODE_REMEDIES

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


_SITE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SITE_CATEGORY = re.compile(r"[a-z0-9_]{1,64}")
_SITE_REMEDIES = (*sorted(NODE_REMEDIES), "RESTART_APP")


class SiteSignature(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A signature of this site's own: a failure its logs print that the catalogue does not know.

    Tried before the catalogue, so it can also re-blame a wording the catalogue knows. The
    pattern is a Python regular expression searched anywhere in the line (anchor it with ``^``).
    """

    id: str
    pattern: str
    category: str  # a catalogue category groups (and is counted) with the catalogue's
    layer: Literal["hardware", "system", "application"]
    kind: Literal["crash", "numerics", "node_unhealthy", "gpu_degraded"] = "crash"
    transient: bool | None = None
    notice: bool = False  # notify only, never act (a warning this site wants to see)
    storm: Annotated[int, msgspec.Meta(ge=0)] = 0  # this many lines within five minutes make one anomaly
    # What the node needs, in NVIDIA's words (RESET_GPU, RESTART_BM, …: out of service; RESTART_APP: not).
    remedy: str | None = None

    def __post_init__(self) -> None:
        if not _SITE_ID.fullmatch(self.id):
            raise ValueError(f"signature id {self.id!r} must be 1 to 64 letters, digits, '.', '_' or '-'")
        if not _SITE_CATEGORY.fullmatch(self.category):
            raise ValueError(
                f"signature {self.id!r}: category {self.category!r} must be 1 to 64 lower-case letters, digits or '_'"
            )
        if self.remedy is not None and self.remedy not in _SITE_REMEDIES:
            raise ValueError(f"signature {self.id!r}: remedy {self.remedy!r} is not one of {', '.join(_SITE_REMEDIES)}")
        try:
            compiled = re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"signature {self.id!r}: pattern does not compile ({exc})") from None
        if compiled.search("") is not None:
            # Tried before the catalogue on every line: a pattern that matches nothing at all
            # matches every line, progress included.
            raise ValueError(f"signature {self.id!r}: pattern matches an empty line, so it would match every line")


class DetectorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    hang: HangSettings = msgspec.field(default_factory=HangSettings)
    straggler: StragglerSettings = msgspec.field(default_factory=StragglerSettings)
    crash: CrashSettings = msgspec.field(default_factory=CrashSettings)
    gpu: GpuHealthSettings = msgspec.field(default_factory=GpuHealthSettings)
    # More detectors for every job, each ``"package.module:factory"`` (detectors.protocol.Detector).
    plugins: list[str] = msgspec.field(default_factory=list)
    history: HistorySettings = msgspec.field(default_factory=HistorySettings)
    # This site's own signatures, tried before the catalogue (docs/detectors.md, "Site signatures").
    signatures: list[SiteSignature] = msgspec.field(default_factory=list)
    # How long a finished job's state is kept for stragglers of its telemetry.
    linger_s: Seconds = 600.0

    def __post_init__(self) -> None:
        ids = [s.id for s in self.signatures]
        if len(ids) != len(set(ids)):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"signatures: id {twice[0]!r} is given twice; each signature needs its own id")
