"""Literal pieces every match of a regular expression must contain, read from the pattern itself.

A log line is tested against a hundred-odd signature patterns. Most lines share a word with
*some* pattern (Megatron prints "number of nan iterations: 0" on every step), and then every
pattern would be searched. :func:`required_literals` reads a pattern's syntax tree and returns
strings one of which any match must contain — the alternatives of the most selective
mandatory piece — so the search can skip a pattern whose strings are not in the line. It is
*sound*, never clever: optional parts, character classes, look-arounds and back-references
give nothing, an alternation gives something only when every branch does, and a pattern it
cannot bound is simply always searched. Each string says whether it is case-insensitive (from
``(?i)`` or ``(?i:…)``): those are lower-case, to be looked for in the lower-cased line.

>>> required_literals(r"NVRM: Xid \\(PCI:[0-9a-f:.]+\\): (?P<xid>\\d+)")
frozenset({('NVRM: Xid (PCI:', False)})
>>> sorted(required_literals(r"(?:CUDA out of memory|OutOfMemoryError)"))
[('CUDA out of memory', False), ('OutOfMemoryError', False)]
>>> sorted(required_literals(r"(?i:watchdog (?:caught|got stuck))|WatchdogTimeout"))
[('WatchdogTimeout', False), ('watchdog ', True)]
>>> required_literals(r"\\d+ errors?|x") is None  # a branch of one character bounds nothing useful
True
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

try:  # Python 3.11+
    from re import _constants as _c  # type: ignore[attr-defined]
    from re import _parser as _p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

MIN_LENGTH = 2  # a shorter string is in nearly every line: not worth a look-up
_ZEROS = bytes.maketrans(b"123456789", b"000000000")


@lru_cache(maxsize=2048)
def _tree(pattern: str) -> Any:
    """``pattern`` parsed, once for both readings of it (what it requires, whether it is digit-blind), which
    only read the tree: parsing is most of what a catalogue's plan costs at start-up."""
    return _p.parse(pattern)


Literal = tuple[str, bool]  # (text, case-insensitive: then lower-case)
Requirement = frozenset[Literal] | None


def required_literals(pattern: str) -> Requirement:
    """Strings one of which every match of ``pattern`` contains; ``None`` when it cannot tell."""
    try:
        tree = _tree(pattern)
    except (re.error, RecursionError):
        return None
    flags = tree.state.flags
    if flags & (re.VERBOSE | re.LOCALE):  # not used by the catalogue; keep the analysis simple
        return None
    return _sequence(list(tree), bool(flags & re.IGNORECASE))


def _sequence(items: list[tuple[Any, Any]], ignore_case: bool) -> Requirement:
    """The most selective requirement among a sequence's mandatory pieces (each one must match)."""
    candidates: list[frozenset[Literal]] = []
    run: list[str] = []

    def close_run() -> None:
        if len(run) >= MIN_LENGTH:
            text = "".join(run)
            candidates.append(frozenset({(text.lower(), True) if ignore_case else (text, False)}))
        run.clear()

    for op, av in items:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        close_run()
        inner = _piece(op, av, ignore_case)
        if inner is not None:
            candidates.append(inner)
    close_run()
    return max(candidates, key=_selectivity, default=None)


def _piece(op: Any, av: Any, ignore_case: bool) -> Requirement:
    if op is _c.SUBPATTERN:
        _, add_flags, del_flags, sub = av
        if (add_flags | del_flags) & (re.VERBOSE | re.LOCALE):
            return None
        if add_flags & re.IGNORECASE:
            ignore_case = True
        elif del_flags & re.IGNORECASE:
            ignore_case = False
        return _sequence(list(sub), ignore_case)
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
        low, _, sub = av
        return _sequence(list(sub), ignore_case) if low >= 1 else None
    if op is _c.BRANCH:
        _, branches = av
        union: set[Literal] = set()
        for branch in branches:
            found = _sequence(list(branch), ignore_case)
            if found is None:
                return None  # one branch without a bound: the alternation has none
            union |= found
        return frozenset(union)
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return _sequence(list(av), ignore_case)
    return None  # classes, any, anchors, look-arounds, back-references: no literal


def _selectivity(strings: frozenset[Literal]) -> tuple[int, int]:
    """Fewer alternatives, then longer shortest string: the rarer requirement."""
    return (-len(strings), min(len(text) for text, _ in strings))


def alternatives(pattern: str) -> list[str]:
    """``pattern``'s top-level alternatives, each a pattern of its own: a line matches ``pattern`` exactly
    when it matches one of them. Searched one by one, each behind its own strings, a pattern that is mostly
    rare phrases does not cost a scan of every line that holds one common word. A pattern whose pieces
    cannot stand alone (global inline flags, group references, conditionals) is one alternative.

    >>> alternatives(r"CUDA error: (?P<what>[^|]+)|(?i:out of memory)|\\|x[|]y")
    ['CUDA error: (?P<what>[^|]+)', '(?i:out of memory)', '\\\\|x[|]y']
    >>> alternatives(r"(?i)nan|inf"), alternatives(r"(?P<a>x)|(?P=a)y")
    (['(?i)nan|inf'], ['(?P<a>x)|(?P=a)y'])
    """
    pieces: list[str] = []
    depth, start, i, in_class = 0, 0, 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # A ``]`` first in a class (after an optional ``^``) is a literal, not its end.
            i += 2 if pattern[i + 1 : i + 2] == "]" else 3 if pattern[i + 1 : i + 3] == "^]" else 1
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            pieces.append(pattern[start:i])
            start = i + 1
        i += 1
    pieces.append(pattern[start:])
    if len(pieces) == 1 or re.search(r"^\(\?[aiLmsux]+\)|\(\?P=|\(\?\(|\\[1-9]", pattern):
        return [pattern]
    try:
        for piece in pieces:
            re.compile(piece)
    except re.error:
        return [pattern]
    return pieces


