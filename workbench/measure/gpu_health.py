"""Each rank's GPU, through NVML (NVIDIA's management library: `nvidia-ml-py`, imported as `pynvml`).

The brief's fault-tolerance advice is to watch the GPUs' state: a GPU that runs hot or is throttled
makes its rank a straggler that every collective waits for, and an uncorrected ECC error or an Xid event
(the driver's report of a GPU fault: 48 double-bit ECC, 79 fallen off the bus, ...) comes before a rank
dies or a result goes wrong. Every `every` steps a CUDA rank reads its own GPU (found by its UUID, so
CUDA_VISIBLE_DEVICES does not confuse NVML's numbering with CUDA's):

    temperature_c    the GPU's core temperature
    power_w          the board's power draw
    sm_clock_mhz     the streaming multiprocessors' clock (it falls when throttled)
    throttle         why the clocks are held down now (NVML's clock event reasons, by name)
    ecc_corrected, ecc_uncorrected    volatile ECC error counts since the driver loaded (where the GPU has ECC)
    xid              Xid events since the last sample (where NVML reports them: data-centre GPUs on Linux)
    read_ms          what reading all of this cost the rank (host time, measured)

`anomalies(sample)` names what crosses a line: within 5 °C of the GPU's own slowdown temperature,
thermal or power-brake throttling, a new uncorrected ECC error, any Xid. The engine puts each sample into
the rank's trace (a `gpu` counter), rank 0's into metrics.jsonl, every rank's into gpu_health.jsonl, and
anomalies into `anomaly` (engine/train.py); `workbench doctor` reports them. CPU runs do not sample.
Tested with a stand-in NVML module (tests/test_run_tools.py); on a GPU, `scripts/gpu_check.sh`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

#: NVML's clock event ("throttle") reason bits, by name (nvml.h: nvmlClocksEventReason*)
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}
#: the reasons that mean the GPU is slowed by heat or power trouble, not by policy or idleness
HARMFUL = {"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}
#: degrees below the GPU's own slowdown temperature at which a sample is called hot
HOT_MARGIN_C = 5
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


class GpuHealth:
    """One rank's GPU: `sample()` reads it, `anomalies(sample)` says what crossed a line."""

    def __init__(self, nvml: Any, uuid: str | None, index: int = 0) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.handle = (
            nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index)
        )
        self.slowdown_c = self._optional(
            nvml.nvmlDeviceGetTemperatureThreshold,
            self.handle,
            nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        )
        self.events = self._xid_events()
        self.ecc_at_start = self._ecc(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)

    @classmethod
    def open(cls, device: Any) -> GpuHealth | None:
        """For a CUDA rank, where nvidia-ml-py is installed; else None (nothing sampled)."""
        if getattr(device, "type", None) != "cuda":
            return None
        try:
            import pynvml
        except ImportError:
            return None
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        return cls(pynvml, f"GPU-{uuid}" if uuid is not None else None, device.index or 0)

    def _optional(self, call: Any, *args: Any) -> Any:
        """NVML's answer, or None where this GPU or driver does not support the query."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def _xid_events(self) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self.handle, XID_CRITICAL, events)
            return events
        except nvml.NVMLError:
            return None

    def _ecc(self, kind: int) -> int | None:
        return self._optional(
            self.nvml.nvmlDeviceGetTotalEccErrors, self.handle, kind, self.nvml.NVML_VOLATILE_ECC
        )

    def _xids(self) -> list[int]:
        found: list[int] = []
        while self.events is not None:
            try:
                found.append(int(self.nvml.nvmlEventSetWait_v2(self.events, 0).eventData))
            except self.nvml.NVMLError:  # a timeout: nothing more waiting
                return found
        return found

    def sample(self) -> dict[str, Any]:
        start = time.perf_counter()
        s = self._read()
        s["read_ms"] = (time.perf_counter() - start) * 1e3  # what the reading cost this rank's step
        return s

    def _read(self) -> dict[str, Any]:
        nvml, h = self.nvml, self.handle
        # the newer name, where the bindings have it
        reasons_of = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = self._optional(reasons_of, h) or 0
        power = self._optional(nvml.nvmlDeviceGetPowerUsage, h)
        return {
            "temperature_c": self._optional(
                nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": power / 1000 if power is not None else None,
            "sm_clock_mhz": self._optional(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
            "throttle": [name for bit, name in THROTTLE_REASONS.items() if reasons & bit],
            "ecc_corrected": self._ecc(nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            "ecc_uncorrected": self._ecc(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            "xid": self._xids(),
        }

    def anomalies(self, s: dict[str, Any]) -> list[str]:
        found = []
        hot = self.slowdown_c - HOT_MARGIN_C if self.slowdown_c is not None else None
        if s["temperature_c"] is not None and hot is not None and s["temperature_c"] >= hot:
            found.append(f"gpu hot: {s['temperature_c']} °C (slowdown at {self.slowdown_c} °C)")
        if harmful := [r for r in s["throttle"] if r in HARMFUL]:
            found.append(f"gpu throttled: {', '.join(harmful)} (SM clock {s['sm_clock_mhz']} MHz)")
        new = (s["ecc_uncorrected"] or 0) - (self.ecc_at_start or 0)
        if new > 0:
            found.append(f"gpu memory: {new} uncorrected ECC error(s) since the run began")
        found += [f"gpu Xid {x} (the driver reported a GPU fault)" for x in s["xid"]]
        return found


def numbers(s: dict[str, Any]) -> dict[str, float]:
    """A sample's figures that make a trace counter (numbers only)."""
    return {
        k: float(v) for k, v in s.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def record(health: GpuHealth, recorder: Any, run_dir: str, rank: int, step: int) -> dict[str, Any]:
    """One sample of this rank's GPU: a `gpu` counter in its trace, a line of RUN/gpu_health.jsonl (one
    write, appended: the ranks of a machine share the file), and the anomalies it crossed (in `anomaly`)."""
    s = health.sample()
    s["anomaly"] = "; ".join(health.anomalies(s)) or None
    recorder.counter("gpu", numbers(s))
    line = json.dumps({"step": step, "rank": rank, **s}) + "\n"
    fd = os.open(
        os.path.join(run_dir, "gpu_health.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
    )
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return s
