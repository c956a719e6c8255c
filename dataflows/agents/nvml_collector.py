"""GPU collector: NVML samples and Xid events as wire-contract ``gpu`` (and ``logs``) records.

Each interval it reads, per GPU: utilisation, memory, temperature, power, SM clock,
aggregate ECC counters, remapped rows, PCIe replays, NVLink CRC errors and clock
throttle reasons; between samples it waits on NVML's event set for critical Xid
errors. A field the GPU does not support is ``null``, never a crash. A GPU that is
lost (fallen off the bus) yields a kernel-style log record saying so — the
detectors' ``gpu_lost`` signature — and its samples stop, which is the other signal.
Without a usable driver, :class:`NvmlUnavailable` says so in one sentence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pynvml

from trainguard.agents.loop import Agent, Publish


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine; the message is one sentence."""


class GpuLost(Exception):
    pass


class GpuCollector(Agent):
    """Reads every GPU of one node through NVML (``nvml`` is the pynvml module, or a stand-in)."""

    name = "collect-gpu"

    def __init__(self, node: str, nvml: ModuleType | Any = pynvml, xid_events: bool = True) -> None:
        self.node = node
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"no usable NVIDIA driver on this machine (NVML: {exc}); run collect-gpu on a GPU node."
            ) from None
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.uuids = [self._text(nvml.nvmlDeviceGetUUID(h)) for h in self.handles]
        self.pci_bus_ids = [self._pci_bus_id(h) for h in self.handles]
        self.lost: set[int] = set()
        self.events = None
        if xid_events:
            try:
                self.events = nvml.nvmlEventSetCreate()
                for handle in self.handles:
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self.events)
            except nvml.NVMLError:
                self.events = None  # not supported (e.g. some virtualised GPUs): samples still flow

    @staticmethod
    def _text(value: str | bytes) -> str:
        return value.decode() if isinstance(value, bytes) else value

    def _pci_bus_id(self, handle: Any) -> str | None:
        info = self._field(self.nvml.nvmlDeviceGetPciInfo, handle)
        return None if info is None else self._text(info.busId)

    def _field(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost from None
            return None  # not supported, or not readable right now: null, not a crash

    def sample(self, now: float | None = None) -> list[tuple[str, dict[str, Any]]]:
        """One ``(topic, record)`` per GPU: a ``gpu`` sample, or a ``logs`` record for a GPU just lost."""
        ts = time.time() if now is None else now
        out: list[tuple[str, dict[str, Any]]] = []
        for index, handle in enumerate(self.handles):
            if index in self.lost:
                continue
            try:
                out.append(("gpu", self._read(index, handle, ts)))
            except GpuLost:
                self.lost.add(index)
                line = f"NVML: GPU {index} ({self.uuids[index]}): GPU is lost. Reboot the system to recover this GPU"
                out.append(("logs", {"ts": ts, "job_id": None, "node": self.node, "source": "kernel", "line": line}))
        return out

    def poll(self) -> list[Publish]:
        return self.sample()

    def wait(self, seconds: float, stop: threading.Event) -> list[Publish]:
        """Wait for Xid events until the next sample is due (in short slices, so a stop is prompt)."""
        deadline = time.monotonic() + seconds
        found: list[Publish] = []
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            found += [("gpu", xid) for xid in self.wait_for_xids(min(left, 1.0))]
        return found

    def key(self, stream: str, record: dict[str, Any]) -> str | None:
        return self.node

    def _read(self, index: int, handle: Any, ts: float) -> dict[str, Any]:
        n = self.nvml
        f = self._field
        util = f(n.nvmlDeviceGetUtilizationRates, handle)
        memory = f(n.nvmlDeviceGetMemoryInfo, handle)
        power_mw = f(n.nvmlDeviceGetPowerUsage, handle)
        remapped = f(n.nvmlDeviceGetRemappedRows, handle)  # (correctable, uncorrectable, pending, failure)
        crc = None
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            value = f(n.nvmlDeviceGetNvLinkErrorCounter, handle, link, n.NVML_NVLINK_ERROR_DL_CRC_FLIT)
            if value is not None:
                crc = (crc or 0) + value
        reasons = f(n.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if reasons is None:
            reasons = f(n.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        return {
            "ts": ts,
            "node": self.node,
            "gpu": index,
            "uuid": self.uuids[index],
            "pci_bus_id": self.pci_bus_ids[index],
            "util_pct": None if util is None else float(util.gpu),
            "mem_used_mib": None if memory is None else memory.used / 2**20,
            "temp_c": f(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "sm_clock_mhz": f(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_SM),
            "ecc_sbe_total": f(
                n.nvmlDeviceGetTotalEccErrors, handle, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC
            ),
            "ecc_dbe_total": f(
                n.nvmlDeviceGetTotalEccErrors, handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC
            ),
            "remapped_rows_pending": None if remapped is None else int(remapped[2]),
            "pcie_replay_total": f(n.nvmlDeviceGetPcieReplayCounter, handle),
            "nvlink_crc_total": crc,
            "throttle_reasons": reasons,
        }

    def wait_for_xids(self, timeout_s: float, now: Callable[[], float] = time.time) -> list[dict[str, Any]]:
        """Wait up to ``timeout_s`` for critical Xid events; one ``gpu`` record (with ``xid``) per event."""
        if self.events is None:
            time.sleep(max(timeout_s, 0.0))
            return []
        n = self.nvml
        deadline = time.monotonic() + timeout_s
        out = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = n.nvmlEventSetWait_v2(self.events, int(left * 1000))
            except n.NVMLError as exc:
                if getattr(exc, "value", None) == n.NVML_ERROR_TIMEOUT:
                    break
                raise
            uuid = self._text(n.nvmlDeviceGetUUID(event.device))
            index = self.uuids.index(uuid) if uuid in self.uuids else -1
            out.append({"ts": now(), "node": self.node, "gpu": index, "uuid": uuid, "xid": int(event.eventData)})
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()
