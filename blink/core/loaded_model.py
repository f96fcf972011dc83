"""Everything an engine provisions once at start: model, KV pool, sampling state and the limits."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from blink.config import EngineArgs
from blink.core.kv_cache import KVCache, allocate_kv_cache, bytes_per_block, choose_num_blocks
from blink.core.limits import EngineLimits
from blink.kernels.sampling_state import SamplingState
from blink.model.config import DTYPES
from blink.request import SamplingParams
from blink.util.startup import phase


@dataclass
class LoadedModel:
    model: torch.nn.Module
    cfg: object  # blink.model.config.ModelConfig
    kv_cache: KVCache
    sampling_state: SamplingState
    device: str
    limits: EngineLimits
    model_path: str | None  # None for a preset (random weights, no tokenizer)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.cfg.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self.limits.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    @classmethod
    def load(cls, args: EngineArgs, num_layers: int | None = None, tp=None) -> LoadedModel:
        """num_layers: cut a preset to fewer layers (quick benchmarks of the real shapes).
        tp: this rank's TPGroup (blink/parallel/group.py) under tensor parallelism, else None."""
        from blink.model.demo import ensure_default_model
        from blink.model.llama import local_kv_heads
        from blink.model.weights import load_model

        device = args.resolved_device
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but no CUDA GPU is available")
        source = args.model or str(ensure_default_model())
        dtype = None if args.dtype == "auto" else DTYPES[args.dtype]
        max_len = args.max_model_len
        num_layers = num_layers if num_layers is not None else args.num_layers
        if num_layers is not None:
            model, cfg = _short_preset(source, num_layers, device, dtype, max_len, args.seed, tp)
        else:
            model, cfg = load_model(source, device=device, dtype=dtype, max_positions=max_len, seed=args.seed,
                                    tp=tp)
        dtype = next(model.parameters()).dtype
        phase("engine", f"model built ({source}, {dtype})")
        # Under tensor parallelism each rank caches only its own KV heads, and all ranks take the smallest
        # pool any of them can hold (rank 0 schedules blocks for all of them).
        kv_cfg = dataclasses.replace(cfg, num_key_value_heads=local_kv_heads(cfg, 1 if tp is None else tp.size))
        per_block = bytes_per_block(cfg.num_hidden_layers, args.block_size, kv_cfg.num_key_value_heads,
                                    cfg.head_dim, dtype)
        num_blocks = choose_num_blocks(args, cfg, dtype, device, per_block)
        if tp is not None:
            num_blocks = tp.min_over_ranks(num_blocks)
        limits = EngineLimits.resolve(args, cfg.max_position_embeddings, cfg.vocab_size, num_blocks)
        kv = allocate_kv_cache(kv_cfg, num_blocks, args.block_size, dtype, device)
        # One extra slot: the scratch row that padding and mid-prefill rows point at.
        state = SamplingState(args.max_num_seqs + 1, cfg.vocab_size, device,
                              grammar_arena_bytes=args.grammar_arena_mb << 20)
        path = None if _is_preset(source) else source
        phase("engine", f"KV cache allocated ({num_blocks} blocks)")
        return cls(model, cfg, kv, state, device, limits, path)

    def publish(self, ctl, captured: bool) -> None:
        """The dtype and whether the buckets are captured graphs, for the front end's start-up banner (the
        limits are publish_limits')."""
        from blink.transport.layout import DTYPE_NAMES

        name = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        ctl.dtype = DTYPE_NAMES.index(name) if name in DTYPE_NAMES else 0
        ctl.graphs_captured = int(captured)

    def validate_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """One-line ValueErrors for requests that could never be served."""
        n = len(prompt_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= self.max_model_len:
            raise ValueError(f"the prompt has {n} tokens but the context length is {self.max_model_len}; "
                             "at least one token must fit after it")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range [0, {self.vocab_size})")
        if params.prompt_logprobs is not None and self.limits.prompt_logprob_rows == 0:
            raise ValueError("prompt logprobs are off in this engine (tensor parallelism or "
                             "--max-prompt-logprob-rows 0)")
        longest = min(n + params.max_tokens, self.max_model_len)
        need = -(-longest // self.kv_cache.block_size)
        if need > self.kv_cache.num_blocks:
            raise ValueError(f"the request needs up to {need} KV blocks but the pool has "
                             f"{self.kv_cache.num_blocks}")


def _is_preset(source: str) -> bool:
    from blink.model.presets import PRESETS

    return source in PRESETS


def _short_preset(name: str, num_layers: int, device, dtype, max_len, seed, tp):
    from blink.model import presets
    from blink.model.llama import LlamaForCausalLM
    from blink.model.weights import init_preset_weights

    cfg = dataclasses.replace(presets.get(name), num_hidden_layers=num_layers)
    model = LlamaForCausalLM(cfg, torch.device(device), dtype or cfg.dtype, tp, max_positions=max_len)
    init_preset_weights(model, seed, tp)
    return model.eval(), cfg
