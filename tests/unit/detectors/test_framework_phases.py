"""Checkpoint and evaluation messages in each framework's own words, and "a pause that ended is no longer a pause".

Every line below is written as the framework's source prints it (the file is named beside it). Then
jobs in torchtitan's, Megatron-LM's and Hugging Face's formats are replayed through a ``JobMonitor``
with the 5 s ticks of the event-time clock: a long checkpoint is not a hang, a job that hangs right
after its checkpoint ended is one (at the normal logs-only deadline, not 15 minutes later).
"""

from __future__ import annotations

import pickle

import pytest

from trainguard.detectors.events import Anomaly, JobEvent, LogRecord, Tick
from trainguard.detectors.hang import HangDetector
from trainguard.detectors.lines import PhaseMarker, Rhythm, read_line
from trainguard.detectors.monitor import JobMonitor

T0 = 1796205600.0
TICK_S = 5.0

# (line as printed, starts?) for each framework's checkpoint and evaluation boundaries.
MARKERS = [
    # torchtitan, torchtitan/components/checkpoint.py (CheckpointManager.save, _save_last_step, checkpoint_mp)
    ("[titan] 2026-12-04 10:08:20,500 - root - INFO - Saving the checkpoint (or staging if async is enabled).", True),
    (
        "[titan] 2026-12-04 10:11:24,870 - root - INFO - Finished saving the checkpoint (or staging if async is "
        "enabled)in 184.37 seconds.",
        False,
    ),
    ("[rank0]:2026-12-04 10:11:24,870 - root - INFO - Finished saving the checkpoint in 0.60 seconds.", False),
    ("[titan] 2026-12-04 11:00:00,000 - root - INFO - Saving a full checkpoint at last step, step 1000.", True),
    (
        "[titan] 2026-12-04 11:00:00,000 - root - INFO - Saving a model weights only checkpoint in torch.bfloat16 "
        "at last step, step 1000.",
        True,
    ),
    ("[titan] Finish saving the checkpoint in the background process in 12.31 seconds.", False),
    # Megatron-LM, megatron/training/checkpointing.py (save_checkpoint)
    ("[2026-12-04 10:08:20.500000] saving checkpoint at iteration     500 to /ckpt in torch_dist format", True),
    (
        "  [2026-12-04 10:11:24.870000] successfully saved checkpoint from iteration     500 to /ckpt [ t 1/2, p 1/1 ]",
        False,
    ),
    ("  [2026-12-04 10:08:22.000000] successfully saved local checkpoint from iteration     500", False),
    ("  [2026-12-04 10:08:22.000000] scheduled an async checkpoint save at iteration     500 to /ckpt", False),
    # Megatron-LM, megatron/core/timers.py: the save timer, logged once the save is over
    ("    save-checkpoint ................................: (184370.12, 184370.45)", False),
    # Megatron-LM, megatron/training/training.py (evaluate with verbose, evaluate_and_print_results)
    ("Evaluating on 512 samples", True),
    ("Evaluating iter 1/10", True),
    (" validation loss at iteration 500 | lm loss value: 2.101E+00 | lm loss PPL: 8.174E+00 | ", False),
    (
        " validation loss at iteration 500 on validation set | lm loss value: 2.101E+00 | lm loss PPL: 8.174E+00 | ",
        False,
    ),
    # NeMo, nemo/lightning/io/pl.py (MegatronCheckpointIO.save_checkpoint)
    (
        "[NeMo I 2026-12-04 10:08:46 nemo_logging:393] Global Checkpoint Save : Rank: 0 : Iteration: 500 : "
        "Start time: 1796206100.135s : Save duration: 25.537s",
        False,
    ),
    # NeMo, nemo/lightning/pytorch/callbacks/model_checkpoint.py (async saves)
    ("[NeMo I 2026-12-04 10:08:47 nemo_logging:393] Scheduled async checkpoint save for /ckpt/step=500.ckpt", False),
    (
        "[NeMo I 2026-12-04 10:09:10 nemo_logging:393] Async checkpoint save for step 501 (/ckpt/step=500.ckpt) "
        "finalized successfully.",
        False,
    ),
    # DeepSpeed, deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py (create, commit)
    (
        "[2026-12-04 10:08:20,500] [INFO] [logging.py:107:log_dist] [Rank 0] [Torch] Checkpoint global_step500 "
        "is about to be saved!",
        True,
    ),
    (
        "[2026-12-04 10:09:00,000] [INFO] [torch_checkpoint_engine.py:33:commit] [Torch] Checkpoint global_step500 "
        "is ready now!",
        False,
    ),
    # DeepSpeed, deepspeed/runtime/engine.py (_save_checkpoint, _save_zero_checkpoint, NVMe offload copy)
    (
        "[2026-12-04 10:08:20,501] [INFO] [logging.py:107:log_dist] [Rank 0] Saving model checkpoint: "
        "/ckpt/global_step500/mp_rank_00_model_states.pt",
        True,
    ),
    (
        "[2026-12-04 10:08:59,000] [INFO] [engine.py:3313:_save_zero_checkpoint] zero checkpoint saved "
        "/ckpt/global_step500/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        False,
    ),
    (
        "[2026-12-04 10:08:30,000] [INFO] [engine.py:3270:save_checkpoint] Copying NVMe offload files from "
        "/nvme/zero_stage_3 to /ckpt/global_step500/offloaded_tensors/rank00, 812.31 GB free on target filesystem...",
        True,
    ),
    (
        "[2026-12-04 10:08:58,000] [INFO] [engine.py:3279:save_checkpoint] Copying complete! 800.12 GB free on "
        "target filesystem",
        False,
    ),
    # Hugging Face Trainer, transformers/trainer.py (_save, evaluation_loop)
    ("[INFO|trainer.py:3984] 2026-12-04 10:08:20,500 >> Saving model checkpoint to /out/checkpoint-500", True),
    ("[INFO|trainer.py:4327] 2026-12-04 10:08:20,500 >> ***** Running Evaluation *****", True),
    # Hugging Face Accelerate, accelerate/accelerator.py (save_state) and accelerate/checkpointing.py
    # (save_accelerator_state: the random states are its last file)
    ("12/04/2026 10:08:20 - INFO - accelerate.accelerator - Saving current state to /out/checkpoint-500", True),
    (
        "12/04/2026 10:09:00 - INFO - accelerate.checkpointing - Random states saved in "
        "/out/checkpoint-500/random_states_0.pkl",
        False,
    ),
    # PyTorch Lightning (and NeMo's subclass), src/lightning/pytorch/callbacks/model_checkpoint.py
    (
        "Epoch 3, global step 4000: 'val_loss' reached 0.12345 (best 0.12345), saving model to "
        "'/ckpt/epoch=3-step=4000.ckpt' as top 3",
        True,
    ),
]

