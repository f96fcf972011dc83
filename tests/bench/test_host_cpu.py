import os
import time

import pytest

from blink.bench.gpu_monitor import GpuMonitor
from blink.bench.host_cpu import CpuMeter, gauge_value, process_cpu_seconds


def test_process_cpu_seconds_counts_work():
    before = process_cpu_seconds(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert process_cpu_seconds(os.getpid()) - before >= 0.2


def test_cpu_meter_without_a_process_is_none():
    meter = CpuMeter(None)
    meter.start()
    assert meter.stop() is None


def test_gauge_value_parses_prometheus_text():
    text = ("# HELP blink_engine_pid Process id of the engine\n# TYPE blink_engine_pid gauge\n"
            "blink_engine_pid_extra 3.0\nblink_engine_pid 4242.0\n")
    assert gauge_value(text, "blink_engine_pid") == 4242.0
    assert gauge_value('blink_engine_pid{rank="0"} 17\n', "blink_engine_pid") == 17.0
    assert gauge_value("other 1\n", "blink_engine_pid") is None


def test_gpu_monitor_reads_none_without_nvml():
    monitor = GpuMonitor()
    monitor.start()
    reading = monitor.stop()
    if not monitor.available:
        assert reading.energy_mj is None and reading.mean_utilization_pct is None
    monitor.close()


@pytest.mark.gpu
def test_gpu_monitor_measures_energy_and_utilisation_on_a_gpu():
    pytest.importorskip("pynvml")
    import torch

    monitor = GpuMonitor(sample_interval_s=0.05)
    assert monitor.available
    x = torch.randn(4096, 4096, device="cuda")
    monitor.start()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    reading = monitor.stop()
    monitor.close()
    assert reading.energy_mj is not None and reading.energy_mj > 0
    assert reading.samples > 0 and reading.mean_utilization_pct > 0
