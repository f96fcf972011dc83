"""GPU diagnostics (not a test): bf16 error per kernel swapped to its reference, and a kernel-time profile
of one decode step, and the timeline of one replayed decode graph (kernel by kernel, with the gaps between
them). Usage: python tools/diag.py precision|profile|timeline"""
import copy
import os
import sys

import torch
import transformers

import blink.model.layers as layers
import blink.model.llama as llama
from blink.model import presets
from blink.model.config import ModelConfig
from blink.model.llama import LlamaForCausalLM
from blink.model.weights import load_hf_tensors
from tests.hf_models import randomize_weights
from tests.model.paged import PagedDriver


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def precision(name="llama3-8b", std=0.02, randomize=True):
    from blink.kernels.attention import paged_attention_ref
    from blink.kernels.rmsnorm import rms_norm_ref
    from blink.kernels.rope import rope_and_write_kv_ref

    hf_dict = {**presets.PRESETS[name], "num_hidden_layers": 2}
    arch = hf_dict["architectures"][0]
    hf_cfg = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**hf_dict)
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = getattr(transformers, arch)(hf_cfg).to(torch.bfloat16).eval()
    if randomize:
        randomize_weights(hf, seed=0, std=std)
    hf32 = copy.deepcopy(hf).float()
    ids = torch.randint(0, 100000, (300,)).tolist()
    with torch.no_grad():
        exact = hf32(torch.tensor([ids], device="cuda")).logits[0]
        hf_bf16 = hf(torch.tensor([ids], device="cuda")).logits[0]
    print(f"{name} randomize={randomize} std={std}: HF bf16 error {_rel(hf_bf16, exact):.5f}")
    cfg = ModelConfig.from_hf_dict(hf_dict)
    swaps = {"none": {}, "rms_norm": {(layers, "rms_norm"): rms_norm_ref},
             "attention": {(llama, "paged_attention"): paged_attention_ref},
             "rope_kv": {(llama, "rope_and_write_kv"): rope_and_write_kv_ref}}
    swaps["all"] = {k: v for d in list(swaps.values()) for k, v in d.items()}
    for flag in (True, False):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag
        model = LlamaForCausalLM(cfg, "cuda", torch.bfloat16, max_positions=4096)
        load_hf_tensors(model, hf.state_dict().items())
        out = PagedDriver(model, num_blocks=64, block_size=16).step({0: ids})[0]
        print(f"  blink bf16, allow_bf16_reduced_precision_reduction={flag}: error {_rel(out, exact):.5f}")
        with torch.no_grad():
            hf_out = hf(torch.tensor([ids], device="cuda")).logits[0]
        print(f"  HF bf16, allow_bf16_reduced_precision_reduction={flag}: error {_rel(hf_out, exact):.5f}")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    model32 = LlamaForCausalLM(cfg, "cuda", torch.float32, max_positions=4096)
    load_hf_tensors(model32, hf32.state_dict().items())
    out = PagedDriver(model32, num_blocks=64, block_size=16).step({0: ids})[0]
    print(f"  blink fp32 (same weights): error {_rel(out, exact):.6f}")
    # Unfused GEMMs in the blink model: same math as HF's three projections.
    x = torch.randn(300, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    w = model.model.layers[0].self_attn.qkv_proj.weight
    fused = torch.nn.functional.linear(x, w)
    parts = torch.cat([torch.nn.functional.linear(x, p) for p in w.split([cfg.q_size, cfg.kv_size, cfg.kv_size])], 1)
    ref = torch.nn.functional.linear(x.float(), w.float())
    print(f"  qkv GEMM fused err {_rel(fused, ref):.5f}  unfused err {_rel(parts, ref):.5f}")
    for label, patch in swaps.items():
        saved = {k: getattr(*k) for k in patch}
        for (mod, attr), fn in patch.items():
            setattr(mod, attr, fn)
        model = LlamaForCausalLM(cfg, "cuda", torch.bfloat16, max_positions=4096)
        load_hf_tensors(model, hf.state_dict().items())
        drv = PagedDriver(model, num_blocks=64, block_size=16)
        out = drv.step({0: ids})[0]
        print(f"  blink bf16 with refs for [{label:9s}]: error {_rel(out, exact):.5f}")
        for (mod, attr), fn in saved.items():
            setattr(mod, attr, fn)


def fp32_devices(name="llama3-8b"):
    """Blink fp32 on the GPU vs HF fp32 on the CPU and on the GPU: is a gap GPU-specific?"""
    hf_dict = {**presets.PRESETS[name], "num_hidden_layers": 2}
    arch = hf_dict["architectures"][0]
    hf_cfg = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**hf_dict)
    torch.manual_seed(0)
    hf = getattr(transformers, arch)(hf_cfg).float().eval()
    ids = torch.randint(0, 100000, (300,)).tolist()
    with torch.no_grad():
        ref_cpu = hf(torch.tensor([ids])).logits[0]
        hf_gpu = hf.to("cuda")(torch.tensor([ids], device="cuda")).logits[0].cpu()
    print(f"{name} fp32: HF gpu vs HF cpu {_rel(hf_gpu, ref_cpu):.2e}")
    cfg = ModelConfig.from_hf_dict(hf_dict)
    for device in ("cpu", "cuda"):
        model = LlamaForCausalLM(cfg, device, torch.float32, max_positions=4096)
        load_hf_tensors(model, hf.state_dict().items())
        out = PagedDriver(model, num_blocks=64, block_size=16).step({0: ids})[0].cpu()
        print(f"  blink fp32 on {device} vs HF cpu: {_rel(out, ref_cpu):.2e}")
    torch.backends.cuda.matmul.allow_tf32 = False
    for mod, attr in [(llama, "paged_attention"), (llama, "rope_and_write_kv"), (layers, "rms_norm")]:
        model = LlamaForCausalLM(cfg, "cuda", torch.float32, max_positions=4096)
        load_hf_tensors(model, hf.state_dict().items())
        import blink.kernels.attention as att
        import blink.kernels.rmsnorm as rn
        import blink.kernels.rope as rp
        ref = {"paged_attention": att.paged_attention_ref, "rope_and_write_kv": rp.rope_and_write_kv_ref,
               "rms_norm": rn.rms_norm_ref}[attr]
        saved = getattr(mod, attr)
        setattr(mod, attr, ref)
        out = PagedDriver(model, num_blocks=64, block_size=16).step({0: ids})[0].cpu()
        setattr(mod, attr, saved)
        print(f"  blink fp32 cuda with ref {attr}: {_rel(out, ref_cpu):.2e}")