# Lines that name a checkpoint or an evaluation and are no boundary: failures stay failures, loads and
# activation checkpointing are no pause, and the message that precedes Lightning's silent save of last.ckpt
# ends nothing.
NOT_MARKERS = [
    # DeepSpeed, deepspeed/runtime/engine.py (_create_checkpoint_file)
    "[2026-12-04 10:08:20,500] [ERROR] [engine.py:3180:_create_checkpoint_file] Failed saving model checkpoint to "
    "/ckpt with tag global_step500",
    "FATAL: could not finish saving checkpoint at iteration 400",
    "could not save checkpoint to /ckpt: disk quota exceeded",
    # torchtitan, torchtitan/components/checkpoint.py (startup, load, purge)
    "[titan] 2026-12-04 10:00:00,000 - root - INFO - Checkpointing active. Checkpoints will be loaded from and "
    "saved to ./outputs/checkpoint",
    "[titan] 2026-12-04 10:00:03,000 - root - INFO - Finished loading the checkpoint in 3.21 seconds.",
    "[titan] 2026-12-04 10:11:26,000 - root - INFO - Checkpointer deleted ./outputs/checkpoint/step-400 "
    "in 1.20 seconds.",
    # DeepSpeed, deepspeed/runtime/activation_checkpointing/checkpointing.py (first forward)
    "[2026-12-04 10:00:05,000] [INFO] [checkpointing.py:540:forward] Activation Checkpointing Information",
    "[2026-12-04 10:00:05,000] [INFO] [checkpointing.py:541:forward] ----Partition Activations False, CPU "
    "CHECKPOINTING False",
    # Megatron-LM, megatron/core/timers.py and megatron/training/checkpointing.py (load)
    "    load-checkpoint ................................: (4542.10, 4542.10)",
    "  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 500",
    # PyTorch Lightning, model_checkpoint.py: a last.ckpt may still be written (silently) after this one
    "Epoch 3, global step 4000: 'val_loss' was not in top 3",
]


