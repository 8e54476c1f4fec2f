"""The tools a run plugs into besides torchrun (issue 28): Nsight Systems around each rank, refused with
the reason where it cannot run; GPU health through NVML, its logic driven by a stand-in NVML module."""

import shutil

import pytest

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.launching.torchrun_command import NSYS_PROFILE, torchrun_command


def test_nsys_wraps_each_rank_and_names_its_report(monkeypatch):
    cmd = torchrun_command(RunConfig(dp=2, nsys=True).validate(), "/runs/r")
    i = cmd.index("--no-python")  # torchrun runs nsys, nsys runs the rank
    assert cmd[i + 1 : i + 1 + len(NSYS_PROFILE)] == NSYS_PROFILE
    assert "cuda,nvtx,osrt" in cmd and "/runs/r/nsys/rank%q{RANK}" in cmd, (
        "one report per rank, by its RANK"
    )
    assert cmd[-5:] == ["-u", "-m", "workbench.launching.worker", "--run-dir", "/runs/r"]
    assert "--no-python" not in torchrun_command(RunConfig(dp=2).validate(), "/runs/r")


def test_nsys_without_nsys_or_without_cuda_fails_before_launch(monkeypatch, tmp_path):
    out = tmp_path / "r"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="`nsys` is not on PATH.*Nsight Systems"):
        wb.launch(RunConfig(nsys=True, backend="gloo"), out=str(out), progress=False)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(ConfigError, match="profiles CUDA ranks, and this run's backend is 'gloo'"):
        wb.launch(RunConfig(nsys=True, backend="gloo"), out=str(out), progress=False)
    assert not out.exists(), "nothing started"


class StandInNVML:
    """The part of pynvml (nvidia-ml-py) measure/gpu_health.py calls, with settable readings."""

    NVML_TEMPERATURE_GPU, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, NVML_CLOCK_SM = 0, 1, 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = (
        0,
        1,
        0,
    )

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.temperature, self.power_mw, self.sm_mhz, self.reasons = 60, 400_000, 1980, 0
        self.ecc = {0: 3, 1: 0}
        self.xids: list[int] = []
        self.uuid = None

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.uuid = uuid
        return "gpu"

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        return 90

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, h, kinds, events):
        pass

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if not self.xids:
            raise self.NVMLError("timeout")
        return type("Event", (), {"eventData": self.xids.pop(0)})()

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self.ecc[kind]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self.reasons

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power_mw

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.temperature

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self.sm_mhz


def test_gpu_health_names_heat_throttling_ecc_and_xid_and_doctor_reports_them(tmp_path):
    """A healthy sample has no anomaly; heat within 5 °C of the GPU's slowdown temperature, thermal
    throttling, a new uncorrected ECC error and an Xid each do; every sample is a trace counter and a line of
    gpu_health.jsonl, which `workbench doctor` summarises per rank."""
    from workbench.analysis.doctor import diagnose
    from workbench.measure.gpu_health import GpuHealth, record
    from workbench.trace.recorder import TraceRecorder

    nvml = StandInNVML()
    health = GpuHealth(nvml, "GPU-1234")
    assert nvml.uuid == "GPU-1234", "found by UUID, not by NVML's numbering"
    recorder = TraceRecorder(
        rank=0, world_size=1, backend="nccl", coords={"dp": 0, "tp": 0, "pp": 0}, run_name="t"
    )
    ok = record(health, recorder, str(tmp_path), 0, step=0)
    assert ok.pop("read_ms") >= 0
    assert ok == {
        "temperature_c": 60,
        "power_w": 400.0,
        "sm_clock_mhz": 1980,
        "throttle": [],
        "ecc_corrected": 3,
        "ecc_uncorrected": 0,
        "xid": [],
        "anomaly": None,
    }
    # hw_thermal and sw_power_cap
    nvml.temperature, nvml.reasons, nvml.sm_mhz = (
        86,
        0x40 | 0x4,
        1100,
    )
    nvml.ecc[1], nvml.xids = 2, [79]
    bad = record(health, recorder, str(tmp_path), 0, step=1)
    assert bad["throttle"] == ["sw_power_cap", "hw_thermal"] and bad["xid"] == [79]
    for said in (
        "gpu hot: 86 °C (slowdown at 90 °C)",
        "gpu throttled: hw_thermal (SM clock 1100 MHz)",
        "2 uncorrected ECC error(s)",
        "gpu Xid 79",
    ):
        assert said in bad["anomaly"]
    counters = [
        e for e in recorder.to_dict()["traceEvents"] if e.get("ph") == "C" and e["name"] == "gpu"
    ]
    assert [c["args"]["temperature_c"] for c in counters] == [60.0, 86.0]
    report = diagnose(str(tmp_path))
    assert "GPU health (NVML, 2 sample(s)" in report
    assert (
        "rank 0: up to 86 °C, 400.0 W, SM clock down to 1100 MHz; throttled: hw_thermal" in report
    )
    assert "Xid: 79" in report and "step 1: gpu hot" in report


def test_gpu_health_is_off_on_the_cpu():
    import torch

    from workbench.measure.gpu_health import GpuHealth

    assert GpuHealth.open(torch.device("cpu")) is None
    with pytest.raises(ConfigError, match="gpu_health_every=-1"):
        RunConfig(gpu_health_every=-1).validate()
