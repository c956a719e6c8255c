"""Step lines read by slicing where their shape matched before read exactly what a search of each reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.detectors import lines, progress_parsers
from trainguard.detectors.literals import ShapedPattern, shape
from trainguard.detectors.progress_parsers import parse_progress
from trainguard.detectors.settings import SiteSignature
from trainguard.detectors.signatures import use_site_signatures

_NUMBER = st.one_of(
    st.integers(0, 10**9).map(str),
    st.floats(0, 1e6, allow_nan=False).map(lambda x: f"{x:.{len(str(int(x))) % 4}f}"),
    st.floats(1e-9, 1e9, allow_nan=False).map(lambda x: f"{x:.3E}"),
    st.integers(1000, 10**7).map(lambda n: f"{n:,}"),
)
_TEMPLATES = [
    "[default0]: iteration {} /  {} | consumed samples: {} | elapsed time per iteration (ms): {} | lm loss: {} |",
    " iteration      {}/  {} | elapsed time per iteration (s): {} | samples per second: {} | loss {}",
    "iteration {}/{} | elapsed time per iteration (ms): {} | samples per second: {} | {} nan iterations",
    "[rank0]: step: {}  loss: {}  memory: {}GiB({}%)  tps: {}  mfu: 30.2%",
    "step: {} tps: {} loss {} grad {} at {}",
    "iteration {} | elapsed time per iteration {} (ms) {} {} {}",  # no match: the shape remembers that too
]


def _line(template: str, numbers: list[str]) -> str:
    return template.format(*numbers)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.sampled_from(_TEMPLATES), st.lists(st.lists(_NUMBER, min_size=5, max_size=5), min_size=2, max_size=6))
def test_lines_of_a_remembered_shape_parse_as_searched_lines_do(template: str, rows: list[list[str]]):
    for numbers in rows:
        line = _line(template, numbers)
        # The same line once more with each digit changed: its shape is the first line's, seen just before.
        twin = line.translate(str.maketrans("0123456789", "7890123456"))
        for text in (line, twin):
            assert parse_progress(text, line_shape=shape(text)) == parse_progress(text)


def test_a_step_line_of_a_known_shape_is_read_without_searching_it(monkeypatch: pytest.MonkeyPatch):
    first = "iteration      120/  500000 | elapsed time per iteration (ms): 4247.9 | samples per second: 7.5 |"
    assert parse_progress(first, line_shape=shape(first)) == (120, 4.2479, None, 7.5)
    searched = []
    pattern = progress_parsers._MEGATRON
    real = pattern.regex
    monkeypatch.setattr(pattern, "regex", _Spy(real, searched))
    line = "iteration      121/  500000 | elapsed time per iteration (ms): 4301.2 | samples per second: 7.4 |"
    assert parse_progress(line, line_shape=shape(line)) == (121, 4.3012, None, 7.4)
    assert searched == []
    other = "iteration      1210/  500000 | elapsed time per iteration (ms): 4301.2 | samples per second: 7.4 |"
    assert parse_progress(other, line_shape=shape(other)).step == 1210
    assert searched == [other]  # a new shape: searched once


class _Spy:
    def __init__(self, regex, calls: list[str]) -> None:
        self._regex, self._calls = regex, calls
        self.groups = regex.groups

    def search(self, line: str):
        self._calls.append(line)
        return self._regex.search(line)


def test_a_pattern_that_names_a_digit_is_refused():
    with pytest.raises(ValueError, match="digit-blind"):
        ShapedPattern(r"exit code 1\d")


def test_remembered_shapes_are_bounded():
    pattern = ShapedPattern(r"step (\d+)", max_shapes=3)
    for width in range(1, 10):
        line = "step " + "1" * width
        assert pattern.spans(line, shape(line)) == ((0, 5 + width), (5, 5 + width))
    assert len(pattern._at) <= 3


# Step lines whose shape the line reader may remember as "progress and nothing else", and lines of a step
# line's shape that say more: a fault that depends on their digits, a redrawn bar, a validation's end.
_READ_TEMPLATES = [
    *_TEMPLATES,
    "iteration {}/ {} | elapsed time per iteration (ms): {} | loss_scale: {} | grad norm: {} |",
    "iteration {}/ {} | elapsed time per iteration (ms): {} | lm loss: {} |\riteration {}/ 9 | loss_scale: 0.5",
    "validate step: {}  loss: {}  tps: {}  memory: {}GiB  step: {}",
]


def _read_afresh(line: str) -> lines.LineReading:
    lines._STEP_SHAPES.clear()
    return lines.read_line(line)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(_READ_TEMPLATES), st.lists(st.lists(_NUMBER, min_size=5, max_size=5), min_size=2, max_size=6))
def test_lines_of_a_remembered_step_shape_read_as_a_fresh_reader_reads_them(template: str, rows: list[list[str]]):
    texts = []
    for numbers in rows:
        line = _line(template, numbers)
        twin = line.translate(str.maketrans("0123456789", "7890123456"))  # the same shape
        texts += [line, twin, line]  # each read after a line of its shape
    expected = [_read_afresh(text) for text in texts]
    lines._STEP_SHAPES.clear()
    assert [lines.read_line(text) for text in texts] == expected


def test_a_step_shape_is_remembered_only_while_the_signatures_stay():
    line = (
        "iteration      121/  500000 | elapsed time per iteration (ms): 4301.2 | consumed samples: 7 | "
        "number of nan iterations:   0 |"
    )
    lines._STEP_SHAPES.clear()
    assert lines.read_line(line) == lines.read_line(line) == ((121, 4.3012, None, None), None)
    assert shape(line) in lines._STEP_SHAPES
    try:
        use_site_signatures(
            [SiteSignature(id="slow", pattern=r"consumed samples: 7 ", category="slow_io", layer="system_software")]
        )
        reading = lines.read_line(line)
        assert type(reading) is lines.Progress and reading.match.signature.id == "site:slow"
    finally:
        use_site_signatures([])
    assert lines.read_line(line).match is None


def test_a_step_shape_whose_fault_depends_on_its_digits_is_not_remembered():
    template = "iteration {}/ 100 | elapsed time per iteration (ms): 12.5 | loss_scale: {} | grad norm: 1 |"
    lines._STEP_SHAPES.clear()
    assert lines.read_line(template.format(5, "7.0")).match is None
    collapsed = lines.read_line(template.format(6, "0.3")).match  # the same shape: the scale fell below 1
    assert collapsed is not None and collapsed.signature.id == "loss_scale_collapse"


@pytest.mark.parametrize(
    "line",
    [
        "[rank0]: step: 40  loss:  7.1234  memory: 30.1GiB(40.2%)  tps: 5,320  mfu: 30.2%",  # a word for an anchor
        "iteration      12/  345 | elapsed time per iteration (ms): 81.5 |",  # no word of the pre-filter's
    ],
)
def test_step_lines_the_catalogue_would_turn_away_are_remembered_by_shape(line):
    lines._STEP_SHAPES.clear()
    first = lines.read_line(line)
    assert type(first) is lines.Progress and first.match is None
    assert shape(line) in lines._STEP_SHAPES
