"""bench/kernels/step_kernels.py end to end on the CPU (interpreter, tiny model, fp16, timing stubbed out), so
the one GPU run the benchmark gets does not die on a typo; also checks that its correctness columns are computed."""
import sys

import torch

from bench.kernels import step_kernels as bench
from blink.kernels.attention_plan import AttentionTuning


def test_bench_runs_on_a_tiny_model(monkeypatch, capsys):
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "DTYPE", torch.float16)  # the interpreter's bf16 tl.dot is wrong
    monkeypatch.setattr(bench, "graph_time_us", lambda calls, replays=30: [call() for call in calls] and 1.0)
    monkeypatch.setattr(bench, "copies_for", lambda nbytes: 1)
    # splits chosen in the kernel, in 16-position tiles so that a 128-token max len splits (4 ways)
    dyn = AttentionTuning(block_n=16, split_min_tiles=1, max_grid_splits=4)
    monkeypatch.setattr(bench, "ATTENTION_VARIANTS", {"default": AttentionTuning(),
                                                      bench.PREVIOUS_ATTENTION: AttentionTuning(num_stages=3),
                                                      "dyn": dyn})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    monkeypatch.setattr(sys, "argv", ["bench", "--model", "tiny-qwen3", "--context", "40,24",
                                      "--max-model-len", "128", "--batches", "2",
                                      "--sections", "attention,small,gemm,step"])
    bench.main()
    out = capsys.readouterr().out
    assert "SUMMARY" in out and "ALL GEMMs b2" in out
    assert "attention b2 ctx 24" in out and "step b2 ctx 40" in out  # a list of contexts
    assert "splits 4 (3 with KV)" in out and "splits 4 (2 with KV)" in out  # 40 and 24 tokens in tiles of 16
    words = out.split()
    errors = [float(word) for prev, word in zip(words, words[1:], strict=False) if prev == "err"]
    assert len(errors) >= 12 and max(errors) < 5e-3  # attention variants, small kernels, the cuBLAS GEMMs


def _fusion_on_cpu(monkeypatch):
    """bench/kernels/fusion.py on the CPU: the GEMV interpreted in wide tiles, timing stubbed out."""
    from bench.kernels import fusion
    from blink import kernels
    from blink.kernels import gemv

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "DTYPE", torch.float16)
    monkeypatch.setattr(bench, "graph_time_us", lambda calls, replays=30: [call() for call in calls] and 1.0)
    monkeypatch.setattr(bench, "copies_for", lambda nbytes: 1)
    monkeypatch.setattr(kernels, "_triton_device", lambda x: True)  # the model's GEMV path, interpreted
    # Wide tiles: the interpreter's time goes with the number of programs.
    monkeypatch.setattr(gemv, "default_config",  # more rows on tensor cores, as the default's
                        lambda n, k, m=1, prologue="none", epilogue="none":
                        gemv.GemvConfig(block_n=64, block_k=64, dot=m > 1 or epilogue != "none"))
    monkeypatch.setattr(fusion, "SWEEP", [gemv.GemvConfig(block_n=32, block_k=32, dot=True)])
    monkeypatch.setattr(fusion, "SILU_SWEEP", [gemv.GemvConfig(block_n=32, block_k=32, dot=True)])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    return fusion


def test_fusion_bench_runs_on_a_tiny_model(monkeypatch, capsys):
    """bench/kernels/fusion.py: every section, the GEMV under the interpreter, timing stubbed out."""
    fusion = _fusion_on_cpu(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["fusion", "--model", "tiny-llama", "--context", "40,24", "--max-model-len", "64",
                                      "--batches", "2", "--ms", "3"])
    fusion.main()
    out = capsys.readouterr().out
    assert "SUMMARY step" in out and "suggested BLINK_GEMV=" in out
    for label in fusion.LEVERS:  # each context's step
        assert f"b2    ctx 40     {label}" in out and f"b2    ctx 24     {label}" in out
    words = out.split()
    errors = [float(word) for prev, word in zip(words, words[1:], strict=False) if prev == "err"]
    # 5 projections x (today, gemv, gemv+pdl, 1 sweep config), a step row per lever and context; fp16 vs fp32.
    # At 3 rows gate|up runs the SiLU-mul epilogue and down reads the activation (no SiLU-prologue bound row)
    assert "prologue add_norm epilogue silu_mul" in out and "prologue none epilogue none" in out
    assert len(errors) == 5 * 4 + 2 * len(fusion.LEVERS) and max(errors) < 1e-2
    assert "gemv layers 9" in out  # tiny-llama: 2 layers x 4 projections + the LM head took the plan


