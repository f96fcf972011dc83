"""What the kernel lets an unprivileged (or container-root) benchmark do to de-prioritise its attackers.

- nice: `os.nice(N)` in each attack worker (inherited by a compile worker's children);
- policy: SCHED_BATCH or SCHED_IDLE (no privilege needed; SCHED_FIFO for the front end is refused on the
  device machine, so it is not offered);
- a CPU cgroup weight: cgroup v2 `cpu.weight` (1..10000, default 100) where /sys/fs/cgroup is a v2 tree
  with the cpu controller, else cgroup v1 `cpu.shares` (weight * 1024 / 100) where a v1 cpu hierarchy is
  mounted and writable. `cgroup_support()` says which, or why neither.
Every knob asked for is applied by the worker itself before it reports `ready`, and the worker reports
what it got, so a point's metadata records the real setting, not the request.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

POLICIES = {"batch": getattr(os, "SCHED_BATCH", 3), "idle": getattr(os, "SCHED_IDLE", 5)}
POLICY_NAMES = {getattr(os, "SCHED_OTHER", 0): "other", **{v: k for k, v in POLICIES.items()}}
CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class AttackerKnobs:
    nice: int | None = None  # added to the worker's niceness (0..19)
    policy: str | None = None  # batch | idle
    cpu_weight: int | None = None  # cgroup v2 cpu.weight scale

    def __post_init__(self):
        if self.policy is not None and self.policy not in POLICIES:
            raise ValueError(f"unknown attacker policy {self.policy!r}; one of {sorted(POLICIES)}")
        if self.nice is not None and not 0 <= self.nice <= 19:
            raise ValueError("--attacker-nice must be in 0..19")
        if self.cpu_weight is not None and not 1 <= self.cpu_weight <= 10000:
            raise ValueError("--attacker-cpu-weight must be in 1..10000")

    def as_dict(self) -> dict:
        return asdict(self)


def _v1_cpu_mount(mounts_path: str = "/proc/mounts") -> str | None:
    try:
        with open(mounts_path) as f:
            for line in f:
                _dev, path, fstype, options, *_ = line.split()
                if fstype == "cgroup" and "cpu" in options.split(","):
                    return path
    except OSError:
        pass
    return None


def cgroup_support(root: str = CGROUP_ROOT, mounts_path: str = "/proc/mounts") -> tuple[str | None, str]:
    """(parent directory for an attack cgroup, how) or (None, why not)."""
    controllers = os.path.join(root, "cgroup.controllers")
    if os.path.exists(controllers):
        with open(controllers) as f:
            if "cpu" not in f.read().split():
                return None, f"cgroup v2 at {root} without the cpu controller"
        if not os.access(root, os.W_OK):
            return None, f"cgroup v2 at {root} is not writable"
        return root, "v2 cpu.weight"
    mount = _v1_cpu_mount(mounts_path)
    if mount is None:
        return None, f"no cgroup v2 tree at {root} and no cgroup v1 cpu hierarchy mounted"
    if not os.access(mount, os.W_OK) or not os.path.exists(os.path.join(mount, "cpu.shares")):
        return None, f"cgroup v1 cpu hierarchy at {mount} is not writable"
    return mount, "v1 cpu.shares"


class AttackCgroup:
    """A cgroup for the attackers with the given weight; created on enter, removed on exit."""

    def __init__(self, weight: int, root: str = CGROUP_ROOT, mounts_path: str = "/proc/mounts"):
        parent, how = cgroup_support(root, mounts_path)
        if parent is None:
            raise RuntimeError(f"--attacker-cpu-weight: {how}")
        self.weight, self.how = weight, how
        self.path = os.path.join(parent, f"blink-attack-{os.getpid()}")

    def __enter__(self) -> AttackCgroup:
        os.makedirs(self.path, exist_ok=True)
        if self.how.startswith("v2"):
            subtree = os.path.join(os.path.dirname(self.path), "cgroup.subtree_control")
            with open(subtree) as f:
                enabled = "cpu" in f.read().split()
            if not enabled:
                with open(subtree, "w") as f:
                    f.write("+cpu")
            knob, value = "cpu.weight", self.weight
        else:
            knob, value = "cpu.shares", max(2, self.weight * 1024 // 100)
        with open(os.path.join(self.path, knob), "w") as f:
            f.write(str(value))
        return self

    def __exit__(self, *exc) -> None:
        # Workers have exited by now (Attackers.stop); rmdir fails while a straggler is still inside.
        try:
            os.rmdir(self.path)
        except OSError:
            pass

    def metadata(self) -> dict:
        return {"cgroup": self.path, "cgroup_kind": self.how, "cpu_weight": self.weight}


def apply_in_worker(nice: int | None, policy: str | None, cgroup: str | None) -> dict:
    """Called by an attack worker on itself; returns what it now runs with."""
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if policy:
        os.sched_setscheduler(0, POLICIES[policy], os.sched_param(0))
    if nice:
        os.nice(nice)
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0),
            "policy": POLICY_NAMES.get(os.sched_getscheduler(0), str(os.sched_getscheduler(0))),
            "cgroup": cgroup}
