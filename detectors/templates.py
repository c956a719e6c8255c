"""Online log-template mining of one job's error lines, with drain3.

The signature catalogue recognises known failures; a fatal-looking line it does
not explain is reported as ``crash/unclassified``. :class:`ErrorTemplates`
groups a job's error-level lines into templates (drain3's ``TemplateMiner``,
with numbers, hex values, paths, IPs and times masked so that a template
covers every rank and node), so that an unclassified anomaly can say which
template its lines belong to and whether that template is new in this job, and
``trainguard templates`` can rank what the catalogue is missing.

It holds no I/O and is small: at most ``max_clusters`` templates (the least
recently seen one is forgotten first) and lines clipped to ``max_chars``. It
pickles compactly (Bytewax snapshots it): the templates, their counts and their
recency are saved, and the miner is rebuilt from them.

>>> t = ErrorTemplates()
>>> t.observe("iteration 10/100 | lm loss: 2.1 | elapsed time per iteration (ms): 812.5") is None
True
>>> hit = t.observe("[rank3]: RuntimeError: NCCL communicator was aborted on rank 3 after 1800000 ms")
>>> hit.template
'[rank<NUM>]: RuntimeError: NCCL communicator was aborted on rank <NUM> after <NUM> ms'
>>> hit.count, hit.new
(1, True)
>>> again = t.observe("[rank12]: RuntimeError: NCCL communicator was aborted on rank 12 after 600000 ms")
>>> again.template_id == hit.template_id, again.count, again.new
(True, 2, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from drain3 import TemplateMiner
from drain3.drain import LogCluster
from drain3.masking import MaskingInstruction
from drain3.template_miner_config import TemplateMinerConfig

__all__ = ["ERROR_LEVEL", "MASKS", "ErrorTemplates", "TemplateHit", "is_error_level"]

# Decides, in one search, whether a line is worth mining. Every alternative starts with a
# literal (grouped by first letter), so ``re`` scans for a small set of first characters
# instead of trying every alternative at every position: about 1 µs for a 100-character line.
# It covers everything ``detectors.catalogue.FATAL_LOOKING`` keeps, plus warnings.
ERROR_LEVEL = re.compile(
    r"E(?:rror|RROR|xception|\d{4} \d\d:)|F(?:ATAL|atal|ailed|AILED|\d{4} \d\d:)|W(?:ARN|\d{4} \d\d:)|"
    r"Traceback|Assert|Segmentation fault|Abort|Killed|CRITICAL|Interrupt|"
    r"e(?:rror|xit code|xit status|xited with)|f(?:atal|ailed)|terminate called|assert|core dumped|panic"
)

# drain3 masking, applied in order: specific shapes first, then any remaining number. Where it
# can, a pattern starts with the character class it needs and checks what precedes with a
# lookbehind after it, so that ``re`` skips ahead to candidates (a leading lookbehind or ``\b``
# makes it try every position). Masking an error line costs about 20 µs.
MASKS: tuple[tuple[str, str], ...] = (
    (r"\d(?<!\w\d)\d{3}-\d\d-\d\d(?:[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)?", "DATE"),
    (r"\d(?<!\w\d)\d?:\d\d:\d\d(?:[.,]\d+)?", "TIME"),
    (r"\d(?<!\w\d)\d{0,2}(?:\.\d{1,3}){3}(?::\d+)?\b", "IP"),
    (r"\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b", "PCI"),
    (r"/(?<![\w.-]/)[\w.@+-]+(?:/[\w.@+-]+)+/?", "PATH"),
    (r"0(?<!\w0)[xX][0-9a-fA-F]+\b", "HEX"),
    (r"\b(?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]{8,}\b", "HEX"),
    # A number on its own (``rank 3``, ``:607``, ``=1.5e-3``, ``2.18.1``) ...
    (r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?(?![\w.])", "NUM"),
    # ... or ending a name or a name's part (``rank3``, ``node-0042``, ``layers.12.mlp``), but not ``c10::``.
    (r"\d(?:(?<=[A-Za-z_-]\d)|(?<=[A-Za-z_]\.\d))\d*(?:\.\d+)*(?!\w|::)", "NUM"),
)

_FORMAT_VERSION = 1


def is_error_level(line: str) -> bool:
    """Whether ``line`` is an error- or warning-level line (what :meth:`ErrorTemplates.observe` mines).

    >>> is_error_level("[rank0]:[E1201 10:21:00.1 ProcessGroupNCCL.cpp:607] Watchdog"), is_error_level("step 5 ok")
    (True, False)
    """
    return ERROR_LEVEL.search(line) is not None


@dataclass(frozen=True, slots=True)
class TemplateHit:
    """Where one mined line went.

    ``template_id``: the template's number in this miner (stable while the template is kept).
    ``template``: its text, masks as ``<NUM>``, ``<PATH>``… and positions that varied as ``<*>``.
    ``count``: lines of this template seen so far. ``new``: this line created the template (its
    first occurrence, or the first since the template was forgotten to keep memory bounded).
    """

    template_id: int
    template: str
    count: int
    new: bool

    def evidence(self) -> str:
        """The evidence entry an anomaly can carry.

        >>> TemplateHit(1, "RuntimeError: <NUM> failed", 1, True).evidence()
        'template: RuntimeError: <NUM> failed (new in this job)'
        """
        return f"template: {self.template}" + (" (new in this job)" if self.new else f" ({self.count} lines)")


def _config(max_clusters: int | None) -> TemplateMinerConfig:
    config = TemplateMinerConfig()
    config.drain_max_clusters = max_clusters
    config.masking_instructions = [MaskingInstruction(pattern, name) for pattern, name in MASKS]
    config.parameter_extraction_cache_capacity = 1  # only used by extract_parameters, which we never call
    return config


class ErrorTemplates:
    """The error-line templates of one job (see the module docstring).

    ``max_clusters``: templates kept (least recently seen forgotten first); ``None`` keeps all
    (offline mining). ``max_chars``: lines are clipped to this many characters before mining.
    """

    def __init__(self, max_clusters: int | None = 256, max_chars: int = 512) -> None:
        self.max_clusters = max_clusters
        self.max_chars = max_chars
        self._miner = TemplateMiner(config=_config(max_clusters))
        # Template ids, least recently seen first: mirrors drain3's LRU order, for snapshots.
        self._recent: dict[int, None] = {}
        self._forgotten = 0  # templates dropped since the prefix tree was last rebuilt
        self.lines = 0  # lines mined

    def observe(self, line: str) -> TemplateHit | None:
        """Mine ``line`` if it is error-level (:data:`ERROR_LEVEL`); ``None`` for any other line."""
        if ERROR_LEVEL.search(line) is None:
            return None
        return self.add(line)

    def add(self, line: str) -> TemplateHit:
        """Mine ``line`` whatever its level (offline mining of lines already known to be errors)."""
        text = line.strip()[: self.max_chars]
        cluster, change = self._miner.drain.add_log_message(self._miner.masker.mask(text))
        cid: int = cluster.cluster_id
        self.lines += 1
        recent = self._recent
        recent.pop(cid, None)
        recent[cid] = None
        if self.max_clusters is not None and len(recent) > self.max_clusters:
            # drain3 just dropped its least recently seen template: so do we.
            del recent[next(iter(recent))]
            self._forgotten += 1
            if self._forgotten >= self.max_clusters:
                # drain3 never prunes its prefix tree: rebuild it from the kept templates.
                self._restore(self._clusters(), self._miner.drain.clusters_counter)
        return TemplateHit(cid, cluster.get_template(), cluster.size, change == "cluster_created")

    def templates(self) -> list[TemplateHit]:
        """The kept templates, most lines first (``new`` is always ``False`` here).

        >>> t = ErrorTemplates()
        >>> for n in (1, 2, 3):
        ...     _ = t.observe(f"ERROR: checkpoint shard {n} failed to load")
        >>> [(h.template, h.count) for h in t.templates()]
        [('ERROR: checkpoint shard <NUM> failed to load', 3)]
        """
        clusters = self._miner.drain.id_to_cluster
        hits = [TemplateHit(c.cluster_id, c.get_template(), c.size, False) for c in map(clusters.get, self._recent)]
        return sorted(hits, key=lambda h: (-h.count, h.template_id))

    def __len__(self) -> int:
        return len(self._recent)

    def reset(self) -> None:
        """Forget everything (the job restarted)."""
        self._restore([], 0)
        self.lines = 0

    # -- snapshots ----------------------------------------------------------------
    def _clusters(self) -> list[tuple[int, tuple[str, ...], int]]:
        clusters = self._miner.drain.id_to_cluster
        return [(cid, tuple(c.log_template_tokens), c.size) for cid, c in ((i, clusters.get(i)) for i in self._recent)]

    def _restore(self, clusters: list[tuple[int, tuple[str, ...], int]], counter: int) -> None:
        self._miner = TemplateMiner(config=_config(self.max_clusters))
        drain = self._miner.drain
        drain.clusters_counter = counter
        self._recent = {}
        for cid, tokens, size in clusters:  # least recently seen first, as drain3's LRU wants them
            cluster = LogCluster(list(tokens), cid)
            cluster.size = size
            drain.id_to_cluster[cid] = cluster
            drain.add_seq_to_prefix_tree(drain.root_node, cluster)
            self._recent[cid] = None
        self._forgotten = 0

    def __getstate__(self) -> dict[str, Any]:
        return {
            "version": _FORMAT_VERSION,
            "max_clusters": self.max_clusters,
            "max_chars": self.max_chars,
            "lines": self.lines,
            "counter": self._miner.drain.clusters_counter,
            "clusters": self._clusters(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_clusters = state["max_clusters"]
        self.max_chars = state["max_chars"]
        self.lines = state["lines"]
        self._restore([(cid, tuple(tokens), size) for cid, tokens, size in state["clusters"]], state["counter"])
