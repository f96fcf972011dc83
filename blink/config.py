"""Engine arguments shared by `generate`, `serve` and the engine process (vLLM's flag names)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import NamedTuple


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class DeviceIdle(NamedTuple):
    """`--device-idle`, parsed: how device mode's resident loop idles (blink/device/idle.py applies it)."""
    mode: str  # spin | deep | park
    deep_after_ms: float  # backoff cap rises from 8 us to deep_max_us once idle this long (deep, park)
    deep_max_us: int
    park_after_ms: float  # park: the kernel exits once idle this long; the host relaunches it on work
    park_poll_us: int  # park: how often the host reads the ring while parked (its CPU cost vs the wake-up)


DEVICE_IDLE_HELP = ("device mode's idle loop: spin (sleeps of at most 8 us), deep[:AFTER_MS[:MAX_US]] (sleeps "
                    "grow to MAX_US, at most 1000, once idle AFTER_MS; default deep:10:100) or "
                    "park[:AFTER_MS[:POLL_US]] (the kernel exits once idle AFTER_MS, default 100, and a host thread "
                    "relaunches it on work, reading the ring every POLL_US, default 1000; a TP loop never parks)")


def parse_device_idle(spec: str) -> DeviceIdle:
    """'spin' | 'deep[:AFTER_MS[:MAX_US]]' | 'park[:AFTER_MS[:POLL_US]]'; ValueError naming the flag otherwise."""
    mode, *nums = spec.split(":")
    limits = {"spin": 0, "deep": 2, "park": 2}
    try:
        if mode not in limits or len(nums) > limits[mode]:
            raise ValueError
        values = [float(n) for n in nums]
    except ValueError:
        raise ValueError(f"--device-idle: {spec!r} is not spin, deep[:AFTER_MS[:MAX_US]] or "
                         "park[:AFTER_MS[:POLL_US]]") from None
    if mode == "spin":
        return DeviceIdle("spin", 0.0, 8, 0.0, 0)
    if mode == "park":
        after, poll = (values + [100.0, 1000.0][len(values):])[:2]
        if after <= 10.0 or not 20 <= poll <= 100_000:
            raise ValueError("--device-idle park:AFTER_MS:POLL_US: AFTER_MS > 10 (the deep backoff's) and "
                             "20 <= POLL_US <= 100000")
        return DeviceIdle("park", 10.0, 100, after, int(poll))
    after, top = (values + [10.0, 100.0][len(values):])[:2]
    if after < 0 or not 8 <= top <= 1000:
        raise ValueError("--device-idle deep:AFTER_MS:MAX_US: AFTER_MS >= 0 and 8 <= MAX_US <= 1000 (__nanosleep)")
    return DeviceIdle("deep", after, int(top), 0.0, 0)


