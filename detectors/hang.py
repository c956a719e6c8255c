"""No-progress (hang) detection: the job's own rhythm, fused with what its GPUs are doing.

The normal deadline after the last step is ``max(floor_s, factor × q90 of recent
step intervals)`` (NVRx uses a safety factor of 5); before ``warmup_steps`` steps
the much longer ``startup_grace_s`` applies (first steps compile kernels and warm
the dataloader). Then, in order:

- **GPU state** (:mod:`detectors.gpu_activity`, when the job has GPU telemetry):
  GPUs that *spin* in NCCL kernels (busy at a fraction of their training power),
  or one GPU idle while its peers spin, confirm a hang from two samples — after
  ``max(confirm_s, 3 × interval)``, without waiting for the floor. GPUs that keep
  *computing* near training power are evaluating or taking a long step: the
  deadline moves to ``busy_grace_s``.
- **Benign pauses**: a checkpoint/evaluation marker moves the deadline to
  ``pause_grace_s`` after it; so does a stall at an *expected* pause step — a
  multiple of an interval the job printed (Megatron's ``eval_interval`` /
  ``save_interval``, HF ``eval_steps`` / ``save_steps``, Lightning
  ``val_check_interval``) or of the period learned from its earlier pauses
  (evaluations and checkpoints recur at step multiples), or, while nothing is
  known, a round step (a multiple of 100 in a job that logs finer than that).
  At an expected pause, only rank 0's GPU idling among spinning peers is not a
  culprit: that is rank 0 writing a checkpoint while its peers wait in a barrier.
- **Logs only** (no GPU telemetry): conservative at an expected pause step, the
  normal deadline otherwise.
- **A pause that ended is no longer a pause**: once the pause at the last step has
  ended (its finish line — torchtitan's "Finished saving the checkpoint … in 184.37
  seconds", Megatron's "successfully saved checkpoint", a save timer), the
  expected-pause allowance is spent for that step; the normal deadline runs from the
  end of the pause, so a job that hangs right after its checkpoint is reported.

>>> det = HangDetector(floor_s=55, warmup_steps=2)
>>> for step in range(1, 6):
...     _ = det.observe_progress(ts=1000.0 + 2 * step, step=step, rank=0, node="n1")
>>> det.deadline()
1065.0
>>> det.advance(1060.0) is None, det.advance(1065.0).category
(True, 'no_progress')
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, insort
from collections import deque

from trainguard.detectors.findings import Finding
from trainguard.detectors.gpu_activity import Verdict
from trainguard.detectors.settings import HangSettings

# Intervals jobs print in their argument dumps / configs: Megatron, HF Trainer, Lightning, NeMo, torchtitan.
RHYTHM_LINE = re.compile(
    r"\b(?P<name>eval_interval|save_interval|eval_steps|save_steps|val_check_interval|"
    r"checkpoint_interval|save_every_n_steps|every_n_train_steps|eval_every|save_every|"
    # torchtitan's job config, as its command line (--checkpoint.interval 500) or its TOML printed back
    r"checkpoint\.interval|validation\.freq)\b"
    r"[\s.:=]*(?P<value>\d+)\b"
)
ROUND_STEP = 100


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def parse_rhythm(line: str) -> tuple[str, int] | None:
    """An interval a job printed, e.g. Megatron's argument dump.

    >>> parse_rhythm("  eval_interval ................................... 1000")
    ('eval_interval', 1000)
    >>> parse_rhythm("TrainingArguments(eval_steps=500, save_steps=2000, logging_steps=10)")
    ('eval_steps', 500)
    >>> parse_rhythm("torchrun ... -m torchtitan.train --job.config_file llama3_8b.toml --checkpoint.interval 500")
    ('checkpoint.interval', 500)
    """
    m = RHYTHM_LINE.search(line)
    if m is None or int(m["value"]) <= 1:
        return None
    return m["name"], int(m["value"])


_DEFAULTS = HangSettings()  # one definition of the defaults: the settings' (what a config overrides)


class HangDetector:
    """Fires once per stall when no step is made by the deadline."""

    def __init__(
        self,
        floor_s: float = _DEFAULTS.floor_s,
        factor: float = _DEFAULTS.factor,
        warmup_steps: int = _DEFAULTS.warmup_steps,
        startup_grace_s: float = _DEFAULTS.startup_grace_s,
        pause_grace_s: float = _DEFAULTS.pause_grace_s,
        busy_grace_s: float = _DEFAULTS.busy_grace_s,
        confirm_s: float = _DEFAULTS.confirm_s,
        window: int = 50,
    ) -> None:
        self.floor_s = floor_s
        self.factor = factor
        self.warmup_steps = warmup_steps
        self.startup_grace_s = startup_grace_s
        self.pause_grace_s = pause_grace_s
        self.busy_grace_s = busy_grace_s
        self.confirm_s = confirm_s
        self._intervals: deque[float] = deque(maxlen=window)
        self._ordered: list[float] = []  # the same intervals, sorted
        self._interval: float | None = None  # their 90th percentile
        self._deltas: deque[int] = deque(maxlen=window)
        self._step = -1
        self._steps_seen = 0
        self._last_advance: float | None = None
        self._rank_last: dict[int, tuple[float, str]] = {}
        self._pause_since: float | None = None
        self._fired = False
        self.rhythm: dict[str, int] = {}  # printed intervals
        self._pause_steps: deque[int] = deque(maxlen=16)  # steps after which a benign pause happened
        self._ended_step: int | None = None  # the step after which a pause ran and ended (its allowance is spent)

    def __setstate__(self, state: dict[str, object]) -> None:
        # Snapshots of earlier versions resume.
        defaults = {
            "busy_grace_s": 600.0,
            "confirm_s": 15.0,
            "rhythm": {},
            "_pause_steps": deque(maxlen=16),
            "_ended_step": None,
        }
        for name, value in defaults.items():
            state.setdefault(name, value)
        state.setdefault("_deltas", deque(maxlen=50))
        intervals: deque[float] = state["_intervals"]  # type: ignore[assignment]
        state.setdefault("_ordered", sorted(intervals))
        state.setdefault("_interval", _quantile(list(intervals), 0.9) if intervals else None)
        self.__dict__.update(state)

    # -- inputs ---------------------------------------------------------------
    def observe_progress(self, ts: float, step: int, rank: int | None, node: str) -> bool:
        """A rank reached ``step``; returns whether the job as a whole advanced."""
        if rank is not None:  # (observe_rank, written out: this runs once per step of every job)
            prev = self._rank_last.get(rank)
            if prev is None or ts >= prev[0]:
                self._rank_last[rank] = (ts, node)
        last = self._step
        if step < last:  # restarted from a checkpoint: warm up again
            self.restart(ts)
            last = self._step
        if step <= last:
            return False
        # (Locals: this runs once per step of every job.)
        last_advance = self._last_advance
        if last_advance is not None and self._steps_seen >= self.warmup_steps:
            gap = ts - last_advance
            interval = self._interval  # the longest gap still a step's own: max(4 × interval, 20 s)
            longest = None if interval is None else (20.0 if 4 * interval < 20.0 else 4 * interval)
            if self._pause_since is None and (longest is None or gap < longest):
                self._add_interval(gap / (step - last))
            elif last > 0:
                self._pause_steps.append(last)  # a long pause after this step, and the job went on
        if last >= 0:
            self._deltas.append(step - last)
        self._step = step
        self._steps_seen += 1
        self._last_advance = last_advance if last_advance is not None and last_advance > ts else ts  # max()
        # A step clearly after the pause began ends it (some frameworks log no
        # end marker); records of the step just before the marker arrive a
        # little after it and must not.
        if self._pause_since is not None and ts >= self._pause_since + max(2.0, self.interval() or 0.0):
            self._pause_since = None
        self._fired = False
        return True

    def observe_rank(self, ts: float, rank: int | None, node: str) -> None:
        """A rank's record at the step the job is already on: :meth:`observe_progress` without a step."""
        if rank is not None:
            prev = self._rank_last.get(rank)
            if prev is None or ts >= prev[0]:
                self._rank_last[rank] = (ts, node)

    def observe_phase(self, ts: float, starts: bool) -> None:
        """A checkpoint/evaluation starts or ends (:func:`detectors.phases.phase_marker`).

        An end measures the next stall from the end of the pause and spends the pause allowance
        of the step it followed: a pause that ended is no longer a pause. Step 500 is a multiple
        of the save interval, the save takes 184 s; stalling after its finish line is a hang at
        the normal deadline, not 15 minutes later.

        >>> det = HangDetector(floor_s=55, warmup_steps=2)
        >>> det.observe_rhythm("save_interval", 500)
        >>> for step in range(491, 501):
        ...     _ = det.observe_progress(ts=1000.0 + step, step=step, rank=0, node="n1")
        >>> det.deadline() - 1500.0  # stalled at step 500: a save is due, 15 minutes
        900.0
        >>> det.observe_phase(1500.5, starts=True)
        >>> det.observe_phase(1684.4, starts=False)  # "Finished saving the checkpoint ... in 183.90 seconds."
        >>> det.expected_pause() is None, det.deadline() - 1684.4
        (True, 55.0)
        """
        if starts:
            self._pause_since = ts
        elif self._pause_since is not None:
            self._pause_since = None
            # The pause is over: measure the next stall from its end.
            self._last_advance = max(ts, self._last_advance or ts)
            self._ended_step = self._step
        elif self._last_advance is not None and ts >= self._last_advance + max(2.0, self.interval() or 0.0):
            # An end whose start was not seen (a framework that prints only the end, a lost line): the job
            # was busy until now after its last step, and that pause is over too. An end printed while the
            # job steps on (an async save finishing in the background) changes nothing.
            self._last_advance = ts
            self._ended_step = self._step

    def observe_rhythm(self, name: str, every: int) -> None:
        """An interval the job printed (see :func:`parse_rhythm`)."""
        self.rhythm[name] = every

    def restart(self, ts: float) -> None:
        """The job (re)started: forget stall state and warm up again."""
        self._step = -1
        self._steps_seen = 0
        self._last_advance = ts
        self._pause_since = None
        self._ended_step = None
        self._fired = False
        self._rank_last.clear()

    def stop(self) -> None:
        """The job ended: nothing to wait for."""
        self._last_advance = None
        self._pause_since = None

    # -- state ------------------------------------------------------------------
    @property
    def fired(self) -> bool:
        return self._fired

    @property
    def last_step(self) -> int:
        return self._step

    @property
    def last_advance(self) -> float | None:
        return self._last_advance

    def _add_interval(self, per_step: float) -> None:
        """One more per-step interval; the window's 90th percentile is kept as it changes (it is read on
        every GPU frame), from the window kept sorted alongside."""
        intervals, ordered = self._intervals, self._ordered
        if len(intervals) == intervals.maxlen:
            del ordered[bisect_left(ordered, intervals[0])]
        intervals.append(per_step)
        insort(ordered, per_step)
        self._interval = ordered[int(0.9 * len(ordered))]  # (below len(ordered): 0.9 × n < n)

    def interval(self) -> float | None:
        """The 90th percentile of recent per-step intervals (``None`` before the first)."""
        return self._interval

    def expected_pause(self) -> str | None:
        """Why a stall after the last step is a pause the job's rhythm predicts (``None``: it is not, or
        the pause after that step already happened and ended)."""
        step = self._step
        if step <= 0 or step == self._ended_step:
            return None
        for name, every in self.rhythm.items():
            if step % every == 0:
                return f"step {step} is a multiple of the job's {name} ({every})"
        if len(self._pause_steps) >= 2:
            period = math.gcd(*self._pause_steps)
            if period > 1 and step % period == 0:
                return f"step {step} is a multiple of the period of the job's earlier pauses ({period})"
            return None
        if not self.rhythm and self._deltas and max(self._deltas) < ROUND_STEP // 5 and step % ROUND_STEP == 0:
            return f"step {step} is a round step (evaluations and checkpoints happen there)"
        return None

    def deadline(self, activity: Verdict | None = None, silent: bool = False) -> float | None:
        """When a stall becomes a hang, given what the GPUs are doing (``None``: no telemetry) and whether
        some rank's process fell silent while its peers still beat (``silent``, see :mod:`detectors.liveness`)."""
        if self._last_advance is None or self._fired:
            return None
        interval = self.interval()
        warm = self._steps_seen >= self.warmup_steps and interval is not None
        normal = self._last_advance + (max(self.floor_s, self.factor * interval) if warm else self.startup_grace_s)  # type: ignore[operator]
        if self._pause_since is not None:
            return max(self._pause_since + self.pause_grace_s, normal)
        expected = self.expected_pause() is not None
        state = activity.state if activity is not None and activity.samples >= 2 else "unknown"
        # Nothing benign spins everywhere; one idle GPU among spinning peers is a culprit — unless it is
        # rank 0's at a step where a checkpoint is due (the writer, its peers waiting in a barrier).
        fast = state in ("spinning", "culprit_idle") or (state == "writer_idle" and not expected)
        # A process that stopped beating while its peers wait is no pause: nothing benign freezes one rank.
        # Not at an expected pause or inside a marked one, though: a writer holding the GIL in a long
        # C call (a checkpoint) beats late too.
        fast = fast or (silent and not expected and self._pause_since is None)
        if fast and warm:
            return self._last_advance + max(self.confirm_s, 3 * interval)  # type: ignore[operator]
        if state == "computing":
            return max(normal, self._last_advance + self.busy_grace_s)
        if expected:
            return max(normal, self._last_advance + self.pause_grace_s)
        return normal

    # -- clock ------------------------------------------------------------------
    def advance(self, watermark: float, activity: Verdict | None = None, silent: bool = False) -> Finding | None:
        deadline = self.deadline(activity, silent)
        if deadline is None or watermark < deadline:
            return None
        self._fired = True
        assert self._last_advance is not None
        nodes, ranks, confidence = self._localise()
        interval = self.interval()
        evidence = [
            f"no step for {watermark - self._last_advance:.0f}s after step {self._step}"
            + (f" (learned interval {interval:.2f}s)" if interval else " (during warm-up)")
        ]
        if activity is not None and activity.samples >= 2 and activity.why:
            evidence.append(f"GPUs since the last step: {activity.why}")
            if activity.state in ("spinning", "culprit_idle", "writer_idle"):
                confidence = max(confidence, 0.8)
        if self._pause_since is not None:
            evidence.append(f"a checkpoint/eval phase began at {self._pause_since:.0f} and never ended")
        elif self._ended_step == self._step:
            evidence.append(f"the checkpoint/eval pause after step {self._step} ended at {self._last_advance:.0f}")
        return Finding(
            kind="hang",
            category="no_progress",
            layer="unknown",
            onset_ts=self._last_advance,
            detected_at=watermark,
            nodes=nodes,
            ranks=ranks,
            confidence=confidence,
            evidence=evidence,
        )

    def _localise(self) -> tuple[list[str], list[int], float]:
        """Ranks whose last step is clearly older than their peers' stopped first."""
        if len(self._rank_last) < 2:
            return [], [], 0.6
        newest = max(ts for ts, _ in self._rank_last.values())
        slack = max(1.0, 0.5 * (self.interval() or 0.0))
        behind = sorted(r for r, (ts, _) in self._rank_last.items() if ts < newest - slack)
        if not behind or len(behind) == len(self._rank_last):
            return [], [], 0.6
        nodes = sorted({self._rank_last[r][1] for r in behind})
        return nodes, behind, 0.8
