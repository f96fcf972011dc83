"""The CPU packages' energy over a window, from the kernel's RAPL counters (powercap sysfs), for the interference
lab's energy per token: NVML counts the GPU only, and host mode's engine keeps a CPU core busy where device mode's
sleeps (issue 19). Whole packages: the client, the front end and any attackers are in it too, in both modes alike.
None where the machine has no counter or does not let us read it."""
from __future__ import annotations

import glob
import os

from blink.bench.window_meter import WindowMeter

POWERCAP = "/sys/class/powercap"


def package_domains(root: str = POWERCAP) -> list[str]:
    """The top-level RAPL domains (one per CPU package: intel-rapl:N, not its sub-domains intel-rapl:N:M)."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
        if os.path.basename(path).count(":") != 1:
            continue
        try:
            with open(os.path.join(path, "name")) as f:
                if f.read().strip().startswith("package"):
                    found.append(path)
        except OSError:
            continue
    return found


def _read_uj(domain: str, name: str) -> int:
    with open(os.path.join(domain, name)) as f:
        return int(f.read())


class CpuEnergyMeter(WindowMeter):
    """Energy of every CPU package between start() and stop(), in mJ; the counters wrap at max_energy_range_uj."""

    def __init__(self, root: str = POWERCAP):
        super().__init__()
        self.domains = package_domains(root)

    def _read(self) -> list[int] | None:
        try:
            return [_read_uj(d, "energy_uj") for d in self.domains] if self.domains else None
        except (OSError, ValueError):  # root-only on kernels since 2020 (CVE-2020-8694)
            return None

    def _delta(self, start: list[int], end: list[int]) -> float:
        total = 0
        for domain, a, b in zip(self.domains, start, end, strict=True):
            delta = b - a
            if delta < 0:  # wrapped once (a window far shorter than a wrap: minutes at package power)
                delta += _read_uj(domain, "max_energy_range_uj")
            total += delta
        return total / 1000.0
