"""The attackers' scheduling knobs: what the worker really gets, and cgroup detection."""
import json
import os
import subprocess
import sys

import pytest

from blink.bench.attackers import Attackers, AttackSpec
from blink.bench.sched_knobs import AttackCgroup, AttackerKnobs, cgroup_support


def test_knobs_are_validated():
    with pytest.raises(ValueError):
        AttackerKnobs(policy="fifo")
    with pytest.raises(ValueError):
        AttackerKnobs(nice=25)
    with pytest.raises(ValueError):
        AttackerKnobs(cpu_weight=0)


def test_attack_workers_report_the_nice_and_policy_they_run_with():
    spec = AttackSpec(kind="spin", procs=1, duration_s=0.3, nice=7, policy="batch")
    with Attackers(spec) as attack:
        reports = attack.wait()
    [report] = reports
    assert report["returncode"] == 0
    assert report["nice"] == os.getpriority(os.PRIO_PROCESS, 0) + 7
    assert report["policy"] == "batch"


def test_cgroup_support_says_why_not(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    where, why = cgroup_support(str(tmp_path / "none"), str(mounts))
    assert where is None and "no cgroup v2 tree" in why
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("memory io\n")
    where, why = cgroup_support(str(v2), str(mounts))
    assert where is None and "without the cpu controller" in why
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    assert cgroup_support(str(v2), str(mounts)) == (str(v2), "v2 cpu.weight")


def test_v1_cgroup_gets_the_scaled_shares(tmp_path):
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.shares").write_text("1024\n")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup {v1} cgroup rw,relatime,cpu 0 0\n")
    # a plain directory stands in for the hierarchy: the kernel would create the knob files itself
    group = AttackCgroup(10, root=str(tmp_path / "no-v2"), mounts_path=str(mounts))
    with group:
        assert (v1 / f"blink-attack-{os.getpid()}" / "cpu.shares").read_text() == "102"
        assert group.metadata()["cgroup_kind"] == "v1 cpu.shares"


def test_unavailable_cgroup_is_an_error_that_names_the_flag(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("")
    with pytest.raises(RuntimeError, match="--attacker-cpu-weight"):
        AttackCgroup(10, root=str(tmp_path), mounts_path=str(mounts))


def test_worker_joins_a_real_cgroup_when_the_machine_allows_it():
    where, _why = cgroup_support()
    if where is None:
        pytest.skip(f"no writable cpu cgroup here: {_why}")
    with AttackCgroup(20) as group:
        out = subprocess.run([sys.executable, "-m", "blink.bench.attack_worker", "--kind", "spin",
                              "--seconds", "0.2", "--parent-pid", str(os.getpid()), "--cgroup", group.path],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert json.loads(out.splitlines()[-1])["cgroup"] == group.path