def profile(name="llama3-8b", batch=1, ctx=1024):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    from blink.bench.step import decode_plan
    from blink.config import EngineArgs
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    args = EngineArgs(model=name, dtype="bfloat16", device="cuda", max_num_seqs=batch, max_num_batched_tokens=batch,
                      num_kv_blocks=batch * 80, max_model_len=ctx + 16)
    m = LoadedModel.load(args)
    r = ModelRunner.for_model(m, use_graphs=False)
    plan = decode_plan(None, batch, ctx, 16)
    r.prepare(plan, r.buffers, (batch, batch))
    for _ in range(3):
        r.forward(r.buffers, batch, batch)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            r.forward(r.buffers, batch, batch)
        torch.cuda.synchronize()
    print(f"{name} batch {batch} ctx {ctx}: per-step kernel time by name (5 steps, us per step)")
    rows = sorted(p.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / 5
    for e in rows[:25]:
        print(f"  {e.device_time_total / 5:9.1f} us  x{e.count // 5:4d}  {e.key[:100]}")
    print(f"  total {total:.1f} us")


def timeline(name="llama3-8b", batch=1, ctx=1024):
    """One decode step as the step bench replays it (graph, greedy sampling, the default levers): kernel time
    by name, and a mid-step window of kernels in order, each with the time from the previous kernel's end to
    its own (with PDL the kernels overlap, so that, not the duration, is what a kernel adds to the step)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    from blink.bench.roofline import ModelShape
    from blink.bench.step import decode_plan, graph_replay_ms
    from blink.config import EngineArgs
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner

    args = EngineArgs(model=name, dtype="bfloat16", device="cuda", max_num_seqs=batch, max_num_batched_tokens=batch,
                      num_kv_blocks=batch * 80, max_model_len=ctx + 16)
    m = LoadedModel.load(args)
    r = ModelRunner.for_model(m, use_graphs=True)
    bucket = r.bucket_for(batch, batch)
    r.prepare(decode_plan(None, batch, ctx, 16), r.buffers, bucket)
    graph = r.graphs[bucket]
    wall_us = graph_replay_ms(graph, 50) * 1e3
    floor_us = ModelShape.of(m.cfg).decode_floor_s(batch, ctx) * 1e6
    steps = 5
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            graph.replay()
            torch.cuda.synchronize()
    kernels = sorted((e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per_step = len(kernels) // steps
    one = kernels[-per_step:]  # the last replay
    busy = sum(e.time_range.end - e.time_range.start for e in one)
    span = one[-1].time_range.end - one[0].time_range.start
    print(f"{name} batch {batch} ctx {ctx}: replay {wall_us:.1f} us (floor {floor_us:.1f}, {wall_us / floor_us:.3f}x); "
          f"{per_step} kernels, their durations sum to {busy:.1f} us over a first-to-last span of {span:.1f} us "
          f"(with PDL a kernel starts before the one ahead ends, so durations overlap; profiled replays run slower)")
    by_name: dict[str, list[float]] = {}
    for e in one:
        by_name.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
    for key, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(ts):9.1f} us  x{len(ts):4d}  mean {sum(ts) / len(ts):7.2f}  {key}")
    mid = per_step // 2  # a window in mid-step: one layer's kernels and a few more
    columns = "us: gap before (< 0: overlap), duration, end since the previous end"
    for title, first, last in ((f"kernels {mid}..{mid + 15} of the step", mid, mid + 16),
                               ("the step's last kernels", per_step - 12, per_step)):
        print(f"  {title} ({columns}):")
        for prev, e in zip(one[first - 1:last - 1], one[first:last], strict=True):
            print(f"    {e.time_range.start - prev.time_range.end:6.2f}  {e.time_range.end - e.time_range.start:8.2f}  "
                  f"{e.time_range.end - prev.time_range.end:8.2f}  {e.name[:90]}", flush=True)
    del r, m
    torch.cuda.empty_cache()


if __name__ == "__main__":
    for what in sys.argv[1:]:
        if what == "fp32":
            fp32_devices()
        elif what == "precision":
            precision()
            precision(randomize=False)
        elif what == "profile":
            profile(batch=1)
            profile(batch=32)
        elif what == "timeline":  # TIMELINE_BATCHES: comma-separated batch sizes (default 1)
            for b in os.environ.get("TIMELINE_BATCHES", "1").split(","):
                timeline(batch=int(b))
