"""GPU energy (NVML total-energy counter, mJ), mean utilisation and mean power over a measurement window,
and the idle power (the power reading sampled for a few seconds while nothing is measured).

Uses `pynvml` (the nvidia-ml-py package) when it can be imported and initialised; otherwise every
reading is None, so the benchmark also runs on machines without a GPU.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass


def default_gpu_index() -> int:
    """The first GPU this process may use: CUDA_VISIBLE_DEVICES' first entry when it is a number."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


@dataclass
class GpuReading:
    energy_mj: float | None = None  # energy the whole GPU used during the window
    mean_utilization_pct: float | None = None  # mean of NVML's utilisation.gpu samples
    mean_power_w: float | None = None  # mean of NVML's power readings (W)
    samples: int = 0


class GpuMonitor:
    """start() ... stop() -> GpuReading. Utilisation is sampled by a background thread."""

    def __init__(self, gpu_index: int | None = None, sample_interval_s: float = 0.1):
        self.sample_interval_s = sample_interval_s
        self._nvml = None
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(
                default_gpu_index() if gpu_index is None else gpu_index)
            self._nvml = pynvml
        except Exception:  # no package, no driver, no GPU: readings are None
            self._nvml = None
        self._energy_start: float | None = None
        self._utilization: list[int] = []
        self._power_mw: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    @property
    def name(self) -> str | None:
        """The card's name as NVML gives it ("NVIDIA H200", ...); None without NVML."""
        if not self.available:
            return None
        try:
            name = self._nvml.nvmlDeviceGetName(self._handle)
        except Exception:
            return None
        return name.decode() if isinstance(name, bytes) else str(name)

    def _energy(self) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # older GPUs lack the counter
            return None

    def _power(self) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetPowerUsage(self._handle))  # mW
        except Exception:
            return None

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_interval_s):
            try:
                self._utilization.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except Exception:
                return
            power = self._power()
            if power is not None:
                self._power_mw.append(power)

    def idle_power(self, seconds: float) -> dict:
        """Mean and max power (W), mean utilisation (%) and, where the counter exists, energy-derived mean
        power over `seconds` of sampling with nothing else measured; all None without NVML."""
        if not self.available:
            return {"mean_w": None, "max_w": None, "energy_mean_w": None, "seconds": seconds,
                    "mean_utilization_pct": None}
        readings, utilization, start_mj, start = [], [], self._energy(), time.monotonic()
        while time.monotonic() - start < seconds:
            power = self._power()
            if power is not None:
                readings.append(power / 1000.0)
            try:  # a resident kernel reads 100% here however little it does (issue 19)
                utilization.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except Exception:
                pass
            time.sleep(self.sample_interval_s)
        elapsed, end_mj = time.monotonic() - start, self._energy()
        energy_w = (end_mj - start_mj) / 1000.0 / elapsed if None not in (start_mj, end_mj) else None
        return {"mean_w": sum(readings) / len(readings) if readings else None,
                "max_w": max(readings, default=None), "energy_mean_w": energy_w, "seconds": elapsed,
                "mean_utilization_pct": sum(utilization) / len(utilization) if utilization else None}

    def start(self) -> None:
        if not self.available:
            return
        self._utilization = []
        self._power_mw = []
        self._stop.clear()
        self._energy_start = self._energy()
        self._thread = threading.Thread(target=self._sample, name="gpu-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> GpuReading:
        if not self.available or self._thread is None:
            return GpuReading()
        self._stop.set()
        self._thread.join()
        self._thread = None
        end = self._energy()
        energy = end - self._energy_start if end is not None and self._energy_start is not None else None
        mean_util = sum(self._utilization) / len(self._utilization) if self._utilization else None
        power = sum(self._power_mw) / len(self._power_mw) / 1000.0 if self._power_mw else None
        return GpuReading(energy_mj=energy, mean_utilization_pct=mean_util, mean_power_w=power,
                          samples=len(self._utilization))

    def close(self) -> None:
        if self.available:
            self._nvml.nvmlShutdown()
