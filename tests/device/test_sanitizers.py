"""The scheduler's C++ under AddressSanitizer + UBSan and ThreadSanitizer: tools/sanitize_scheduler.sh builds the
host library with the sanitizer and runs the CPU tests that drive it with host threads as the CTA. A data race
between team threads, an out-of-bounds index or undefined behaviour fails here instead of on a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a build and a nested test run each

ROOT = Path(__file__).resolve().parents[2]


def runtime(name: str) -> bool:
    try:
        path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        return False
    return os.path.isabs(path) and os.path.exists(path)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind,runtime_name", [("asan", "libasan.so"), ("tsan", "libtsan.so")])
def test_the_scheduler_is_clean_under_the_sanitizer(kind, runtime_name, tmp_path):
    if not runtime(runtime_name):
        pytest.skip(f"gcc has no {runtime_name}")
    done = subprocess.run(["bash", str(ROOT / "tools" / "sanitize_scheduler.sh"), kind], cwd=ROOT,
                          env={**os.environ, "PY": sys.executable, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert " passed" in done.stdout and not list(tmp_path.glob("report.*"))
