"""`blink` command line: generate | serve | bench."""
from __future__ import annotations

import argparse
import json
import sys

from blink.config import EngineArgs


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="offline generation for a few prompts, batched together")
    EngineArgs.add_cli_args(p)
    p.add_argument("--prompt", action="append", default=[], help="a text prompt (repeatable)")
    p.add_argument("--prompt-ids", action="append", default=[], help="comma-separated token ids (repeatable)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt, in order")
    p.set_defaults(handler=_generate)


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None


def _generate(ns) -> int:
    from blink.entrypoints.llm import LLM
    from blink.request import SamplingParams

    prompts: list = list(ns.prompt) + [_parse_ids(t) for t in ns.prompt_ids]
    if not prompts:
        prompts = ["The quick brown fox"]
    params = SamplingParams(temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k, seed=ns.seed,
                            max_tokens=ns.max_tokens, stop=ns.stop, ignore_eos=ns.ignore_eos)
    args = EngineArgs.from_cli(ns)
    llm = LLM(**vars(args))
    if llm.tokenizer is None and any(isinstance(p, str) for p in prompts):
        raise ValueError("this model has no tokenizer: pass --prompt-ids")
    for out in llm.generate(prompts, params):
        if ns.json:
            print(json.dumps({"prompt": out.prompt, "prompt_token_ids": out.prompt_token_ids,
                              "token_ids": out.token_ids, "text": out.text,
                              "finish_reason": out.finish_reason}))
        else:
            print(out.text)
    return 0


def _add_serve(sub) -> None:
    from blink.entrypoints.serve import add_serve_args, serve_main

    p = sub.add_parser("serve", help="OpenAI-compatible server (front end + engine processes)")
    add_serve_args(p)
    p.set_defaults(handler=serve_main)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    from blink.bench.cli import add_bench_subcommands

    add_bench_subcommands(bench_sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blink", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_serve(sub)
    _add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.handler(ns)
    except (ValueError, OSError) as e:  # bad model dir, bad flags, bad prompt: one line, exit 2
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"blink: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
