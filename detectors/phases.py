"""Benign pause markers: checkpoint saves and evaluation phases.

A job that stops stepping while it writes a checkpoint or evaluates is not hung,
and its slower steps are not a straggler. These markers let the hang and
straggler detectors tell the two apart. Each framework's own words are read
(torchtitan, Megatron-LM, NeMo, DeepSpeed, Hugging Face Trainer / Accelerate,
PyTorch Lightning), as their sources print them; the source of each pattern is
named beside it. A line that says a pause is over, or how long it took, is an end.

>>> phase_marker("[2026-12-02 10:00:00] saving checkpoint at iteration 2000 to /ckpt")
('checkpoint', True)
>>> phase_marker("  successfully saved checkpoint at iteration 2000 to /ckpt")
('checkpoint', False)
>>> phase_marker("Running Evaluation") , phase_marker("iteration 5 | loss 2.0") is None
(('eval', True), True)
>>> phase_marker("Finished saving the checkpoint (or staging if async is enabled)in 184.37 seconds.")
('checkpoint', False)
>>> phase_marker("Failed saving model checkpoint to /ckpt with tag global_step10") is None  # a failure, not a pause
True
"""

from __future__ import annotations

import re

import ahocorasick_rs

# (phase, starts?) for each marker; ends are tested first because
# "saved checkpoint" would also match a loose "checkpoint" start pattern.
# Sources (repository: files named below): torchtitan pytorch/torchtitan, Megatron-LM NVIDIA/Megatron-LM,
# NeMo NVIDIA/NeMo, DeepSpeed deepspeedai/DeepSpeed, HF Trainer huggingface/transformers, Accelerate
# huggingface/accelerate, Lightning Lightning-AI/pytorch-lightning.
_MARKERS: tuple[tuple[re.Pattern[str], str, bool], ...] = (
    (
        re.compile(
            r"(?i)successfully saved checkpoint|checkpoint saved|saved checkpoint|"
            # torchtitan, torchtitan/components/checkpoint.py: "Finished saving the checkpoint (or staging if
            # async is enabled)in 184.37 seconds." (older: "... checkpoint in 0.60 seconds."), and the pinned-memory
            # writer process's "Finish saving the checkpoint in the background process in 5.53 seconds."
            r"finish(?:ed)? saving (?:the )?checkpoint|"
            # Megatron-LM, megatron/training/checkpointing.py: "successfully saved local checkpoint from iteration
            # 2000", "scheduled an async checkpoint save at iteration 2000 to /ckpt" (the blocking part is over);
            # NeMo, nemo/lightning/pytorch/callbacks/model_checkpoint.py: "Scheduled async checkpoint save for
            # /ckpt/step=2000.ckpt", "Async checkpoint save for step 2001 (/ckpt/...) finalized successfully."
            r"saved local checkpoint|scheduled (?:an )?async checkpoint save|"
            r"async checkpoint save for step \d+ .*finalized|"
            # Megatron-LM, megatron/core/timers.py: the save timer once the save is over,
            # "    save-checkpoint ................................: (184370.12, 184370.45)" (older and
            # Megatron-DeepSpeed: "time (ms) | save-checkpoint: 184370.12")
            r"\bsave-checkpoint(?:-non-persistent)? ?\.*: \(?\d|"
            # NeMo, nemo/lightning/io/pl.py (MegatronCheckpointIO.save_checkpoint): "Global Checkpoint Save :
            # Rank: 0 : Iteration: 2000 : Start time: 1796205600.135s : Save duration: 25.537s"
            r"global checkpoint save : .*save duration|"
            # DeepSpeed, deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py (commit):
            # "[Torch] Checkpoint global_step2000 is ready now!"; engine.py after copying NVMe offload files:
            # "Copying complete! 812.31 GB free on target filesystem"
            r"checkpoint \S+ is ready now|copying complete! .* free on target filesystem|"
            # Hugging Face Accelerate, accelerate/checkpointing.py (save_accelerator_state's last file):
            # "Random states saved in /out/checkpoint-500/random_states_0.pkl"
            r"random states saved in"
        ),
        "checkpoint",
        False,
    ),
    (
        re.compile(
            # Megatron-LM ("saving checkpoint at iteration 2000 to /ckpt in torch_dist format"), DeepSpeed,
            # deepspeed/runtime/engine.py ("Saving model checkpoint: /ckpt/global_step2000/mp_rank_00_model_states.pt"),
            # Hugging Face Trainer, transformers/trainer.py ("Saving model checkpoint to /out/checkpoint-500"),
            # torchtitan, torchtitan/components/checkpoint.py ("Saving the checkpoint (or staging if async is
            # enabled).", "Saving a full checkpoint at last step, step 1000.", "Saving a model weights only
            # checkpoint in torch.bfloat16 at last step, step 1000.")
            r"(?i)saving (?:the |model )?checkpoint|saving a (?:full|model (?:weights )?only) checkpoint|"
            # "checkpointing" alone, but not activation/gradient checkpointing settings nor a module's file name
            # (DeepSpeed: "[checkpointing.py:540:forward] Activation Checkpointing Information")
            r"(?<!activation )(?<!gradient )(?<!cpu )(?<!memory )\bcheckpointing\b"
            r"(?!\.py|\s+(?:information|active|enabled|disabled|false|true)\b)|"
            r"writing checkpoint|save_checkpoint|"
            # DeepSpeed, deepspeed/runtime/checkpoint_engine/torch_checkpoint_engine.py (create):
            # "[Torch] Checkpoint global_step2000 is about to be saved!"; engine.py: "Copying NVMe offload files
            # from /nvme to /ckpt/global_step2000/offloaded_tensors/rank00, 812.31 GB free on target filesystem..."
            r"checkpoint \S+ is about to be saved|copying nvme offload files|"
            # Hugging Face Accelerate, accelerate/accelerator.py (save_state): "Saving current state to /out/ckpt"
            r"saving current state to|"
            # PyTorch Lightning (and NeMo's subclass), src/lightning/pytorch/callbacks/model_checkpoint.py:
            # "Epoch 3, global step 4000: 'val_loss' reached 0.12345 (best 0.12345), saving model to '/ckpt/...'
            # as top 3" (validation is over, the save begins; it prints no end)
            r"global step \d+: .*saving model to"
        ),
        "checkpoint",
        True,
    ),
    (
        re.compile(
            r"(?i)evaluation (?:done|finished|complete)|validation (?:done|end)|end of validation|"
            # Megatron-LM, megatron/training/training.py (evaluate_and_print_results): " validation loss at
            # iteration 2000 | lm loss value: ..." (newer: "... at iteration 2000 on validation set | ..."; at the
            # end: "validation loss at the end of training for val data | ...")
            r"validation loss at (?:iteration \d+|the end of training)"
        ),
        "eval",
        False,
    ),
    (
        re.compile(
            # Hugging Face Trainer, transformers/trainer.py (evaluation_loop): "***** Running Evaluation *****";
            # Megatron-LM, megatron/training/training.py (evaluate, verbose): "Evaluating on 512 samples",
            # "Evaluating iter 1/10"
            r"(?i)running evaluation|\bevaluating\b|validation (?:start|loop)|starting evaluation"
        ),
        "eval",
        True,
    ),
)

# A line that says a save or an evaluation failed is a failure, never a pause boundary
# ("Failed saving model checkpoint to …", "could not save checkpoint").
_FAILURE = re.compile(r"(?i)\b(?:fail(?:ed|ure|s|ing)?|could not|couldn't|cannot|can't|unable to|error|exception)\b")

# Every marker above needs one of these words: they are looked for first, in one Aho-Corasick pass over the
# lower-cased line, so an ordinary line costs a fraction of a microsecond (a case-insensitive regex, ~3 µs).
_PREFILTER = ahocorasick_rs.AhoCorasick(
    [
        "checkpoint",
        "evaluat",
        "validation",
        "saving current state",
        "random states saved",
        "saving model to",
        "copying nvme",
        "copying complete",
    ]
)


def phase_marker(line: str) -> tuple[str, bool] | None:
    """``(phase, starts)`` when the line marks a benign phase boundary."""
    if not _PREFILTER.find_matches_as_indexes(line.lower()):
        return None
    for pattern, phase, starts in _MARKERS:
        if pattern.search(line):
            return None if _FAILURE.search(line) else (phase, starts)
    return None
