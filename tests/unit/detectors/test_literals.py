"""The literal pre-filter of the signature search never changes which signature a line matches."""

from __future__ import annotations

import json
import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.paths import FIXTURES
from trainguard.detectors.catalogue import CATALOGUE
from trainguard.detectors.literals import digit_blind, required_literals, shape
from trainguard.detectors.signatures import _plan, clip


def _every_pattern(line: str) -> str | None:
    """The first signature matching ``line``, searching every pattern (what the pre-filter must equal)."""
    for sig in CATALOGUE:
        if sig.anchors and not any(word in line for word in sig.anchors):
            continue
        if sig.regex.search(line):
            return sig.id
    return None


def _planned(line: str) -> str | None:
    found = _plan(CATALOGUE).search(line, shape(line))
    return None if found is None else found.signature.id


def _fixture_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(FIXTURES.glob("*.jsonl")):
        if path.name.startswith("sealed-"):
            continue  # the sealed holdout is read by its own evaluation only
        for raw in path.read_text().splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                for key in ("line", "text", "excerpt"):
                    if isinstance(record.get(key), str):
                        lines += record[key].splitlines()
    return lines


def test_the_planned_search_finds_what_searching_every_pattern_finds_on_real_lines():
    lines = [clip(line) for line in _fixture_lines()]
    assert len(lines) > 2000
    matched = 0
    for line in lines:
        expected = _every_pattern(line)
        assert _planned(line) == expected, line
        matched += expected is not None
    assert matched > 300  # the lines exercise the signatures, not just the misses


def test_nearly_every_catalogue_pattern_is_bounded_and_its_strings_are_in_what_it_matches():
    bounded = [required_literals(sig.pattern) for sig in CATALOGUE]
    assert sum(b is not None for b in bounded) >= 0.9 * len(CATALOGUE)
    for line in _fixture_lines():
        for sig, need in zip(CATALOGUE, bounded, strict=True):
            m = sig.regex.search(line) if need is not None else None
            if m is not None:  # the matched text itself holds one of the strings
                text = m.group(0)
                assert any((w in text.lower()) if folded else (w in text) for w, folded in need), (sig.id, text)


_PIECES = sorted({text for sig in CATALOGUE for text, _ in (required_literals(sig.pattern) or ())})


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=12)), max_size=8))
def test_lines_built_from_the_patterns_own_strings_match_the_same(parts: list[str]):
    line = clip(" ".join(parts))
    assert _planned(line) == _every_pattern(line)


def test_lines_of_a_known_shape_with_other_numbers_match_what_searching_every_pattern_finds():
    # Each line with digits comes again with other digits (an Xid's code, an exit status, a port): the
    # shape remembered from the first must not hide a signature that tells the numbers apart.
    rnd = random.Random(5)
    lines = [clip(line) for line in _fixture_lines() if any(c.isdigit() for c in line) and line.isascii()]
    _plan(CATALOGUE)._unmatched.clear()
    for line in lines:
        _planned(line)
    assert len(_plan(CATALOGUE)._unmatched) > 200  # the variants below meet remembered shapes
    changed = 0
    for line in lines:
        for _ in range(3):
            variant = "".join(rnd.choice("0123456789") if c.isdigit() else c for c in line)
            expected = _every_pattern(variant)
            assert _planned(variant) == expected, variant
            changed += expected != _every_pattern(line)
    assert changed > 20  # numbers do decide some matches (the cache had something to get wrong)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from([sig.pattern for sig in CATALOGUE]), st.text(alphabet="0123456789 x:(", max_size=16))
def test_a_digit_blind_pattern_matches_a_line_exactly_when_it_matches_its_shape(pattern: str, tail: str):
    if not digit_blind(pattern):
        return
    regex = re.compile(pattern)
    for line in (f"{pattern[:40]} {tail}", f"{tail} Xid 79 exitcode: -9 status 12 {tail}"):
        shape = line.translate(str.maketrans("123456789", "000000000"))
        assert (regex.search(line) is None) == (regex.search(shape) is None)


def test_digit_blindness_is_refused_to_patterns_that_name_digits():
    assert not digit_blind(r"Caught signal 7")
    assert not digit_blind(r"port [1-4] down")
    assert not digit_blind(r"(?P<n>\d+) of (?P=n)")
    assert digit_blind(r"[^0-9]+\d{2,5} [\w.-]+ \b(?i:nan)\b")
    assert sum(not digit_blind(sig.pattern) for sig in CATALOGUE) >= 10


def test_a_remembered_shape_does_not_let_a_line_past_the_pre_filter():
    # The pre-filter's words hold digits too ("mlx5", "c10d"): a line it turns away must find nothing even when a
    # line of the same shape that it let through was remembered.
    from trainguard.detectors.signatures import match_line

    for let_through, turned_away in (
        ("mlx5 Exit CODE: 131", "mlx4 Exit CODE: 137"),
        ("c10d MLX1_CORE: LINK SPEED degraded", "c20d MLX5_CORE: LINK SPEED degraded"),
    ):
        _plan(CATALOGUE)._unmatched.clear()
        alone = match_line(turned_away)
        match_line(let_through)
        after = match_line(turned_away)
        assert (after is None) == (alone is None) and (after is None or after.signature.id == alone.signature.id)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_a_line_that_holds_a_string_with_a_digit_has_a_shape_that_may_hold_it(data: st.DataObject):
    # A remembered shape skips looking for the strings with digits only when no line of it can hold one.
    lookup = _plan(CATALOGUE)._digit_words
    word = data.draw(st.sampled_from([w for group in lookup._words for w, _, _ in group]))
    around = st.text(alphabet="0123456789 abcXYZ:([", max_size=12)
    line = data.draw(around) + data.draw(st.sampled_from([word, word.upper(), word.lower()])) + data.draw(around)
    assert lookup.may_hold(shape(line))


def test_a_step_line_shape_holds_no_string_with_a_digit():
    lookup = _plan(CATALOGUE)._digit_words
    assert not lookup.may_hold(shape("iteration 120/ 500 | elapsed time per iteration (ms): 12.5 | lm loss: 2.1 |"))
    assert lookup.may_hold(shape("mlx7_core 0000:3b:00.0: port 1 link down"))