@pytest.mark.parametrize(("line", "starts"), MARKERS)
def test_each_frameworks_own_checkpoint_and_eval_lines_are_read_as_phase_boundaries(line: str, starts: bool) -> None:
    assert read_line(line) == PhaseMarker(starts=starts)


@pytest.mark.parametrize("line", NOT_MARKERS)
def test_failures_loads_and_look_alikes_are_no_phase_boundary(line: str) -> None:
    assert not isinstance(read_line(line), PhaseMarker)


# -- replays ------------------------------------------------------------------------------------------------


def _log(ts: float, line: str) -> LogRecord:
    return LogRecord(ts=ts, job_id="7", node="n1", rank=0, line=line)


def _titan(ts: float, message: str) -> LogRecord:
    return _log(ts, f"[titan] 2026-12-04 10:00:00,000 - root - INFO - {message}")


def _titan_step(ts: float, step: int) -> LogRecord:
    return _titan(ts, f"step: {step}  loss:  2.3000  memory:  0.01GiB(0.00%)  tps: 9,000  tflops: 0.00  mfu: 0.00%")


class Replay:
    """A job's monitor fed its records in time order, with the clock's ticks every 5 s between them."""

    def __init__(self) -> None:
        self.mon = JobMonitor("7")
        self.mon.observe(JobEvent(ts=T0, job_id="7", state="RUNNING", nodes=["n1"]))
        self.clock = T0
        self.raised: list[Anomaly] = []

    def tick_until(self, ts: float) -> None:
        while self.clock + TICK_S <= ts:
            self.clock += TICK_S
            tick = Tick(watermark=self.clock)
            self.raised += [a for a in self.mon.advance(tick.watermark) if not a.resolved]

    def feed(self, *records: LogRecord) -> None:
        for rec in records:
            self.tick_until(float(rec.ts))  # type: ignore[arg-type]
            self.raised += [a for a in self.mon.observe(rec) if not a.resolved]

    def deadline_after(self, ts: float) -> float:
        """The normal logs-only hang time after ``ts``: max(55 s, 5 × the learned step interval)."""
        return ts + max(55.0, 5.0 * (self.mon.hang.interval() or 0.0))


SAVE_S = 184.37


def _titan_to_save(save_step: int = 500, interval_line: bool = True) -> tuple[Replay, float, float]:
    """A torchtitan job logging every 10 steps (1 s a step) up to ``save_step``, then a 184 s checkpoint in
    torchtitan's own words; returns the replay, the step's time and the finish line's time."""
    job = Replay()
    if interval_line:
        # The save interval as the job printed it (torchtitan's own `[checkpoint] interval` in its args dump
        # is not read as a rhythm yet: lines.py asks parse_rhythm only of lines with "_interval" and the like).
        job.feed(_titan(T0 + 1.0, "checkpoint_interval = 500"))
    t = T0 + 30.0
    for step in range(10, save_step + 1, 10):
        t += 10.0
        job.feed(_titan_step(t, step))
    job.feed(_titan(t + 0.5, "Saving the checkpoint (or staging if async is enabled)."))
    end = t + 0.5 + SAVE_S
    job.feed(_titan(end, f"Finished saving the checkpoint (or staging if async is enabled)in {SAVE_S:.2f} seconds."))
    return job, t, end


