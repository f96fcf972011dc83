"""The self-test's report: checks (pass or fail, with a detail) and timings, printed as they come, summed up last."""
from __future__ import annotations


class Report:
    def __init__(self):
        self.checks: list[tuple[str, bool, str]] = []
        self.timings: list[tuple[str, str]] = []

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def time(self, name: str, value: str) -> None:
        self.timings.append((name, value))
        print(f"[TIME] {name}: {value}", flush=True)

    def summary(self) -> int:
        print("\n=== device-mode self-test ===")
        for name, ok, detail in self.checks:
            print(f"{'PASS' if ok else 'FAIL'}  {name:58s} {detail[:150]}")
        print("--- timings ---")
        for name, value in self.timings:
            print(f"{name:58s} {value}")
        failed = sum(not ok for _, ok, _ in self.checks)
        print(f"{len(self.checks) - failed}/{len(self.checks)} checks passed")
        return 1 if failed else 0