def _prefill_bench_output(monkeypatch, capsys, *argv: str) -> str:
    """bench/kernels/prefill_attention.py's printout on the CPU (fp16, one cache copy, each timing one call)."""
    from bench.kernels import prefill_attention

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "DTYPE", torch.float16)
    monkeypatch.setattr(bench, "graph_time_us", lambda calls, replays=30: [call() for call in calls] and 1.0)
    monkeypatch.setattr(bench, "copies_for", lambda nbytes: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    monkeypatch.setattr(sys, "argv", ["prefill", *argv])
    prefill_attention.main()
    return capsys.readouterr().out


def test_prefill_attention_bench_runs_on_tiny_shapes(monkeypatch, capsys):
    """bench/kernels/prefill_attention.py: every variant on a prompt and a chunk after cached tokens."""
    from bench.kernels import prefill_attention

    out = _prefill_bench_output(monkeypatch, capsys, "--tokens", "40", "--chunks", "24@50", "--heads", "8/2",
                                "--head-dim", "32", "--ref-max", "1700")
    assert "SUMMARY" in out and "40@0" in out and "24@50" in out
    words = out.split()
    errors = [float(word) for prev, word in zip(words, words[1:], strict=False) if prev in ("err", "ref")]
    # each variant against the first, and against the reference where T * (T + C) <= 1700 (40 x 40, not 24 x 74)
    assert len(errors) == 2 * len(prefill_attention.VARIANTS) + len(prefill_attention.VARIANTS)
    assert max(errors) < 5e-3
    assert out.count(" unsplit") == sum(not t.prefill_causal_split for t in prefill_attention.VARIANTS.values()) * 2


def test_prefill_attention_bench_takes_ordered_blocks(monkeypatch, capsys):
    """--table ordered: the same keys through consecutive blocks at every block size (a fresh server's prompt)."""
    from bench.kernels import prefill_attention

    assert prefill_attention._block_order(5, True, "cpu").tolist() == [0, 1, 2, 3, 4]
    shuffled = prefill_attention._block_order(5, False, "cpu").tolist()
    assert len(set(shuffled)) == 5 and max(shuffled) <= 5  # 5 distinct blocks of the pool's 6
    out = _prefill_bench_output(monkeypatch, capsys, "--tokens", "40", "--chunks", "24@50", "--heads", "4/2",
                                "--head-dim", "32", "--variants", "today,one-entry,today-b128", "--table", "ordered")
    words = out.split()
    errors = [float(word) for prev, word in zip(words, words[1:], strict=False) if prev in ("err", "ref")]
    assert out.count("ordered blocks") == 2 and len(errors) == 2 * 3 * 2 and max(errors) < 5e-3


def test_prefill_attention_bench_weighs_the_ws_kernel_and_block_sizes(monkeypatch, capsys):
    """The warp-specialised kernel's rows run it (" WS") on the same keys re-paged in 64 / 128-token blocks."""
    out = _prefill_bench_output(monkeypatch, capsys, "--tokens", "150", "--chunks", "70@130", "--heads", "4/2",
                                "--head-dim", "64", "--variants", "today,ws-b128,ws-b64,today-b64")
    words = out.split()
    errors = [float(word) for prev, word in zip(words, words[1:], strict=False) if prev in ("err", "ref")]
    assert len(errors) == 2 * 4 * 2 and max(errors) < 5e-3  # the same keys and values in every block size
    assert out.count(" WS") == 2 * 2 and out.count("block 64") == 2 * 2 and out.count("block 128") == 2


def test_fusion_step_summary_takes_the_median_of_rounds():
    """--repeats: each lever's rows grouped in first-seen order, whatever the rounds' order."""
    from bench.kernels.fusion import step_summary

    rows = [(8, 1024, "a", 4600.0, 1.23, 195), (8, 1024, "b", 4700.0, 1.25, 195),
            (8, 1024, "a", 4500.0, 1.20, 0), (8, 1024, "b", 4750.0, 1.27, 0), (8, 1024, "a", 4550.0, 1.21, 0)]
    grouped = step_summary(rows)
    assert list(grouped) == [(8, 1024, "a"), (8, 1024, "b")]
    assert [us for us, _, _ in grouped[(8, 1024, "a")]] == [4600.0, 4500.0, 4550.0]
    assert grouped[(8, 1024, "b")][0][2] == 195  # the first round's kernel count leads


def test_fusion_step_rounds_interleave_the_levers(monkeypatch, capsys):
    """--repeats 2: each chosen lever once a round, rounds labelled, the summary a median with its spread."""
    fusion = _fusion_on_cpu(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["fusion", "--model", "tiny-llama", "--context", "24", "--max-model-len", "64",
                                      "--batches", "2", "--sections", "step", "--levers", "baseline;gemv+pdl",
                                      "--repeats", "2"])
    fusion.main()
    out = capsys.readouterr().out
    rows = [line.split(" (round ")[0].strip() + " " + line.split(" (round ")[1][0]
            for line in out.splitlines() if " (round " in line]
    assert rows == ["baseline 1", "gemv+pdl 1", "baseline 2", "gemv+pdl 2"]  # interleaved, not lever by lever
    assert "median [min-max] of 2 rounds" in out and "b2    baseline" in out and "b2    gemv+pdl" in out


def test_qkv_rope_bench_runs_on_a_tiny_model(monkeypatch, capsys):
    """bench/kernels/qkv_rope.py: the two kernels and the fused one under the interpreter, timing stubbed out; the
    fused kernel's qkv and caches agree with the two kernels'."""
    from bench.kernels import qkv_rope

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "DTYPE", torch.float16)
    monkeypatch.setattr(bench, "graph_time_us", lambda calls, replays=30: [call() for call in calls] and 1.0)
    monkeypatch.setattr(bench, "copies_for", lambda nbytes: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    monkeypatch.setattr(sys, "argv", ["qkv_rope", "--model", "tiny-llama", "--ms", "1,3", "--tiles", "16x32x2"])
    qkv_rope.main()
    out = capsys.readouterr().out
    assert "gemv, then rope + KV write" in out and "fused n16 k32 s2" in out and "FAILED" not in out
    words = out.split()
    errors = [float(word) for prev, word in zip(words, words[1:], strict=False) if prev == "err"]
    assert len(errors) == 2 * 2 and max(errors) < 5e-3  # one row (CUDA-core loop) and three (tensor cores)


def _sampler_bench_on_the_cpu(monkeypatch, capsys, argv: list[str]) -> str:
    """bench/kernels/sampler.py's main with `argv` under the interpreter: a 300-token vocabulary, graphs and .cuda()
    stubbed out; returns what it printed."""
    from bench.kernels import sampler

    monkeypatch.setattr(sampler, "VOCAB", 300)
    monkeypatch.setattr(sampler, "to_cuda", lambda state: state)
    monkeypatch.setattr(sampler, "time_graph", lambda fn: fn() and 1.0)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    monkeypatch.setattr(sys, "argv", ["sampler", *argv])
    sampler.main()
    return capsys.readouterr().out


def test_sampler_bench_columns_on_the_cpu(monkeypatch, capsys):
    """bench/kernels/sampler.py with the rejection's columns (--reject 0,3,3k) under the interpreter, a 300-token
    vocabulary, graphs and .cuda() stubbed out: every column printed, 0 mismatches against the CPU reference."""
    out = _sampler_bench_on_the_cpu(monkeypatch, capsys, ["--sizes", "2", "--scenarios", "top_p,top_k", "--race",
                                                          "list", "--compact", "once", "--reject", "0,3,3k",
                                                          "--no-old"])
    # the engine's lane floor for top_k rows is the bench's default (--topk)
    assert "+list+once+floor us" in out and "+list+once+rj3+floor us" in out and "+list+once+rj3k+floor us" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("top_p ", "top_k "))]
    assert len(rows) == 2 and all(row[3:8:2] == ["0/0"] * 3 for row in rows), rows  # us, bad/fb per column


def test_sampler_bench_without_the_search_on_the_cpu(monkeypatch, capsys):
    """--search on,off: the column without the search's launches times the rows that may take it (0 mismatches
    against the CPU reference) and prints "-" where a row needs the search (top_p)."""
    out = _sampler_bench_on_the_cpu(monkeypatch, capsys, ["--sizes", "3", "--scenarios", "greedy,temperature,top_p",
                                                          "--race", "list", "--compact", "once", "--search", "on,off",
                                                          "--no-old"])
    assert "+list+once+floor us" in out and "+list+once+floor+nosearch us" in out
    rows = {line.split()[0]: line.split()[2:6] for line in out.splitlines()
            if line.startswith(("greedy ", "temperature ", "top_p "))}
    assert rows["greedy"][1::2] == rows["temperature"][1::2] == ["0/0", "0/0"], rows
    assert rows["top_p"][1:] == ["0/0", "-", "-"], rows
