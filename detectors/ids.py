"""Deterministic identifiers, so a replay yields the same ids as the live run.

>>> anomaly_id("job/42", "crash", "xid_79", 1796205600.0)
'an-24565cea71fb740d'
"""

from __future__ import annotations

import hashlib
import re


def _digest(*parts: object) -> str:
    text = "|".join("" if p is None else str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def anomaly_id(scope: str, kind: str, category: str, onset_ts: float) -> str:
    """Id of the anomaly of ``kind``/``category`` in ``scope`` (a job or node key) starting at ``onset_ts``."""
    return "an-" + _digest(scope, kind, category, f"{onset_ts:.3f}")


def gpu_id(node: str, gpu: int | str) -> str:
    """One GPU, everywhere: ``node/index`` (``gpu-node-07/3``). Where only a kernel line names the GPU
    (no telemetry yet), its PCI address stands in for the index (``gpu-node-07/0000:3b:00``).

    >>> gpu_id("gpu-node-07", 3), gpu_id("gpu-node-07", pci_address("PCI:0000:3B:00"))
    ('gpu-node-07/3', 'gpu-node-07/0000:3b:00')
    """
    return f"{node}/{gpu}"


def pci_address(text: str) -> str:
    """A PCI bus id as one key, whatever wrote it: NVML's ``00000000:3B:00.0``, an Xid's ``PCI:0000:3b:00``.

    >>> pci_address("00000000:3B:00.0") == pci_address("PCI:0000:3b:00") == "0000:3b:00"
    True
    >>> pci_address("zz:yy:xx")  # telemetry is untrusted: what does not parse is kept as written
    'zz:yy:xx'
    """
    text = text.strip().lower().removeprefix("pci:")
    parts = text.split(".")[0].split(":")
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}" if len(parts) == 3 else text
    except ValueError:
        return text


class GpuNames:
    """Learns each GPU's PCI address from its telemetry, so a kernel line's GPU is named by its index.

    >>> names = GpuNames()
    >>> names.name(["n1/0000:3b:00"])
    ['n1/0000:3b:00']
    >>> names.observe("n1", 3, "00000000:3B:00.0")
    >>> names.name(["n1/0000:3b:00", "n1/5"])
    ['n1/3', 'n1/5']
    """

    def __init__(self) -> None:
        self._by_address: dict[str, str] = {}

    def observe(self, node: str, gpu: int, pci_bus_id: str | None) -> None:
        if pci_bus_id:
            self._by_address[gpu_id(node, pci_address(pci_bus_id))] = gpu_id(node, gpu)

    def name(self, gpus: list[str]) -> list[str]:
        return [self._by_address.get(g, g) for g in gpus]


def action_id(anomaly: str, action: str, target: str) -> str:
    """Idempotency key of one action on one target for one anomaly."""
    return "ac-" + _digest(anomaly, action, target)


# What :func:`evidence_line` puts before a line: ``node``, ``node/rank3`` or ``?``.
EVIDENCE_PREFIX = re.compile(r"^[^\s/]+(?:/rank\d+)?: ")


def quoted_line(entry: str) -> str | None:
    """The log line an evidence entry quotes, without where it was seen (``None``: not a quote).

    >>> quoted_line(evidence_line("n1", 3, "CUDA error: an illegal memory access"))
    'CUDA error: an illegal memory access'
    >>> quoted_line("step time 1.60s vs baseline 1.03s") is None
    True
    """
    m = EVIDENCE_PREFIX.match(entry)
    return entry[m.end() :] if m else None


def evidence_line(node: str | None, rank: int | None, text: str, limit: int = 300) -> str:
    """One evidence entry: where it was seen and the (clipped) text."""
    where = node or "?"
    if rank is not None:
        where += f"/rank{rank}"
    text = text.strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{where}: {text}"
