"""GpuMonitor against a stand-in pynvml: energy, utilisation and power over a window, idle power."""
import sys
import time
import types

import pytest

from blink.bench.gpu_monitor import GpuMonitor


def fake_nvml(power_mw=70_000):
    state = {"energy": 1_000_000.0}

    def energy(_handle):
        state["energy"] += 7_000.0  # 7 J a reading
        return state["energy"]

    return types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=energy, nvmlDeviceGetPowerUsage=lambda _h: power_mw,
        nvmlDeviceGetUtilizationRates=lambda _h: types.SimpleNamespace(gpu=100))


def test_window_reads_energy_utilisation_and_power(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    gpu = GpuMonitor(0, sample_interval_s=0.01)
    gpu.start()
    time.sleep(0.1)
    reading = gpu.stop()
    assert reading.energy_mj == 7_000.0
    assert reading.mean_utilization_pct == 100 and reading.mean_power_w == 70.0 and reading.samples > 0
    idle = gpu.idle_power(0.05)
    assert idle["mean_w"] == 70.0 and idle["max_w"] == 70.0 and idle["energy_mean_w"] > 0
    gpu.close()


def test_without_nvml_everything_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    gpu = GpuMonitor()
    assert not gpu.available
    gpu.start()
    assert gpu.stop().energy_mj is None
    assert gpu.idle_power(0.01)["mean_w"] is None


@pytest.mark.gpu
def test_real_nvml_reads_power_and_energy():
    gpu = GpuMonitor()
    assert gpu.available, "pynvml (nvidia-ml-py) did not initialise on a GPU machine"
    idle = gpu.idle_power(1.0)
    assert 10.0 < idle["mean_w"] < 1500.0 and idle["energy_mean_w"] > 0
    gpu.start()
    time.sleep(1.0)
    reading = gpu.stop()
    assert reading.energy_mj > 0 and reading.mean_power_w > 0 and reading.samples > 0
    gpu.close()
