"""Per-rank progress from ByteDance's straggler what-if traces (``trace-*.parquet`` + ``meta-*.yaml``).

The traces (ByteDance-Seed/StragglerAnalysis, in ``shared/datasets/bytedance-straggler-whatif``)
hold one row per operation of a Megatron-style job: ``dp_rank, stage, rank, step, optype,
start_ts, duration`` (seconds, ``start_ts`` relative to the start of its step). Only a sample
of steps was traced (e.g. 16, 21, 27, …, 404, …) and only one rank per tensor- and
context-parallel group (AR: ranks 0, 4, 8, … with ``tp_size`` 4).

:func:`rank_steps` reduces a trace to one row per (step, rank):

- ``compute_s``: the rank's forward + backward compute time in that step (collective and
  pipeline waits excluded: what localises a slow GPU);
- ``step_s``: the step's wall time, the end of its last operation on any rank (the same on
  every rank: synchronous training waits for the slowest).

:func:`progress_records` turns those rows into the wire contract's :class:`ProgressRecord`\\ s,
with each rank's ``dp_rank`` and ``pp_stage`` from the trace. The trace has no clock of its own
across steps, so event time is rebuilt: the job starts at ``t0``, every traced step lasts
its measured ``step_s`` and every untraced step the median of those; a record's ``ts`` is the
end of its step. Nodes are named as if ``gpus_per_node`` consecutive ranks share a host.

>>> meta = load_meta(DATA_DIR / "meta-ST.yaml")  # doctest: +SKIP
>>> (meta.dp_size, meta.pp_size, meta.world_size)  # doctest: +SKIP
(2, 4, 8)
>>> records = progress_records("ST")  # doctest: +SKIP
>>> r = records[0]; (r.rank, r.dp_rank, r.pp_stage, r.node)  # doctest: +SKIP
(0, 0, 0, 'ST-node0')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from trainguard.detectors.events import ProgressRecord

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "bytedance-straggler-whatif"
TRIALS = ("AR", "SE", "ST")
COMPUTE_OPS = ("forward-compute", "backward-compute")
T0 = 1_796_000_000.0


@dataclass(frozen=True, slots=True)
class JobMeta:
    """Parallelism of a traced job (``meta-*.yaml``; the authors' ``metatypes.JobMeta``).

    >>> JobMeta("X", dp_size=2, pp_size=4, tp_size=1).world_size
    8
    """

    trial_name: str
    dp_size: int = 1
    pp_size: int = 1
    tp_size: int = 1
    dsp_size: int = 1

    @property
    def world_size(self) -> int:
        return self.dp_size * self.pp_size * self.tp_size * self.dsp_size


def load_meta(path: Path) -> JobMeta:
    """Read a ``meta-*.yaml`` and check it against its own ``world_size``."""
    raw = yaml.safe_load(path.read_text())
    meta = JobMeta(
        str(raw["trial_name"]),
        **{k: int(raw.get(k, 1)) for k in ("dp_size", "pp_size", "tp_size", "dsp_size")},
    )
    if "world_size" in raw and int(raw["world_size"]) != meta.world_size:
        raise ValueError(f"{path}: world_size {raw['world_size']} != dp×pp×tp×dsp = {meta.world_size}")
    return meta


def rank_steps(trace: Path | pl.DataFrame) -> pl.DataFrame:
    """One row per (step, rank): ``step, rank, dp_rank, stage, compute_s, step_s``, sorted.

    >>> ops = pl.DataFrame({
    ...     "dp_rank": [0, 0, 0, 1, 1], "stage": [0, 0, 0, 0, 0], "rank": [0, 0, 0, 1, 1], "step": [7] * 5,
    ...     "optype": ["forward-compute", "backward-compute", "optimizer", "forward-compute", "backward-compute"],
    ...     "start_ts": [0.0, 1.0, 3.0, 0.0, 2.0], "duration": [1.0, 2.0, 0.5, 2.0, 1.0]})
    >>> rank_steps(ops).rows()
    [(7, 0, 0, 0, 3.0, 3.5), (7, 1, 1, 0, 3.0, 3.5)]
    """
    ops = pl.read_parquet(trace) if isinstance(trace, Path) else trace
    ops = ops.with_columns(pl.col("optype").cast(pl.Utf8), pl.col("start_ts", "duration").cast(pl.Float64))
    step_s = ops.group_by("step").agg(step_s=(pl.col("start_ts") + pl.col("duration")).max())
    compute = (
        ops.group_by("step", "rank", "dp_rank", "stage")
        .agg(compute_s=pl.col("duration").filter(pl.col("optype").is_in(COMPUTE_OPS)).sum())
        .with_columns(pl.col("rank", "dp_rank", "stage").cast(pl.Int64))
    )
    return compute.join(step_s, on="step").sort("step", "rank")


def progress_records(
    trial: str, data_dir: Path = DATA_DIR, t0: float = T0, gpus_per_node: int = 8, job_id: str | None = None
) -> list[ProgressRecord]:
    """Per-rank progress of trace ``trial`` (``"AR"``, ``"SE"``, ``"ST"``), in event-time order."""
    meta = load_meta(data_dir / f"meta-{trial}.yaml")
    rows = rank_steps(data_dir / f"trace-{trial}.parquet")
    steps = rows.group_by("step").agg(pl.col("step_s").first()).sort("step")
    typical = float(steps["step_s"].median())  # type: ignore[arg-type]
    # End of step s: t0, plus the untraced steps before it at the median, plus the traced ones up to s as measured.
    steps = steps.with_columns(
        end=t0 + (pl.col("step") - pl.int_range(pl.len())) * typical + pl.col("step_s").cum_sum()
    )
    ends = dict(zip(steps["step"].to_list(), steps["end"].to_list(), strict=True))
    job = job_id or f"{meta.trial_name.lower()}-job"
    return [
        ProgressRecord(
            ts=ends[step],
            job_id=job,
            node=f"{meta.trial_name}-node{rank // gpus_per_node}",
            rank=rank,
            step=step,
            step_time_s=step_s,
            compute_time_s=compute_s,
            dp_rank=dp_rank,
            pp_stage=stage,
        )
        for step, rank, dp_rank, stage, compute_s, step_s in rows.iter_rows()
    ]
