"""The start-up banner: what this server runs, read from the engine's control block once it is ready."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from blink.transport.layout import DTYPE_NAMES, ENGINE_MODE_DEVICE, ENGINE_MODE_HOST

log = logging.getLogger("blink.frontend")
POLL_S = 0.05
MODES = {ENGINE_MODE_HOST: "host (CPU scheduler loop)", ENGINE_MODE_DEVICE: "device (resident GPU scheduler)"}


def random_weights_warning(model: str) -> str | None:
    """The demo model (its dir carries blink_demo_version) and presets have random weights."""
    path = Path(model)
    if (path / "blink_demo_version").is_file():
        return ("blink: serving the DEMO model: a tiny Llama with RANDOM weights; its output is gibberish "
                "by construction. Pass --model for real output.")
    if not path.is_dir():
        return f"blink: preset {model!r} has RANDOM weights of the real shapes; its output is gibberish."
    return None


def banner_lines(ctl, model: str, served_model_name: str) -> list[str]:
    dtype = DTYPE_NAMES[ctl.dtype] if ctl.dtype < len(DTYPE_NAMES) else "unknown"
    blocks, block_size = int(ctl.num_kv_blocks), int(ctl.block_size)
    buckets = list(ctl.bucket_tokens[:ctl.num_buckets])
    shape = f"{len(buckets)} buckets of up to {max(buckets, default=0)} tokens"
    graphs = f"{shape}, captured" if ctl.graphs_captured else f"none (eager; {shape})"
    return [
        f"blink: engine mode {MODES.get(int(ctl.engine_mode), 'unknown')}",
        f"blink: model {model} (served as {served_model_name!r}), dtype {dtype}",
        f"blink: max_model_len {ctl.max_model_len}, max_num_seqs {ctl.max_num_seqs}, "
        f"max_num_batched_tokens {ctl.max_num_batched_tokens}",
        f"blink: KV cache {blocks} blocks x {block_size} tokens = {blocks * block_size} tokens",
        f"blink: forward graphs: {graphs}",
    ]


async def wait_and_log_banner(ctl, model: str, served_model_name: str) -> None:
    while not ctl.ready:
        if ctl.exited:
            return
        await asyncio.sleep(POLL_S)
    for line in banner_lines(ctl, model, served_model_name):
        log.info(line)
    warning = random_weights_warning(model)
    if warning:
        log.warning(warning)
