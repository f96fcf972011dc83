"""The endpoints routers call on a worker: load, server and model info, a generation health check.

vllm-router reads `load` (an integer) from /get_load for its power_of_two policy and /get_loads; it
proxies /get_server_info, /get_model_info and /health_generate to a worker; its KV index reads
`model_path` and `kv_block_size` from the server info. Every counter here comes from the control
block, which the engine (host loop or GPU scheduler) publishes anyway: a read of shared memory, no
engine call.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import Response

from blink.frontend.engine_client import EngineUnavailable
from blink.frontend.errors import error_response
from blink.request import FinishReason, SamplingParams
from blink.transport.layout import ENGINE_MODE_DEVICE, ENGINE_MODE_HOST

HEALTH_GENERATE_TIMEOUT_S = 30.0
ENGINE_MODES = {ENGINE_MODE_HOST: "host", ENGINE_MODE_DEVICE: "device"}


def load_report(ctl) -> dict:
    """Running and waiting requests and KV usage, as the engine last published them."""
    running, waiting = int(ctl.running), int(ctl.waiting)
    total, free = int(ctl.total_kv_blocks), int(ctl.free_kv_blocks)
    return {"load": running + waiting, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "kv_usage": (total - free) / total if total else 0.0, "num_free_kv_blocks": free,
            "num_total_kv_blocks": total, "draining": bool(ctl.drain_flag)}


def install_worker_routes(app: FastAPI, state: Callable, config) -> None:
    """`state()` is the app's FrontendState; `config` its AppConfig."""

    def model_info() -> dict:
        s = state()
        return {"model_path": config.model, "tokenizer_path": config.tokenizer or config.model,
                "served_model_name": s.served_model_name, "is_generation": True,
                "max_model_len": s.max_model_len}

    @app.get("/get_load")
    async def get_load():
        return load_report(state().client.control)

    @app.get("/get_model_info")
    async def get_model_info():
        return model_info()

    @app.get("/get_server_info")
    async def get_server_info():
        ctl = state().client.control
        return {**model_info(), "engine_mode": ENGINE_MODES.get(int(ctl.engine_mode), "none"),
                "kv_block_size": int(ctl.block_size), "num_kv_blocks": int(ctl.total_kv_blocks),
                "tp_size": config.tensor_parallel_size, "dp_size": 1, "engine_steps": int(ctl.steps),
                "generated_tokens": int(ctl.tokens), "preemptions": int(ctl.preemptions), **load_report(ctl)}

    @app.get("/health_generate")
    async def health_generate():
        """One greedy token through the whole path (ring, scheduler, forward, egress): 200 or 503."""
        client = state().client
        if client.draining:
            return error_response(503, "server shutting down")
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        try:
            req_id, queue = client.add_request([0], params)
        except EngineUnavailable as e:
            return error_response(503, str(e))
        event = None
        try:
            while event is None or not event.finished:
                event = await asyncio.wait_for(queue.get(), HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            return error_response(503, f"no token within {HEALTH_GENERATE_TIMEOUT_S:.0f} s")
        finally:
            if event is None or not event.finished:
                client.abort(req_id)  # timed out, or the caller went away
        if event.finish_reason == FinishReason.ERROR or event.token_id < 0:
            return error_response(503, "the engine failed the health generation")
        return Response(status_code=200)