_DIGITS = frozenset("0123456789")


def digit_blind(pattern: str) -> bool:
    """Whether ``pattern`` treats every ASCII digit alike: then it matches a line exactly when it matches the
    line with each digit written as ``0`` (the *shape* of a line whose numbers change, step after step).

    Every test the pattern makes on a character — a literal, a class, ``\\d``, ``\\w``, ``\\b`` — must give the
    same answer for each digit; a digit written out, a class holding some digits but not all, and a
    back-reference (equal digits in the shape need not be equal in the line) make it not blind.

    >>> digit_blind(r"iteration\\s+\\d+/\\s*\\d+ \\| (?i:lm loss): [\\w.+-]+"), digit_blind(r"[^|]{0,40}nan")
    (True, True)
    >>> digit_blind(r"Xid 79"), digit_blind(r"status [45]"), digit_blind(r"(?P<a>\\d)-(?P=a)")
    (False, False, False)
    """
    try:
        tree = _tree(pattern)
    except (re.error, RecursionError):
        return False
    return _blind(list(tree))


def shape(text: str) -> bytes | None:
    """``text`` with each digit written as ``0``: lines that differ only in their numbers share it, and a
    :func:`digit_blind` pattern matches them all alike, at the same places. ``None`` for text that is not
    ASCII (there lower-casing is not plain, and offsets in bytes are not offsets in characters).

    >>> shape("iteration 120/ 5000"), shape("λ 1")
    (b'iteration 000/ 0000', None)
    """
    return text.encode().translate(_ZEROS) if text.isascii() else None


def _blind(items: list[tuple[Any, Any]]) -> bool:
    for op, av in items:
        if op in (_c.LITERAL, _c.NOT_LITERAL):
            if chr(av) in _DIGITS:
                return False
        elif op is _c.IN:
            covered: set[str] = set()
            for item, value in av:
                if item is _c.LITERAL:
                    covered |= {chr(value)} & _DIGITS
                elif item is _c.RANGE:
                    covered |= {d for d in _DIGITS if value[0] <= ord(d) <= value[1]}
            if covered and covered != _DIGITS:
                return False
        elif op is _c.SUBPATTERN:
            if not _blind(list(av[3])):
                return False
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
            if not _blind(list(av[2])):
                return False
        elif op is _c.BRANCH:
            if not all(_blind(list(branch)) for branch in av[1]):
                return False
        elif op is getattr(_c, "ATOMIC_GROUP", None):
            if not _blind(list(av)):
                return False
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            if not _blind(list(av[1])):
                return False
        elif op not in (_c.ANY, _c.AT, _c.CATEGORY):
            return False  # back-references, conditionals, anything not read here: not blind
    return True


_UNSEEN = object()


class ShapedPattern:
    """A :func:`digit_blind` pattern that remembers where it matched lines of each :func:`shape`: a line of a
    shape it has seen is read by slicing, without searching it again (a framework prints its step line in
    one shape for hours, only the numbers change).

    >>> steps = ShapedPattern(r"step (?P<step>\\d+) loss (?P<loss>[\\d.]+)")
    >>> line = "step 41 loss 2.5"
    >>> spans = steps.spans(line, shape(line))
    >>> line[slice(*spans[1])], steps.spans("step 42 loss 2.4", shape("step 42 loss 2.4"))[2]
    ('41', (13, 16))
    >>> steps.spans("loss 2.4", None) is None
    True
    """

    def __init__(self, pattern: str, max_shapes: int = 4096) -> None:
        if not digit_blind(pattern):
            raise ValueError(f"{pattern!r} is not digit-blind: where it matches depends on more than a line's shape")
        self.regex = re.compile(pattern)
        self.max_shapes = max_shapes
        self._at: dict[bytes, tuple[tuple[int, int], ...] | None] = {}

    def spans(self, line: str, line_shape: bytes | None) -> tuple[tuple[int, int], ...] | None:
        """The spans of the whole match and of each group (``(-1, -1)`` for a group that took no part), as
        :meth:`re.Match.span` gives them; ``None`` when ``line`` does not match. ``line_shape``: ``shape(line)``
        (``None``: a line with no shape, searched every time)."""
        at = self._at
        if line_shape is not None:
            known = at.get(line_shape, _UNSEEN)
            if known is not _UNSEEN:
                return known  # type: ignore[return-value]
        m = self.regex.search(line)
        spans = None if m is None else tuple(m.span(group) for group in range(self.regex.groups + 1))
        if line_shape is not None:
            if len(at) >= self.max_shapes:
                at.clear()
            at[line_shape] = spans
        return spans
