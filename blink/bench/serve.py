"""`blink bench serve`: an OpenAI-API load generator with vLLM `bench serve`'s flag names."""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import sys

import httpx
from rich.console import Console
from rich.table import Table

from blink.bench.metrics import LATENCY_METRICS, PERCENTILES, per_request_details
from blink.bench.prefix_workload import multi_turn_requests, prefix_requests
from blink.bench.runner import LoadConfig, fetch_model_name, run_load
from blink.bench.token_codec import make_codec
from blink.bench.workload import random_requests, sharegpt_requests, synthetic_sharegpt_requests

LATENCY_TITLES = {"ttft": "Time to first token", "tpot": "Time per output token (excl. 1st)",
                  "itl": "Inter-token latency", "e2el": "End-to-end latency"}


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The dataset and sampling flags, shared with `blink bench interference`."""
    p.add_argument("--model", default=None, help="model name sent to the server (default: its first model)")
    p.add_argument("--tokenizer", default=None,
                   help="local tokenizer dir (default: --model if a local dir, else the server's /tokenize)")
    p.add_argument("--dataset-name", default="random", choices=["random", "sharegpt", "multi-turn"],
                   help="multi-turn: conversations resending their history (prefix caching)")
    p.add_argument("--dataset-path", default=None,
                   help="ShareGPT-format JSON; without it, sharegpt uses synthetic ShareGPT-like lengths")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-prefix-len", type=int, default=0,
                   help="random and multi-turn: tokens of a prefix shared by every prompt, before its own part")
    p.add_argument("--multi-turn-turns", type=int, default=4, help="multi-turn: turns per conversation")
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]; 0 = exact lengths")
    p.add_argument("--sharegpt-output-len", type=int, default=None, help="override every reply length")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="a JSON schema file every request asks for (vLLM's structured_outputs.json): "
                        "constrained serving")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--disable-tqdm", action="store_true")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    add_workload_arguments(p)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf = all at once")
    p.add_argument("--duration", type=float, default=None,
                   help="stop sending after this many seconds (requests still running after "
                        "--drain-timeout more are cancelled and counted as incomplete)")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--result-json", default=None, help="write the result dictionary here")
    p.add_argument("--save-detailed", action="store_true", help="add per-request lists to the result")


def build_requests(args: argparse.Namespace, base_url: str, model: str, num_prompts: int):
    """`model`: the name the server serves (it may differ from --model, e.g. for an external peer)."""
    codec = make_codec(args.tokenizer, args.model or model, base_url, seed=args.seed, served_model=model)
    try:
        if args.dataset_name == "random" and args.random_prefix_len:
            return prefix_requests(codec, num_prompts, args.random_prefix_len, args.random_input_len,
                                   args.random_output_len, args.random_range_ratio, args.seed)
        if args.dataset_name == "random":
            return random_requests(codec, num_prompts, args.random_input_len, args.random_output_len,
                                   args.random_range_ratio, args.seed)
        if args.dataset_name == "multi-turn":
            return multi_turn_requests(codec, num_prompts, args.multi_turn_turns, args.random_prefix_len,
                                       args.random_input_len, args.random_output_len, args.seed)
        if args.dataset_path:
            return sharegpt_requests(codec, args.dataset_path, num_prompts, args.seed,
                                     args.sharegpt_output_len)
        return synthetic_sharegpt_requests(codec, num_prompts, args.seed, args.sharegpt_output_len)
    finally:
        if hasattr(codec, "close"):
            codec.close()


def load_config(args: argparse.Namespace, base_url: str, model: str, request_rate: float,
                max_duration_s: float | None, drain_s: float) -> LoadConfig:
    return LoadConfig(
        base_url=base_url, model=model, endpoint=getattr(args, "endpoint", "/v1/completions"),
        request_rate=request_rate, burstiness=args.burstiness, max_concurrency=args.max_concurrency,
        ignore_eos=args.ignore_eos, temperature=args.temperature, seed=args.seed,
        max_duration_s=max_duration_s, drain_s=drain_s, show_progress=not args.disable_tqdm,
        extra_body=constraint_body(args),
    )


def constraint_body(args: argparse.Namespace) -> dict | None:
    """--json-schema: the request fields that constrain every request to the schema."""
    path = getattr(args, "json_schema", None)
    if not path:
        return None
    with open(path) as f:
        return {"structured_outputs": {"json": json.load(f)}}


def run_config(args: argparse.Namespace, base_url: str, model: str, request_rate: float) -> dict:
    """The settings of a run, stored next to its metrics."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "base_url": base_url, "model": model, "dataset_name": args.dataset_name,
        "dataset_path": args.dataset_path, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
        "random_prefix_len": args.random_prefix_len, "multi_turn_turns": args.multi_turn_turns,
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
        "ignore_eos": args.ignore_eos, "temperature": args.temperature, "seed": args.seed,
        "json_schema": getattr(args, "json_schema", None),
    }


def print_summary(result: dict, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="Serving benchmark result", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("Successful requests", "completed"), ("Failed requests", "failed"),
            ("Incomplete requests", "incomplete"), ("Benchmark duration (s)", "duration"),
            ("Total input tokens", "total_input_tokens"), ("Total generated tokens", "total_output_tokens"),
            ("Prefix cache hit rate", "prefix_cache_hit_rate"),
            ("Request throughput (req/s)", "request_throughput"),
            ("Output token throughput (tok/s)", "output_throughput"),
            ("Total token throughput (tok/s)", "total_token_throughput")]
    for title, key in rows:
        value = result.get(key)
        if value is not None:
            table.add_row(title, f"{value:.2f}" if isinstance(value, float) else str(value))
    for name in LATENCY_METRICS:
        table.add_section()
        table.add_row(f"[bold]{LATENCY_TITLES[name]}[/bold]", "")
        for stat in ["mean", "median"] + [f"p{p}" for p in PERCENTILES]:
            table.add_row(f"{stat.capitalize()} {name.upper()} (ms)", f"{result[f'{stat}_{name}_ms']:.2f}")
    console.print(table)
    for reason, count in result.get("failure_reasons") or []:
        console.print(f"failed x{count}: {reason}")


async def bench_serve(args: argparse.Namespace) -> dict:
    base_url = args.base_url or f"http://{args.host}:{args.port}"
    model = args.model or await fetch_model_name(base_url)
    requests = await asyncio.to_thread(build_requests, args, base_url, model, args.num_prompts)
    config = load_config(args, base_url, model, args.request_rate, args.duration, args.drain_timeout)
    outcome = await run_load(config, requests)
    result = {**run_config(args, base_url, model, args.request_rate), "num_prompts": len(requests),
              **outcome.summary()}
    if args.save_detailed:
        result.update(per_request_details(outcome.results))
    return result


def run(args: argparse.Namespace) -> int:
    try:
        result = asyncio.run(bench_serve(args))
    except httpx.HTTPError as exc:  # server down or refusing /v1/models, /tokenize: one line, not a trace
        print(f"blink bench serve: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print_summary(result)
    if args.result_json:
        with open(args.result_json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0 if result["completed"] > 0 else 1
