"""Match log lines against the signature catalogue (:mod:`detectors.catalogue`).

:func:`match_line` returns the first catalogue signature a line matches, with the
fields it carries, *refined* by the code in the line: an Xid takes its layer,
transience and remedy from NVIDIA's catalog (:mod:`detectors.xid`), a rank's
exit status names the signal that killed it.

>>> m = match_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
>>> m.signature.category, m.signature.layer, m.signature.remedy, m.fields["xid"], m.fields["pci"]
('xid_79', 'hardware', 'RESTART_BM', '79', '0000:3b:00')
>>> m = match_line("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
...                "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds")
>>> m.signature.cascade, m.fields["op"], m.fields["seqnum"], m.fields["timeout_ms"]
(True, 'ALLREDUCE', '469508', '1800000')
>>> match_line("failed (exitcode: -9) local_rank: 0 (pid: 5275)").signature.layer
'system'
>>> match_line("NVRM: Xid (PCI:0000:9b:00): 45, pid=7, Ch 0008 caused by previous Xid 149").signature.category
'xid_149'
>>> match_line("iteration 10/ 100 | elapsed time per iteration (ms): 512.3 | number of nan iterations: 0") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import ahocorasick_rs

from trainguard.detectors.catalogue import (
    CATALOGUE,
    ENVELOPE,
    EXIT,
    FAMILIES,
    FATAL_LOOKING,
    PREFILTER_PATTERN,
    PREFILTER_WORDS,
    XID,
    Signature,
)
from trainguard.detectors.literals import alternatives, digit_blind, required_literals, shape
from trainguard.detectors.settings import SiteSignature
from trainguard.detectors.xid import xid_info

__all__ = [
    "CATALOGUE",
    "Signature",
    "SignatureMatch",
    "classify_text",
    "family_of",
    "looks_fatal",
    "match_line",
    "use_site_signatures",
]


@dataclass(frozen=True, slots=True)
class SignatureMatch:
    signature: Signature
    fields: dict[str, str]


_SIGNALS = {-6: "SIGABRT", -7: "SIGBUS", -9: "SIGKILL", -11: "SIGSEGV", -15: "SIGTERM"}
_KILLED = frozenset({"SIGKILL", "SIGSEGV", "SIGBUS"})
# The refined id of a launcher's report of a worker killed by one of those signals (elastic_exitcode_sigkill, …).
KILLED_PREFIX = f"{EXIT}_sig"


def family_of(category: str) -> str:
    """The coarse family of a category, as operators and the corpus labels group failures.

    >>> family_of("xid_79"), family_of("xid_48"), family_of("cuda_device_assert")
    ('gpu_xid_hardware', 'ecc_error', 'cuda_error')
    """
    if category in FAMILIES:
        return FAMILIES[category]
    if category.startswith("xid_"):
        code = category[4:].split("_", 1)[0]
        return xid_info(int(code)).family if code.isdigit() else "gpu_xid_hardware"
    if category.startswith("cuda_"):
        return "cuda_error"
    return "other"


def looks_fatal(line: str) -> bool:
    """Whether a line that matched no signature still looks like a failure (kept, never dropped).

    >>> looks_fatal("terminate called after throwing an instance of 'c10::Error'"), looks_fatal("step 5 loss 1.2")
    (True, False)
    """
    return FATAL_LOOKING.search(clip(line)) is not None


# The pattern's pieces are not plain words: their anchors ("inf", "GPU", "D ") only send a line
# on to the pattern itself, which is searched only then.
_ANCHORS = ("inf", "Inf", "GPU", "D ")
_WORDS = ahocorasick_rs.AhoCorasick([*PREFILTER_WORDS, *_ANCHORS])
_FIRST_ANCHOR = len(PREFILTER_WORDS)


def could_match(line: str) -> bool:
    """The pre-filter: whether ``line`` could match any signature at all."""
    # Overlapping: a short anchor ("D ") that ends first must not hide a word it overlaps ("BAD TERMINATION").
    found = _WORDS.find_matches_as_indexes(line, overlapping=True)
    if not found:
        return False
    if any(index < _FIRST_ANCHOR for index, _, _ in found):
        return True
    return PREFILTER_PATTERN.search(line) is not None


# A line longer than this is matched on its head and tail only: every pattern then costs at most a
# fixed amount (some scan ``.*``), and a message printed at the end of a long progress-bar line, or
# at the start of a huge dump, is still seen.
MAX_MATCHED_CHARS = 8192


def clip(line: str) -> str:
    """``line``, or its first and last 4 KiB when it is longer than :data:`MAX_MATCHED_CHARS`.

    >>> len(clip("x" * 100_000)), clip("short")
    (8193, 'short')
    """
    if len(line) <= MAX_MATCHED_CHARS:
        return line
    half = MAX_MATCHED_CHARS // 2
    return f"{line[:half]}\n{line[-half:]}"


_ENVELOPE = re.compile("^" + ENVELOPE)


def strip_envelope(line: str) -> str:
    """``line`` without what launchers and collectors put in front of it (rank, host, stamp, level).

    >>> strip_envelope("(RayTrainWorker pid=4821) [rank3]: of memory while trying to allocate")
    'of memory while trying to allocate'
    """
    return line[_ENVELOPE.match(line).end() :]  # type: ignore[union-attr]  # the envelope may be empty


_site: tuple[Signature, ...] = ()
# Memos keyed by line shape whose entries hold while the signatures stay as they are (see shape_memo).
_SHAPE_MEMOS: list[dict[bytes, Any]] = []


def shape_memo() -> dict[bytes, Any]:
    """A new dict for what a line's shape says once the signatures have been asked about it:
    :func:`use_site_signatures` empties it, since other signatures may read that shape otherwise."""
    memo: dict[bytes, Any] = {}
    _SHAPE_MEMOS.append(memo)
    return memo


def never_matches(line: str, line_shape: bytes) -> bool:
    """Whether :func:`match_line` finds nothing in any line of this shape (no longer than
    :data:`MAX_MATCHED_CHARS`), ``line`` being one it found nothing in. Each signature plan that does not
    know the shape yet searches ``line`` in full for it, once: a line the catalogue's pre-filter turned away
    has left no trace (the pre-filter's words hold digits, so its answer may differ for other lines of the
    shape; the full search, which finds nothing either where the pre-filter did, says what would).

    >>> line = "[rank0]: step: 40  loss:  7.1234  memory: 30.1GiB(40.2%)  tps: 5,320  mfu: 30.2%"
    >>> match_line(line), never_matches(line, shape(line))
    (None, True)
    >>> scale = "iteration 7/ 9 | elapsed time per iteration (ms): 5.1 | loss_scale: 2.5 |"
    >>> match_line(scale), never_matches(scale, shape(scale))  # "loss_scale: 0.5" would: the digits decide
    (None, False)
    """
    for plan in (_plan(_site), _plan(CATALOGUE)) if _site else (_plan(CATALOGUE),):
        if not plan.knows(line_shape):
            plan.search(line, line_shape)  # (nothing found, as in match_line: the shape is remembered)
        if not plan.never_matches(line_shape):
            return False
    return True


def use_site_signatures(signatures: Iterable[SiteSignature]) -> None:
    """Try this site's own signatures (``detectors.signatures`` in the config) before the catalogue.

    Set for the whole process, where the flow is built from its settings (in every worker
    process, after the fork): the last flow built decides. An empty list clears them.

    >>> use_site_signatures([SiteSignature(id="fm-port", pattern=r"fabricmanager: port \\d+ flapped",
    ...                                    category="ib_link", layer="hardware", transient=True)])
    >>> m = match_line("fabricmanager: port 17 flapped")
    >>> m.signature.id, m.signature.category, m.signature.layer
    ('site:fm-port', 'ib_link', 'hardware')
    >>> use_site_signatures([]); match_line("fabricmanager: port 17 flapped") is None
    True
    """
    global _site
    _site = tuple(
        Signature(
            f"site:{s.id}",
            s.pattern,
            s.category,
            s.layer,
            kind=s.kind,
            transient=s.transient,
            # A notice or a storm counts lines (a storm of one for a notice), like the catalogue's warnings.
            severity="warning" if s.notice or s.storm else "fatal",
            storm=max(s.storm, 1) if s.notice or s.storm else 0,
            notice=s.notice,
            remedy=s.remedy,
        )
        for s in signatures
    )
    for memo in _SHAPE_MEMOS:  # (after: what a line of a shape reads as may now differ)
        memo.clear()


class _Plan:
    """Which patterns of a tuple of signatures are worth searching in a line.

    Each pattern is cut into its top-level alternatives (:func:`~trainguard.detectors.literals.alternatives`)
    and each alternative's required strings (:func:`~trainguard.detectors.literals.required_literals`) go into
    one Aho-Corasick automaton (one for case-insensitive strings, over the lower-cased line). A line is
    searched only with the alternatives one of whose strings it holds, signature by signature in order; the
    first signature one of whose alternatives matches is searched whole, for its fields — the same first
    match as searching every pattern.

    Lines that matched nothing are remembered by their *shape* (every digit written as ``0``): a step line
    printed again with other numbers has the same shape, and no :func:`~trainguard.detectors.literals.digit_blind`
    alternative can match it either; only the others (an Xid's number, an exit status) are searched again.
    """

    def __init__(self, signatures: tuple[Signature, ...]) -> None:
        self.signatures = signatures
        words: dict[tuple[str, bool], int] = {}
        # Every alternative of every signature, in order: (its signature's index, its regex).
        self.branches: list[tuple[int, re.Pattern[str]]] = []
        self.always: list[int] = []  # alternatives bounded by no string: always searched
        # Alternatives that may tell one digit from another, so also a line from its shape.
        self.sees_digits: set[int] = set()
        # Shapes of lines no alternative matched -> the digit-seeing alternatives that were worth searching,
        # and whether a line of that shape may hold a string with a digit in it (see _Lookup.may_hold).
        self._unmatched: dict[bytes, tuple[list[int], bool]] = {}
        # Alternatives of signatures with anchors, none holding a digit -> those anchors (see _first_match).
        self._anchored: dict[int, tuple[str, ...]] = {}
        by_word: dict[int, set[int]] = {}
        for index, sig in enumerate(signatures):
            pieces = alternatives(sig.pattern)
            for piece in pieces:
                branch = len(self.branches)
                self.branches.append((index, sig.regex if len(pieces) == 1 else re.compile(piece)))
                found = required_literals(piece)
                if found is None:
                    self.always.append(branch)
                for word in found or ():
                    by_word.setdefault(words.setdefault(word, len(words)), set()).add(branch)
                if not digit_blind(piece) or _has_digit(sig.anchors):
                    self.sees_digits.add(branch)
                if sig.anchors and not _has_digit(sig.anchors):
                    self._anchored[branch] = sig.anchors
        self.by_word = {word: frozenset(branches) for word, branches in by_word.items()}
        exact = [(w, i) for (w, folded), i in words.items() if not folded]
        folded = [(w, i) for (w, is_folded), i in words.items() if is_folded]
        self._exact_ids = [i for _, i in exact]
        self._folded_ids = [i for _, i in folded]
        self._exact_ac = ahocorasick_rs.AhoCorasick([w for w, _ in exact]) if exact else None
        self._folded_ac = ahocorasick_rs.AhoCorasick([w for w, _ in folded]) if folded else None
        # Strings that hold a digit: a line of a known shape may hold them or not, so they are looked for anew.
        digit_words = [(w, folded, self.by_word[i]) for (w, folded), i in words.items() if _has_digit(w)]
        self._digit_words = _Lookup(digit_words)

    def present(self, line: str) -> set[int]:
        """The ids of the required strings in ``line`` (case-insensitive ones in its lower-case form; all
        of those when the line is not ASCII, where case-folding is not plain lower-casing)."""
        found: set[int] = set()
        if self._exact_ac is not None:
            ids = self._exact_ids
            found.update(ids[i] for i, _, _ in self._exact_ac.find_matches_as_indexes(line, overlapping=True))
        if self._folded_ac is not None:
            if line.isascii():
                ids = self._folded_ids
                hits = self._folded_ac.find_matches_as_indexes(line.lower(), overlapping=True)
                found.update(ids[i] for i, _, _ in hits)
            else:
                found.update(self._folded_ids)
        return found

    def candidates(self, line: str) -> list[int]:
        """The alternatives worth searching in ``line`` — those one of whose strings it holds, and those
        bounded by none — as indexes into :attr:`branches`, in the signatures' order."""
        by_word = self.by_word
        found = set(self.always)
        for word in self.present(line):
            branches = by_word.get(word)
            if branches is not None:
                found |= branches
        return sorted(found)

    def search(
        self, line: str, line_shape: bytes | None, could_match: Callable[[str], bool] | None = None
    ) -> SignatureMatch | None:
        """The first signature matching ``line``, with the fields it and the line carry; ``line_shape``, its
        :func:`shape`; ``could_match``, a pre-filter to try first (a line of a known shape needs none)."""
        remembered = self._unmatched.get(line_shape) if line_shape is not None else None
        if remembered is not None:
            known, digit_words = remembered
            more = self._digit_words.branches(line) if digit_words else None
            found = self._first_match(line, sorted(more.union(known)) if more else known)
            # (The pre-filter's words hold digits too: a line it turns away finds nothing, whatever its shape.)
            return None if found is None or (could_match is not None and not could_match(line)) else found
        if could_match is not None and not could_match(line):
            return None
        candidates = self.candidates(line)
        found = self._first_match(line, candidates)
        if found is None and line_shape is not None:
            if len(self._unmatched) >= MAX_SHAPES:
                self._unmatched.clear()
            seeing, anchored = self.sees_digits, self._anchored
            # A digit-seeing alternative none of whose anchors (words without digits) is in the line is in no
            # line of its shape either: the shape keeps every character that is not a digit.
            self._unmatched[line_shape] = (
                [i for i in candidates if i in seeing and (i not in anchored or any(w in line for w in anchored[i]))],
                self._digit_words.may_hold(line_shape),
            )
        return found

    def knows(self, line_shape: bytes) -> bool:
        """Whether a line of this shape was searched in full and matched nothing."""
        return line_shape in self._unmatched

    def never_matches(self, line_shape: bytes) -> bool:
        """Whether no line of this shape can match: one did not, and no alternative that could tell its digits
        apart was worth searching in it."""
        remembered = self._unmatched.get(line_shape)
        return remembered is not None and not remembered[0] and not remembered[1]

    def _first_match(self, line: str, candidates: list[int]) -> SignatureMatch | None:
        signatures, branches = self.signatures, self.branches
        skipped = -1  # a signature whose anchors are not in the line
        for candidate in candidates:
            index, branch = branches[candidate]
            if index == skipped:
                continue
            sig = signatures[index]
            if sig.anchors and not any(word in line for word in sig.anchors):
                skipped = index
                continue
            m = branch.search(line)
            if m is None:
                continue
            if branch is not sig.regex:  # one alternative matched: the whole pattern's match gives the fields
                m = sig.regex.search(line)
                if m is None:  # (cannot be)
                    continue
            fields = {k: v for k, v in m.groupdict().items() if v is not None}
            if sig.extract_regex is not None:
                extra = sig.extract_regex.search(line)
                if extra is not None:
                    fields.update({k: v for k, v in extra.groupdict().items() if v is not None})
            rank = _RANK.search(line)
            if rank is not None:
                fields.setdefault("rank", rank[1])
            return SignatureMatch(sig, fields)
        return None


class _Lookup:
    """Strings to look for in an ASCII line (some case-insensitive), each standing for a set of alternatives.

    One automaton over the lower-cased line finds them all: a string found there that must match case is
    then looked for as it is.
    """

    def __init__(self, words: list[tuple[str, bool, frozenset[int]]]) -> None:
        by_lower: dict[str, list[tuple[str, bool, frozenset[int]]]] = {}
        for word in words:
            by_lower.setdefault(word[0].lower(), []).append(word)
        self._words = list(by_lower.values())
        self._ac = ahocorasick_rs.AhoCorasick(list(by_lower)) if words else None
        # (A string that is not ASCII is never in a line that has a shape.)
        self._shapes = {word_shape for word in by_lower if (word_shape := shape(word)) is not None}

    def may_hold(self, line_shape: bytes) -> bool:
        """Whether a line of ``line_shape`` (its digits written as ``0``) may hold one of the strings: a line
        that holds one has that string's shape where the string is (lower-casing and the shape commute)."""
        folded = line_shape.lower()
        return any(word in folded for word in self._shapes)

    def branches(self, line: str) -> set[int]:
        """The alternatives of the strings ``line`` holds."""
        found: set[int] = set()
        if self._ac is not None:
            words = self._words
            for i, _, _ in self._ac.find_matches_as_indexes(line.lower(), overlapping=True):
                for word, folded, branches in words[i]:
                    if folded or word in line:
                        found |= branches
        return found


MAX_SHAPES = 4096  # shapes of unmatched lines remembered per catalogue (a stream of one-off lines must not grow it)


def _has_digit(texts: Iterable[str]) -> bool:
    return any(char.isdigit() for text in texts for char in text)


_PLANS: dict[int, _Plan] = {}


def _plan(signatures: tuple[Signature, ...]) -> _Plan:
    plan = _PLANS.get(id(signatures))
    if plan is None or plan.signatures is not signatures:
        plan = _PLANS[id(signatures)] = _Plan(signatures)
    return plan


def match_line(line: str, *, line_shape: bytes | None = None) -> SignatureMatch | None:
    """The first site or catalogue signature matching ``line``, with extracted fields. ``line_shape``: the
    line's :func:`shape`, when the caller has it (of a line no longer than :data:`MAX_MATCHED_CHARS`, which
    is then matched whole: only a longer line is clipped)."""
    if line_shape is None:
        line = clip(line)
        line_shape = shape(line)
    site = _plan(_site).search(line, line_shape) if _site else None
    if site is not None:
        return site
    found = _plan(CATALOGUE).search(line, line_shape, could_match)
    return None if found is None else SignatureMatch(_refine(found.signature, found.fields), found.fields)


_NVLINK5_XIDS = frozenset(str(code) for code in range(144, 151))
_RANK = re.compile(r"\[(?:rank|Rank )(\d{1,6})\]")
_REFINED: dict[tuple[str, str], Signature] = {}


def _first(fields: dict[str, str], *names: str) -> str | None:
    return next((fields[n] for n in names if n in fields), None)


def _refine(sig: Signature, fields: dict[str, str]) -> Signature:
    """Signatures whose meaning depends on a code: an Xid's number, a rank's exit status."""
    if sig.category == "xid":
        # The Xid named as the cause first; then whichever of the pattern's alternatives caught the code.
        code_text = _first(fields, "cause_xid", "xid", *(f"xid{n}" for n in range(2, 10)))
        if code_text is None:
            return sig
        fields["xid"] = code_text
        # NVLink 5 Xids (144-150) say themselves whether they were fatal; a Nonfatal one is told, never
        # acted on (gpud reads them the same way). Named as the cause of a torn-down channel, it was fatal.
        nonfatal = "xid_severity" in fields and "cause_xid" not in fields and code_text in _NVLINK5_XIDS
        key = (sig.id, code_text + ("-nonfatal" if nonfatal else ""))
        if key not in _REFINED:
            info = xid_info(int(code_text))
            evidence = info.evidence_only or nonfatal
            _REFINED[key] = replace(
                sig,
                id=(f"{XID}_{info.code}" if sig.id == XID else f"{sig.id}_{info.code}")
                + ("_nonfatal" if nonfatal else ""),
                category=f"xid_{info.code}",
                layer=info.layer,
                transient=info.transient,
                cascade=info.cascade,
                severity="warning" if evidence else "fatal",
                remedy=None if nonfatal else info.remedy,
                # NVIDIA says to ignore it alone; a burst on one GPU is a part going bad. A Nonfatal NVLink
                # error is rare on a healthy fabric: told at once.
                storm=(1 if nonfatal else 3) if evidence else 0,
                storm_window_s=3600.0,
                kind="gpu_degraded" if evidence else sig.kind,
                notice=evidence,
            )
        return _REFINED[key]
    if sig.id == EXIT:
        code_text = _first(fields, "exit_code", "exit_code2")
        if code_text is None:
            return sig
        fields["exit_code"] = code_text
        signal = _SIGNALS.get(int(code_text))
        if signal is not None:
            fields["signal"] = signal
        if signal in _KILLED:
            # A worker killed by a signal prints nothing itself (SIGKILL cannot be caught): the launcher's
            # report is the first and only word of it, so it is a root cause, not the cascade an exit code
            # usually is. SIGTERM and SIGABRT are not: the launcher sends the first to the survivors, and
            # NCCL's watchdog aborts with the second after a timeout it has already printed.
            key = (sig.id, signal)
            if key not in _REFINED:
                _REFINED[key] = replace(sig, id=f"{KILLED_PREFIX}{signal[3:].lower()}", cascade=False)
            return _REFINED[key]
    return sig


def classify_text(text: str) -> SignatureMatch | None:
    """The signature that names a multi-line excerpt: the first root error, else the first cascade or warning."""
    first: SignatureMatch | None = None
    for line in text.splitlines():
        m = match_line(line)
        if m is None:
            continue
        if not m.signature.cascade and m.signature.severity != "warning" and not m.signature.weak:
            return m
        first = first or m
    return first
