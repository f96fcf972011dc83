"""GPU energy (NVML total-energy counter, mJ) and mean utilisation over a measurement window.

Uses `pynvml` (the nvidia-ml-py package) when it can be imported and initialised; otherwise every
reading is None, so the benchmark also runs on machines without a GPU.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass


def default_gpu_index() -> int:
    """The first GPU this process may use: CUDA_VISIBLE_DEVICES' first entry when it is a number."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


@dataclass
class GpuReading:
    energy_mj: float | None = None  # energy the whole GPU used during the window
    mean_utilization_pct: float | None = None  # mean of NVML's utilisation.gpu samples
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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _energy(self) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # older GPUs lack the counter
            return None

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_interval_s):
            try:
                self._utilization.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except Exception:
                return

    def start(self) -> None:
        if not self.available:
            return
        self._utilization = []
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
        return GpuReading(energy_mj=energy, mean_utilization_pct=mean_util, samples=len(self._utilization))

    def close(self) -> None:
        if self.available:
            self._nvml.nvmlShutdown()