def test_a_184_second_torchtitan_checkpoint_at_its_save_interval_is_no_hang() -> None:
    job, last_step, end = _titan_to_save()
    assert end - last_step > 180.0 and job.raised == []  # ticked through the whole save
    assert job.mon.hang.expected_pause() is None  # that pause happened, and it is over


def test_a_torchtitan_checkpoint_at_a_step_nothing_predicts_is_no_hang_either() -> None:
    """The first reported case: no interval printed, step 250 is no round step; flagged 56 s into the save."""
    job, last_step, end = _titan_to_save(save_step=250, interval_line=False)
    assert end - last_step > 180.0 and job.raised == []


def test_a_torchtitan_job_that_hangs_right_after_its_checkpoint_is_a_hang_at_the_normal_deadline() -> None:
    job, _, end = _titan_to_save()
    job.tick_until(end + 1200.0)
    (hang,) = job.raised
    deadline = job.deadline_after(end)
    assert (hang.kind, hang.category) == ("hang", "no_progress")
    assert deadline <= hang.detected_at <= deadline + TICK_S, (hang.detected_at - end, deadline - end)
    assert any("pause after step 500 ended" in e for e in hang.evidence)


def test_a_torchtitan_job_that_steps_on_after_its_checkpoint_raises_nothing() -> None:
    job, _, end = _titan_to_save()
    t = end
    for step in range(510, 1000, 10):
        t += 10.0
        job.feed(_titan_step(t, step))
    job.tick_until(t + 30.0)
    assert job.raised == []


