"""The learnability measurement: out-of-group scores, and never a held-out part."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainguard.benchmarks.corpus import Excerpt
from trainguard.benchmarks.learnability import Labelled, fault_reader, labelled, layer_reader, open_parts


def _row(group: str, index: int, text: str, label: str, layer: str, category: str | None = None) -> Labelled:
    return Labelled(group, Excerpt(index, f"repo/{group} issue #{index}", text, label, layer), category, layer)


def test_held_out_parts_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    readable = tmp_path / "open.jsonl"
    readable.write_text("not JSON at all\n")  # were it read first, this would be the error
    held = tmp_path / "holdout.jsonl"
    held.write_text("")
    (tmp_path / "renamed.jsonl").symlink_to(held)
    for path in (held, tmp_path / "renamed.jsonl", Path("/nowhere/sealed-real-logs-7a.jsonl")):
        with pytest.raises(ValueError, match="held out"):
            labelled([readable, path])
    assert not any(p.name == "holdout.jsonl" or p.name.startswith("sealed-") for p in open_parts())


def test_one_group_or_one_kind_of_excerpt_is_refused_in_one_sentence(tmp_path: Path) -> None:
    healthy = tmp_path / "healthy.jsonl"
    healthy.write_text(
        '{"source": "a/b issue #1", "text": "step 1 loss 2.0", "label": "normal_progress", "layer": "application"}\n'
    )
    with pytest.raises(ValueError, match="at least two files"):
        labelled([healthy])
    with pytest.raises(ValueError, match="failure and healthy"):
        labelled([healthy, Path(shutil.copy(healthy, tmp_path / "healthy-too.jsonl"))])


def test_a_wording_learned_in_other_groups_flags_its_excerpt_and_healthy_ones_stay_below() -> None:
    rows = []
    for g in range(4):
        for i in range(6):
            rows.append(
                _row(f"g{g}", i, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom", "application")
            )
            rows.append(_row(f"g{g}", 10 + i, f"epoch {i} step 10 loss 1.2 lr 0.001", "normal_progress", "application"))
    # A failure its log does not show: it reads like progress, and is scored like it.
    rows.append(_row("g0", 99, "epoch 7 step 10 loss 1.2 lr 0.001", "process_crash", "system"))
    strict = fault_reader(rows, healthy_flagged=(0.0,))[0]
    assert strict.healthy_flagged == 0.0
    assert strict.faults_flagged == pytest.approx(24 / 25)  # all but the excerpt no line of which is a fault line
    assert strict.unrecognised_flagged == (0, 1)


def test_the_layer_reader_beats_the_category_majority_when_words_tell_the_layer() -> None:
    rows = []
    for g in range(4):
        for i in range(8):
            cause = (
                ("an uneven dataloader in user code", "application") if i % 2 else ("a flapping switch port", "system")
            )
            text = f"Watchdog caught collective operation timeout, {cause[0]}"
            rows.append(_row(f"g{g}", i, text, "nccl_timeout", cause[1], category="nccl_timeout"))
            rows[-1] = Labelled(rows[-1].group, rows[-1].excerpt, "nccl_timeout", "system")  # the catalogue says system
    result = layer_reader(rows)
    assert result.excerpts == 32
    assert result.catalogue == pytest.approx(0.5)
    assert result.category_majority == pytest.approx(0.5)
    assert result.learned > 0.9
