"""The CPU packages' energy from RAPL's powercap counters (blink/bench/cpu_energy.py), on a fake sysfs tree."""
import os

from blink.bench.cpu_energy import CpuEnergyMeter, package_domains


def domain(root, name: str, kind: str, energy_uj: int, max_uj: int = 1_000_000) -> str:
    path = os.path.join(root, name)
    os.makedirs(path)
    for field, value in (("name", kind), ("energy_uj", energy_uj), ("max_energy_range_uj", max_uj)):
        with open(os.path.join(path, field), "w") as f:
            f.write(f"{value}\n")
    return path


def set_energy(path: str, uj: int) -> None:
    with open(os.path.join(path, "energy_uj"), "w") as f:
        f.write(f"{uj}\n")


def test_packages_are_summed_their_sub_domains_and_psys_left_out_and_a_wrap_undone(tmp_path):
    root = str(tmp_path)
    p0 = domain(root, "intel-rapl:0", "package-0", 100_000)
    p1 = domain(root, "intel-rapl:1", "package-1", 990_000)
    core = domain(root, "intel-rapl:0:0", "core", 5_000)
    psys = domain(root, "intel-rapl:2", "psys", 7_000)
    assert package_domains(root) == [p0, p1]
    meter = CpuEnergyMeter(root)
    meter.start()
    set_energy(p0, 350_000)  # +250 mJ
    set_energy(p1, 40_000)   # wrapped at 1 J: +50 mJ
    set_energy(core, 900_000)
    set_energy(psys, 900_000)
    assert meter.stop() == 300.0


def test_no_counter_or_an_unreadable_one_gives_none(tmp_path):
    meter = CpuEnergyMeter(str(tmp_path))  # no RAPL at all
    meter.start()
    assert meter.stop() is None
    p0 = domain(str(tmp_path), "intel-rapl:0", "package-0", 100)
    meter = CpuEnergyMeter(str(tmp_path))
    meter.start()
    os.remove(os.path.join(p0, "energy_uj"))  # as a counter only root may read
    assert meter.stop() is None