def _megatron_step(ts: float, it: int) -> LogRecord:
    # Megatron-LM, megatron/training/training.py (training_log)
    return _log(
        ts,
        f" [2026-12-04 10:00:00] iteration {it:8d}/  100000 | consumed samples: {it * 64:10d} | "
        "elapsed time per iteration (ms): 1000.0 | learning rate: 1.000000E-04 | global batch size:    64 | "
        "lm loss: 2.100000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    )


def test_a_megatron_job_that_hangs_after_its_own_save_messages_is_a_hang() -> None:
    job = Replay()
    job.feed(_log(T0 + 1.0, "  save_interval ................................... 500"))  # arguments.py's dump
    t = T0 + 30.0
    for it in range(10, 501, 10):
        t += 10.0
        job.feed(_megatron_step(t, it))
    job.feed(
        _log(
            t + 0.2,
            f"[2026-12-04 10:08:20.200000] saving checkpoint at iteration {500:7d} to /ckpt in torch_dist format",
        )
    )
    job.tick_until(t + 120.0)
    assert job.raised == []  # two minutes of saving
    end = t + 121.0
    job.feed(
        _log(
            end,
            f"  [2026-12-04 10:10:21.000000] successfully saved checkpoint from iteration {500:7d} to /ckpt "
            "[ t 1/1, p 1/1 ]",
        ),
        _log(end + 0.1, "(min, max) time across ranks (ms):"),
        _log(end + 0.1, "    save-checkpoint ................................: (120812.31, 120812.90)"),
    )
    job.tick_until(end + 1200.0)
    (hang,) = job.raised
    deadline = job.deadline_after(end + 0.1)
    assert hang.kind == "hang" and deadline <= hang.detected_at <= deadline + TICK_S


def _hf_bar(ts: float, step: int) -> LogRecord:
    # Hugging Face Trainer's tqdm bar as a log collector sees it
    done = step * 100 // 1000
    return _log(ts, f"{done:3d}%|{'█' * (done // 10):10s}| {step}/1000 [08:20<08:20,  1.00it/s]")


def test_a_hugging_face_trainer_job_that_hangs_after_its_evaluation_is_a_hang() -> None:
    job = Replay()
    job.feed(_log(T0 + 1.0, "TrainingArguments(eval_steps=500, save_steps=1000, logging_steps=10)"))
    t = T0 + 30.0
    for step in range(10, 501, 10):
        t += 10.0
        job.feed(_hf_bar(t, step))
    job.feed(
        _log(t + 0.3, "[INFO|trainer.py:4327] 2026-12-04 10:08:20,300 >> ***** Running Evaluation *****"),
        _log(t + 0.3, "[INFO|trainer.py:4329] 2026-12-04 10:08:20,300 >>   Num examples = 2000"),
    )
    job.tick_until(t + 90.0)
    assert job.raised == []  # a 90 s evaluation at a multiple of eval_steps
    end = t + 90.5
    # transformers/trainer.py (log): the evaluation's metrics, its last word
    job.feed(_log(end, "{'eval_loss': 1.93, 'eval_runtime': 90.1, 'eval_samples_per_second': 22.2, 'epoch': 0.5}"))
    job.tick_until(end + 1200.0)
    (hang,) = job.raised
    deadline = job.deadline_after(end)
    assert hang.kind == "hang" and deadline <= hang.detected_at <= deadline + TICK_S


def test_an_accelerate_job_that_hangs_after_save_state_is_a_hang() -> None:
    job = Replay()
    t = T0 + 30.0
    for step in range(10, 501, 10):
        t += 10.0
        job.feed(
            _log(t, f"Steps:  {step // 10:2d}%|█         | {step}/1000 [08:20<08:20,  1.00it/s, loss=0.1, lr=0.0001]")
        )
    job.feed(
        _log(
            t + 0.2, "12/04/2026 10:08:20 - INFO - accelerate.accelerator - Saving current state to /out/checkpoint-500"
        )
    )
    end = t + 40.0
    job.feed(
        _log(
            end,
            "12/04/2026 10:09:00 - INFO - accelerate.checkpointing - Random states saved in "
            "/out/checkpoint-500/random_states_0.pkl",
        )
    )
    job.tick_until(end + 1200.0)
    (hang,) = job.raised
    deadline = job.deadline_after(end)
    assert hang.kind == "hang" and deadline <= hang.detected_at <= deadline + TICK_S


def test_a_snapshot_from_before_the_ended_pause_rule_resumes() -> None:
    det = HangDetector(floor_s=55, warmup_steps=2)
    for step in range(491, 501):
        det.observe_progress(ts=1000.0 + step, step=step, rank=0, node="n1")
    state = dict(det.__dict__)
    del state["_ended_step"]  # written by an older version
    old = HangDetector.__new__(HangDetector)
    old.__setstate__(state)
    restored = pickle.loads(pickle.dumps(old))
    assert restored.expected_pause() is not None  # step 500 is round: a pause may come
    restored.observe_phase(1500.5, starts=True)
    restored.observe_phase(1600.0, starts=False)
    assert restored.expected_pause() is None and restored.deadline() == 1655.0


def test_torchtitans_validation_result_ends_the_evaluation_it_never_announced():
    # pytorch/torchtitan, torchtitan/components/metrics.py, MetricsProcessor.log_validation (colours stripped)
    line = (
        "[titan] 2026-12-04 10:00:00,000 - root - INFO - validate step: 500  loss:  2.3150  "
        "memory: 12.10GiB(15.28%)  tps: 1,234"
    )
    assert read_line(line) == PhaseMarker(starts=False)


def test_torchtitans_checkpoint_interval_is_the_jobs_rhythm():
    # torchtitan's job config on its command line (run_train.sh passes overrides as --section.key value)
    line = (
        "+ torchrun --nproc_per_node=8 -m torchtitan.train --job.config_file llama3_8b.toml --checkpoint.interval 500"
    )
    assert read_line(line) == Rhythm("checkpoint.interval", 500)
