"""Graph-vs-eager agreement of the 4-layer llama3-8b host engine (the GPU suite's workload: 24 greedy requests),
to find what moves it. Session 13's attention tuning took `fusion-tests` from 23/24 requests identical to 13/24
(session 14, call 1) with eager unpadded. Prints, per variant, the requests identical and where the others part:
eager padded to the graphs' buckets (the runner's default on a GPU since 2026-12-03: any difference is then a
capture bug), eager at the exact shape under each attention tuning, and PDL off.

    bash tools/gpu_run.sh graph-eager    (python -m tools.diag_graph_eager, with the carried wheels on the path)
"""
from __future__ import annotations

import dataclasses

from bench.kernels.attention_variants import BEFORE_SESSION_13
from blink.config import EngineArgs
from blink.host.engine import HostEngine
from blink.kernels.attention import default_tuning_switched
from blink.kernels.attention_plan import AttentionTuning
from blink.kernels.pdl import pdl_switched
from tests.host.test_host_engine import run_all
from tests.host.test_host_engine_gpu import LLAMA3_8B_4L, eager_run, llama3_8b_4l_workload

TODAY = AttentionTuning()
# label: (attention tuning, eager padded to the buckets, PDL)
VARIANTS = {
    "today, eager padded": (TODAY, True, True),
    "today, eager padded, PDL off": (TODAY, True, False),
    "today, eager exact": (TODAY, False, True),
    "session 12 attention, eager exact": (BEFORE_SESSION_13, False, True),
    "no thin tiles at batch 1, eager exact": (dataclasses.replace(TODAY, small_grid_programs=None), False, True),
    "split below 1/SM, eager exact": (dataclasses.replace(TODAY, split_below_per_sm=1.0), False, True),
}


def main() -> None:
    loaded, requests = llama3_8b_4l_workload()
    for name, (tuning, padded, pdl) in VARIANTS.items():
        with default_tuning_switched(tuning), pdl_switched(pdl):
            graphs, _, _ = run_all(HostEngine(EngineArgs(**LLAMA3_8B_4L), loaded), requests)
            eager = eager_run(loaded, requests, padded)
        parted = {i: next(j for j, (a, b) in enumerate(zip(graphs[i], eager[i], strict=True)) if a != b)
                  for i in requests if graphs[i] != eager[i]}
        print(f"{name:<40} {len(requests) - len(parted)}/{len(requests)} identical; parted at token "
              f"{sorted(parted.values())}", flush=True)


if __name__ == "__main__":
    main()
