"""A stand-in for the pynvml module, driven by a JSON fixture (tests/fixtures/nvml_node.json).

It implements exactly the calls the collector makes, with NVML's return shapes and error
codes (NotSupported, GPU is lost, Timeout), so the collector's handling of each can be tested
on a machine without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

FIXTURE = Path(__file__).parent.parent / "fixtures" / "nvml_node.json"


class NvmlStandIn:
    NVMLError = pynvml.NVMLError
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_NVLINK_MAX_LINKS = 4
    NVML_NVLINK_ERROR_DL_CRC_FLIT = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, fixture: Path = FIXTURE) -> None:
        data = json.loads(fixture.read_text())
        self.gpus: list[dict[str, Any]] = data["gpus"]
        self.pending_events = list(data["xid_events"])
        self.reads = [0] * len(self.gpus)
        self.shut = False

    @staticmethod
    def _error(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def _gpu(self, handle: int, field: str) -> Any:
        gpu = self.gpus[handle]
        if "lost_after_reads" in gpu and self.reads[handle] > gpu["lost_after_reads"]:
            raise self._error(pynvml.NVML_ERROR_GPU_IS_LOST)
        value = gpu[field]
        if value is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle]["uuid"]

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x1B + 0x10 * handle:02X}:00.0".encode())  # bytes, as NVML returns

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        self.reads[handle] += 1  # the first call of each sample round
        return SimpleNamespace(gpu=self._gpu(handle, "util"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=self._gpu(handle, "mem_used"), total=85899345920)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._gpu(handle, "temp")

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._gpu(handle, "power_mw")

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return self._gpu(handle, "sm_clock")

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        return self._gpu(handle, "ecc")[0 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1]

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return tuple(self._gpu(handle, "remapped"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        return self._gpu(handle, "pcie_replay")

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        return self._gpu(handle, "nvlink_crc")[link]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._gpu(handle, "reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return self._gpu(handle, "reasons")

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if not self.pending_events:
            raise self._error(pynvml.NVML_ERROR_TIMEOUT)
        event = self.pending_events.pop(0)
        return SimpleNamespace(
            device=event["gpu"], eventData=event["xid"], eventType=self.nvmlEventTypeXidCriticalError
        )
