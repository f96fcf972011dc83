import os
import signal
import subprocess
import sys
import time

import pytest

from blink.bench.attackers import Attackers, AttackSpec, optional_cpu_list

pytestmark = pytest.mark.slow  # spawns processes

CPUS = sorted(os.sched_getaffinity(0))


def process_gone(pid: int) -> bool:
    """Exited (a zombie counts: a container's init may be slow to reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(process_gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def process_tree(pid: int) -> str:
    """Each process under `pid` (itself included): its state, what it waits in, its command line."""
    lines, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
            wchan = open(f"/proc/{p}/wchan").read()
            cmd = open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:160]
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
        except OSError as exc:
            lines.append(f"{p}: {exc}")
            continue
        lines.append(f"{p} {state} {wchan}: {cmd}")
    return "\n".join(lines)


def test_cpu_lists():
    assert optional_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert optional_cpu_list("") is None and optional_cpu_list(None) is None


def test_spec_is_validated():
    with pytest.raises(ValueError):
        AttackSpec(kind="bitcoin", procs=1, duration_s=1)
    with pytest.raises(ValueError):
        AttackSpec(kind="spin", procs=0, duration_s=1)


@pytest.mark.parametrize("kind", ["spin", "memory", "compile", "tokenize"])
def test_each_kind_works_until_its_deadline_then_exits_cleanly(kind):
    spec = AttackSpec(kind=kind, procs=2, duration_s=1.0, cpus=tuple(CPUS[:1]), buffer_mib=8)
    attackers = Attackers(spec).start()
    pids = attackers.pids
    reports = attackers.wait()
    assert len(reports) == 2
    for report in reports:
        assert report["returncode"] == 0, report
        assert report["kind"] == kind and report["cpu"] == CPUS[0]
        assert report["iterations"] > 0
        assert report["seconds"] < 30  # bounded by its duration, not by us
        assert not report["stopped_by_signal"]
    assert wait_gone(pids)


def test_a_worker_that_cannot_start_is_an_error():
    with pytest.raises(RuntimeError, match="failed to start"):
        Attackers(AttackSpec(kind="spin", procs=1, duration_s=5, cpus=(100000,))).start()


def test_stop_ends_a_long_attack_early():
    with Attackers(AttackSpec(kind="spin", procs=2, duration_s=600)) as attackers:
        pids = attackers.pids
        assert attackers.running == 2
    assert [r["returncode"] for r in attackers.reports] == [0, 0]
    assert all(r["stopped_by_signal"] for r in attackers.reports)
    assert wait_gone(pids)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_attack_command_exits_cleanly_on_a_stop_signal(signum):
    proc = subprocess.Popen([sys.executable, "-m", "blink.bench", "attack", "--kind", "compile",
                             "--procs", "2", "--duration", "600"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("attacking: 2 compile processes")
        proc.send_signal(signum)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # CI saw this twice: say where everything was
            pytest.fail(f"the command ignored the signal for 60 s:\n{process_tree(proc.pid)}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert out.count("compile") >= 2  # one row per worker in the report table


def test_killing_a_worker_also_ends_the_jobs_that_hold_its_pipes():
    # a worker whose job (here a sleep in the background) inherited its stdout: reading the worker's pipes
    # to the end after SIGKILL waited on the job as well (the compile kind's jobs, before process groups)
    worker = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; exec sleep 600"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, process_group=0)
    job = int(worker.stdout.readline())
    started = time.monotonic()
    out, err = Attackers._kill(worker)
    assert time.monotonic() - started < 4.0  # the old kill-then-read waited 600 s
    assert worker.returncode == -signal.SIGKILL and err == b""
    assert wait_gone([job])


def test_attack_command_ends_by_itself_at_its_duration():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "blink.bench", "attack", "--kind", "spin", "--procs", "1",
                           "--duration", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "spin" in done.stdout and time.monotonic() - started < 30  # the poll loop saw the worker end


def test_workers_die_with_their_parent():
    parent = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from blink.bench.attackers import Attackers, AttackSpec\n"
        "a = Attackers(AttackSpec(kind='spin', procs=2, duration_s=600)).start()\n"
        "print(' '.join(map(str, a.pids)), flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(process_gone(pid) for pid in pids)
        parent.kill()
        parent.wait()
        assert wait_gone(pids)
    finally:
        if parent.poll() is None:
            parent.kill()