def _device_idle_arg(spec: str) -> str:
    try:
        parse_device_idle(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return spec


MAX_DECODE_PACE_MS = 1000.0


def _decode_pace_arg(text: str) -> float:
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not 0.0 <= ms <= MAX_DECODE_PACE_MS:
        raise argparse.ArgumentTypeError(f"--decode-pace-ms: {text!r} is not a number of ms in [0, "
                                         f"{MAX_DECODE_PACE_MS:g}]")
    return ms


def _decode_pace_batch_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--decode-pace-max-batch: {text!r} is not a count of sequences >= 0")
    return n


@dataclass(frozen=True)
class EngineArgs:
    model: str | None = None  # a model dir or a preset name; None = the default demo model
    tokenizer: str | None = None  # defaults to the model dir
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str | None = None  # cuda | cpu; None = cuda when present
    max_model_len: int | None = None  # None = the model's max_position_embeddings (capped at 8192)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None  # explicit pool size (CPU default: enough for max_num_seqs x 512)
    enforce_eager: bool = False
    seed: int = 0
    engine: str | None = None  # device | host; None = device on a GPU, host otherwise
    tensor_parallel_size: int = 1
    # One CPU list per tensor-parallel rank, ';'-separated ("0-3;4-7"): each rank process pins itself to
    # its own cores (the barrier experiment attacks one rank's cores). None = no pinning.
    rank_cpus: str | None = None
    all_reduce: str = "auto"  # auto | nccl | p2p (decode-sized bf16 all-reduces on blink's LL kernel)
    num_layers: int | None = None  # cut a preset to this many layers (short benchmarks of real shapes)
    grammar_arena_mb: int = 64  # GPU memory for structured-output automata (blink/grammar/arena.py); 0 = off
    enable_prefix_caching: bool = True  # as vLLM: reuse the KV blocks of cached prompt prefixes
    device_idle: str = "deep"  # device mode's idle loop (parse_device_idle; issue 19)
    decode_pace_ms: float = 0.0  # issue 19, energy: decodes-only steps start this long after the last; 0 = off
    decode_pace_max_batch: int = 0  # the pace holds only batches of at most this many sequences; 0 = any batch
    # Prompt logprobs (echo + logprobs, prompt_logprobs): logits rows per step for prompt positions; 0 = off.
    max_prompt_logprob_rows: int = 256
    gc_freeze: bool = True  # freeze each serving process's startup heap out of Python's GC (util/gc_pauses.py)

    @property
    def resolved_device(self) -> str:
        return self.device or default_device()

    def __post_init__(self):
        if self.decode_pace_max_batch and not self.decode_pace_ms:
            raise ValueError("--decode-pace-max-batch needs --decode-pace-ms: without a pace it would do nothing")

    @property
    def resolved_engine(self) -> str:
        return self.engine or ("device" if self.resolved_device == "cuda" else "host")

    @staticmethod
    def add_cli_args(p: argparse.ArgumentParser) -> None:
        d = EngineArgs()
        D = " (default: %(default)s)"
        p.add_argument("--model", default=d.model,
                       help="model dir (Hugging Face layout, safetensors) or preset name; default: the demo model "
                            "(tiny Llama, random weights)")
        p.add_argument("--tokenizer", default=d.tokenizer,
                       help="tokenizer dir (default: the model dir; with a preset, its vocabulary over the "
                            "preset's shapes)")
        p.add_argument("--dtype", default=d.dtype, choices=["auto", "bfloat16", "float16", "float32"],
                       help="weight and KV dtype; auto = the checkpoint's" + D)
        p.add_argument("--device", default=d.device, choices=["cuda", "cpu"],
                       help="default: cuda when a GPU is present, else cpu")
        p.add_argument("--max-model-len", type=int, default=d.max_model_len,
                       help="context length (prompt + output); default: the model's max_position_embeddings, "
                            "capped at 8192")
        p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                       help="most sequences in one step's batch" + D)
        p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                       help="token budget of one step (prefill chunks + decodes)" + D)
        p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV-cache block" + D)
        p.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                       help="fraction of GPU memory for weights + KV cache (sizes the KV pool on a GPU)" + D)
        p.add_argument("--num-kv-blocks", type=int, default=d.num_kv_blocks,
                       help="explicit KV pool size in blocks; default: from --gpu-memory-utilization on a GPU, "
                            "max-num-seqs x 512 tokens on the CPU")
        p.add_argument("--enforce-eager", action="store_true",
                       help="host mode: run the model eagerly instead of replaying CUDA graphs (default: off)")
        p.add_argument("--seed", type=int, default=d.seed,
                       help="seed of random weights and of requests that give none" + D)
        p.add_argument("--engine", default=d.engine, choices=["device", "host"],
                       help="device = resident GPU scheduler, host = Python scheduler loop; default: device on "
                            "a GPU, host on the CPU")
        p.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size,
                       help="ranks (GPUs) the model is split over" + D)
        p.add_argument("--rank-cpus", default=d.rank_cpus,
                       help="pin each tensor-parallel rank to its own cores: one list per rank, e.g. '0-3;4-7' "
                            "(default: no pinning)")
        p.add_argument("--all-reduce", default=d.all_reduce, choices=["auto", "nccl", "p2p"],
                       help="tensor parallelism: p2p sends decode-sized bf16 all-reduces through blink's own "
                            "peer-memory kernel instead of NCCL (auto: p2p on GPUs)" + D)
        p.add_argument("--num-layers", type=int, default=d.num_layers,
                       help="cut a preset to this many layers, for benchmarks (default: all)")
        p.add_argument("--grammar-arena-mb", type=int, default=d.grammar_arena_mb,
                       help="memory for structured-output automata, in 16 equal partitions (0: refuse them; "
                            "default: %(default)s)")
        p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=d.enable_prefix_caching,
                       help="share the KV blocks of cached prompt prefixes (on by default, as in vLLM; "
                            "--no-enable-prefix-caching turns it off)")
        p.add_argument("--device-idle", type=_device_idle_arg, default=d.device_idle, help=DEVICE_IDLE_HELP + D)
        p.add_argument("--decode-pace-ms", type=_decode_pace_arg, default=d.decode_pace_ms,
                       help="energy per token: a step of decodes only starts no sooner than this after the last step "
                            "began (fewer, fuller steps for slower decoding; a new request is never held back), in "
                            f"both engines; 0 = off, at most {MAX_DECODE_PACE_MS:g}" + D)
        p.add_argument("--decode-pace-max-batch", type=_decode_pace_batch_arg, default=d.decode_pace_max_batch,
                       help="the decode pace holds a step only while at most this many sequences run (small batches "
                            "pay most energy a token, and a full batch runs at full speed); 0 = any batch" + D)
        p.add_argument("--max-prompt-logprob-rows", type=int, default=d.max_prompt_logprob_rows,
                       help="prompt positions per step whose logprobs are computed (prompt_logprobs, echo with "
                            "logprobs); longer prompts take more prefill steps. 0 refuses them, as does tensor "
                            "parallelism for now" + D)
        p.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=d.gc_freeze,
                       help="once the front end and host mode's engine loop are ready, freeze their startup "
                            "objects out of Python's garbage collector, whose full collections otherwise pause "
                            "every stream (--no-gc-freeze turns it off; default: on)")

    @classmethod
    def from_cli(cls, ns: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    def to_cli(self) -> list[str]:
        """The flags that reproduce these arguments (for starting the engine process)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if f.name in ("enable_prefix_caching", "gc_freeze"):  # on by default: only the flag can say no
                out += [flag if v else "--no-" + flag[2:]]
            elif isinstance(v, bool):
                out += [flag] if v else []
            elif v is not None:
                out += [flag, str(v)]
        return out
