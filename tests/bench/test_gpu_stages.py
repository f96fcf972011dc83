"""tools/gpu_stages/: each GPU stage is defined once, and a group's function runs its own stages and answers 99 for
the others (tools/gpu_run.sh tries the groups in turn). Run with stub commands: nothing here needs a GPU."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("kernels", "device", "serve", "lab")
ARM = re.compile(r"^    ([a-z0-9|-]+)\)", re.M)


def _stages(group: str) -> list[str]:
    text = (ROOT / "tools" / "gpu_stages" / f"{group}.sh").read_text()
    return [name for arm in ARM.findall(text) for name in arm.split("|")]


def test_every_stage_is_defined_once_and_the_runner_tries_every_group():
    names = [name for group in GROUPS for name in _stages(group)]
    assert len(names) == len(set(names)) and len(names) > 50
    runner = (ROOT / "tools" / "gpu_run.sh").read_text()
    assert runner.count(f"for group in {' '.join(GROUPS)}; do") == 2  # sourced, then dispatched, in one order
    assert sorted(p.stem for p in (ROOT / "tools" / "gpu_stages").glob("*.sh")) == sorted(GROUPS)


def _call(group: str, stage: str, tmp_path) -> subprocess.CompletedProcess:
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    for tool in ("python3", "nvidia-smi"):
        (stub / tool).write_text('#!/bin/sh\necho "stub $(basename "$0") $*"\n')
        (stub / tool).chmod(0o755)
    script = f'set -uo pipefail; OUT={tmp_path}; source tools/gpu_stages/{group}.sh; stages_{group} "{stage}"'
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{stub}:/usr/bin:/bin"})


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_answers_99_for_a_stage_it_does_not_hold(group, tmp_path):
    assert _call(group, "no-such-stage", tmp_path).returncode == 99


def test_a_group_runs_its_own_stage(tmp_path):
    done = _call("kernels", "env", tmp_path)
    assert done.returncode == 0 and "stub nvidia-smi --query-gpu" in done.stdout
    assert _call("device", "env", tmp_path).returncode == 99


def test_the_runner_exits_with_its_stages_status(tmp_path):
    """gpu_chain.sh prints each stage's rc: 0 when the stages passed, 2 for an unknown one (until session 34 every
    run exited 1, whatever its stages did). Run from a bare copy of tools/: no .whl, no caches to restore."""
    import shutil

    shutil.copytree(ROOT / "tools" / "gpu_stages", tmp_path / "tools" / "gpu_stages")
    shutil.copy(ROOT / "tools" / "gpu_run.sh", tmp_path / "tools" / "gpu_run.sh")
    _call("kernels", "env", tmp_path)  # writes the stubs into tmp_path/bin
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    run = lambda *stages: subprocess.run(["bash", "tools/gpu_run.sh", *stages], cwd=tmp_path, capture_output=True,
                                         text=True, timeout=30, env=env)
    assert run("env").returncode == 0
    unknown = run("env", "no-such-stage")
    assert unknown.returncode == 2 and "unknown stage no-such-stage" in unknown.stdout


def test_no_stage_writes_over_a_file_of_the_tree():
    """A redirection in a stage writes under $OUT or a scratch path, never onto a tracked file (a pasted line in the
    sampling stage once sent pytest's stderr onto tests/kernels/test_sampling.py, session 38)."""
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    redirect = re.compile(r"(?:^|[\s;|])[12]?>>?\s*([^\s;|&)<>]+)")
    seen = set()
    for script in [*(ROOT / "tools" / "gpu_stages").glob("*.sh"), ROOT / "tools" / "gpu_run.sh"]:
        targets = {target.strip("'\"") for target in redirect.findall(script.read_text())}
        assert not targets & tracked, (script.name, sorted(targets & tracked))
        seen |= targets
    assert "/dev/null" in seen and any(target.startswith('$OUT/') for target in seen)  # the pattern finds them


def test_the_chain_runs_a_card_gated_stage_only_on_that_card(tmp_path):
    """gpu_chain.sh's "@H200 ..." stages run where the card's name holds H200 and are skipped elsewhere; an ungated
    stage always runs. From a bare copy of tools/, as above: no caches or wheels to restore."""
    import shutil

    shutil.copytree(ROOT / "tools", tmp_path / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-smi").write_text('#!/bin/sh\necho "NVIDIA H100 80GB HBM3"\n')
    (stub / "python3").write_text('#!/bin/sh\necho "stub python3 $*"\n')
    for tool in stub.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", "tools/gpu_chain.sh", "@H200 INTF_BUDGET=540 env:20", "@H100 env:20", "env:20"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert "##### skipped on NVIDIA H100 80GB HBM3: @H200 INTF_BUDGET=540 env:20" in done.stdout
    assert done.stdout.count("##### env:20 (") == 2 and done.stdout.count("##### rc 0") == 2
