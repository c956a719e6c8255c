"""NVIDIA dcgm-exporter as a GPU source: its Prometheus text → wire-contract ``gpu`` samples.

Clusters already run dcgm-exporter (a DaemonSet or a systemd service on every GPU node);
:class:`DcgmExporterScraper` reads its ``/metrics`` pages instead of NVML. One sample per
GPU per scrape, named by the ``Hostname`` label (else the target's host) and the ``gpu``
index, with ``UUID`` and ``pci_bus_id`` when given. Fields dcgm-exporter leaves out by
default (the ECC counters are commented out of its ``default-counters.csv``) are
``null``, never an error; metrics it does not map are ignored; MIG instance series
(``GPU_I_ID``) are skipped, their parent GPU's own series is the sample.

``DCGM_FI_DEV_XID_ERRORS`` is the *last* Xid a GPU raised, not an event: a GPU's sample
carries ``xid`` when that value changes to a non-zero one (the first value seen is the
baseline — an Xid from before the scraper started is history, not news).

>>> page = '''
... # TYPE DCGM_FI_DEV_GPU_UTIL gauge
... DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="00000000:07:00.0",Hostname="gpu-node-01"} 97
... DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",pci_bus_id="00000000:07:00.0",Hostname="gpu-node-01"} 0
... '''
>>> frames = GpuFrames()
>>> [(r["node"], r["gpu"], r["util_pct"], r["xid"]) for r in frames.samples(page, ts=100.0, fallback_node="x")]
[('gpu-node-01', 0, 97.0, None)]
>>> [r["xid"] for r in frames.samples(page.replace("} 0", "} 79"), ts=110.0, fallback_node="x")]
[79]
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from trainguard.agents.loop import Agent, Publish, SourceUnavailable

# dcgm-exporter field (the metric name) → wire-contract field. The first of several
# fields that map to one wire field wins (aggregate ECC before volatile).
FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_FB_USED": "mem_used_mib",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_total",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_total",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_total",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_total",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remapped_rows_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failed",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_total",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_total",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay_total",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery_total",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",  # its name before DCGM 3.3
    "DCGM_FI_DEV_XID_ERRORS": "xid",
}
INTEGER_FIELDS = {
    "ecc_sbe_total",
    "ecc_dbe_total",
    "remapped_rows_pending",
    "remapped_rows_failed",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "pcie_replay_total",
    "nvlink_crc_total",
    "nvlink_replay_total",
    "nvlink_recovery_total",
    "throttle_reasons",
    "xid",
}
GpuKey = tuple[str, int]


class GpuFrames:
    """Turns successive exporter pages (or any series in its naming) into samples; remembers each
    GPU's last Xid so only a new one is reported."""

    def __init__(self) -> None:
        self._last_xid: dict[GpuKey, int] = {}

    def samples(self, text: str, ts: float, fallback_node: str) -> list[dict[str, Any]]:
        """One sample per GPU on the page, stamped ``ts``."""
        gpus: dict[GpuKey, dict[str, Any]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # The parser names a counter's samples "<family>_total"; the field is the family.
                name = sample.name if sample.name in FIELDS else family.name
                self.add(gpus, name, sample.labels, sample.value, ts, fallback_node)
        return self.finish(gpus)

    def add(
        self,
        gpus: dict[GpuKey, dict[str, Any]],
        metric: str,
        labels: dict[str, str],
        value: float,
        ts: float,
        fallback_node: str,
    ) -> None:
        """Put one series' value into its GPU's sample."""
        target = FIELDS.get(metric)
        if target is None or labels.get("GPU_I_ID"):
            return
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            return  # not a per-GPU series (or a label we cannot read): not ours
        node = labels.get("Hostname") or fallback_node
        record = gpus.get((node, index))
        if record is None:
            record = gpus[(node, index)] = {"ts": ts, "node": node, "gpu": index}
            if labels.get("UUID"):
                record["uuid"] = labels["UUID"]
            if labels.get("pci_bus_id"):
                record["pci_bus_id"] = labels["pci_bus_id"]
        if target in record or not math.isfinite(value):
            return
        record[target] = int(value) if target in INTEGER_FIELDS else float(value)

    def finish(self, gpus: dict[GpuKey, dict[str, Any]]) -> list[dict[str, Any]]:
        """The samples of one round, with ``xid`` only where a new one appeared."""
        out = []
        for key in sorted(gpus):
            record = gpus[key]
            last = record.pop("xid", None)
            record["xid"] = None
            if last is not None:
                before = self._last_xid.get(key)
                self._last_xid[key] = last
                if before is not None and last != before and last != 0:
                    record["xid"] = last
            out.append(record)
        return out


class DcgmExporterScraper(Agent):
    """Scrapes dcgm-exporter targets each poll; a target that fails is a warning, the others go on."""

    name = "dcgm-exporter"

    def __init__(self, targets: list[str], timeout_s: float = 5.0) -> None:
        if not targets:
            raise ValueError("no dcgm-exporter targets given")
        self.targets = [_metrics_url(t) for t in targets]
        self.timeout_s = timeout_s
        self.frames = GpuFrames()
        self._problems: list[str] = []

    def poll(self, now: float | None = None) -> list[Publish]:
        ts = time.time() if now is None else now
        out: list[Publish] = []
        failed: list[str] = []
        for url in self.targets:
            try:
                with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                    text = response.read().decode("utf-8", errors="replace")
            except (OSError, urllib.error.URLError, ValueError) as exc:
                failed.append(f"cannot scrape {url} ({_reason(exc)})")
                continue
            try:
                out += [("gpu", r) for r in self.frames.samples(text, ts, urlsplit(url).hostname or "unknown")]
            except ValueError as exc:  # not Prometheus text
                failed.append(f"{url} did not serve Prometheus text ({exc})")
        if failed and len(failed) == len(self.targets):
            raise SourceUnavailable(
                f"{failed[0]}; check the dcgm-exporter address (it serves /metrics on port 9400 by default)."
                if len(failed) == 1
                else f"none of the {len(failed)} dcgm-exporter targets could be scraped (first: {failed[0]})."
            )
        self._problems += failed
        return out

    def problems(self) -> list[str]:
        found, self._problems = self._problems, []
        return found


def _metrics_url(target: str) -> str:
    """``host:9400``, ``http://host:9400`` or a full ``…/metrics`` URL → the page to scrape."""
    url = target if "://" in target else f"http://{target}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{target!r} is not a dcgm-exporter address (give host:port or an http:// URL)")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/metrics"


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return " ".join(str(reason if reason is not None else exc).split())[:160]


def read_targets(spec: str) -> list[str]:
    """``URL[,URL…]``, or ``@FILE`` with one target per line (``#`` comments)."""
    if spec.startswith("@"):
        from pathlib import Path

        lines = Path(spec[1:]).read_text().splitlines()
        return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    return [t.strip() for t in spec.split(",") if t.strip()]
