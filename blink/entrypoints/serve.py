"""`blink serve`: the parent process. Creates the segment, starts the engine and the front end, waits for
readiness, and on SIGINT/SIGTERM (to it or its process group) drains, then tears everything down.

Drain (drain.py): drain_flag makes the front end answer /health and new requests with 503; what it
accepted is served, and the engine exits on its own once it is. At --shutdown-timeout (or on a second
signal) stop_flag cuts what is left; then the front end goes, within 20 s more at most.

Children run in process groups of their own, so a signal to our group reaches only us and the shutdown
order stays ours; they also die with us if we are SIGKILLed (processes.py sets PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import signal
import sys
import time

from blink.config import EngineArgs
from blink.entrypoints.children import Child, http_ok
from blink.entrypoints.drain import StopRequest, drain
from blink.frontend.app import DEFAULT_MAX_BODY_BYTES
from blink.frontend.sampling_defaults import sampling_defaults, template_kwargs
from blink.frontend.tools import TOOL_PARSERS
from blink.text.chat_template import ChatTemplate, chat_template_source
from blink.text.reasoning import reasoning_format
from blink.transport.layout import SegmentLayout, grammar_staging
from blink.transport.shm import Segment
from blink.util.cpus import parse_cpu_list

INGRESS_CAPACITY = 1024
MIN_ARENA_TOKENS = 1 << 21  # 8 MiB: many long prompts in flight at once
EGRESS_CAPACITY = 1 << 15
STOP_WAIT_S = 8.0  # after stop_flag / SIGTERM, before escalating
TERM_WAIT_S = 4.0  # after the escalation SIGTERM, before SIGKILL


# vLLM flags that ask for what blink always does: accepted so that vLLM command lines run unchanged
_VLLM_FLAGS_BLINK_ALWAYS_HONOURS = {
    "--enable-auto-tool-choice": "blink parses tool calls under tool_choice=auto whenever a request has tools, "
                                 "with or without it (default: off, same behaviour)",
    "--trust-remote-code": "blink runs no code from a checkpoint (it reads config.json, safetensors and tokenizer "
                           "files), with or without it (default: off)",
    "--enable-chunked-prefill": "prefills are always chunked under --max-num-batched-tokens (default: off, same "
                                "behaviour)",
    "--disable-log-stats": "blink logs no periodic stats; /metrics has them (default: off, same behaviour)",
}


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    EngineArgs.add_cli_args(parser)
    D = " (default: %(default)s)"
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; the default, loopback only, is safer than vLLM's 0.0.0.0: "
                             "pass 0.0.0.0 to serve other machines" + D)
    parser.add_argument("--port", type=int, default=8000, help="HTTP port" + D)
    parser.add_argument("--served-model-name", default=None, help="model name in the API (default: --model)")
    parser.add_argument("--api-key", default=None,
                        help="require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on the API "
                             "(default: no key)")
    parser.add_argument("--frontend-cpus", default=None, help="CPU list for the front end, e.g. 0-1 (default: any)")
    parser.add_argument("--engine-cpus", default=None,
                        help="CPU list for the engine process, e.g. 2-7 (default: any)")
    parser.add_argument("--frontend-nice", type=int, default=None,
                        help="niceness of the front end (every thread), e.g. -10 so that other work on its "
                             "cores cannot delay HTTP, tokenizing and streaming; below 0 needs root "
                             "(default: inherited)")
    parser.add_argument("--engine-nice", type=int, default=None,
                        help="niceness of the engine process (host mode's per-step loop runs there) "
                             "(default: inherited)")
    parser.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get a 413" + D)
    parser.add_argument("--disable-log-requests", action="store_true",
                        help="turn the access log (one line per request) off (default: on)")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="a streamed choice sends its first text at once, then one chunk per this many "
                             "tokens, and its last at the finish; above 1 the front end does less work per "
                             "token (vLLM's and SGLang's flag)" + D)
    parser.add_argument("--reasoning-parser", default=None, metavar="{deepseek_r1,qwen3}",
                        help="split a thinking model's <think> block out of chat answers into `reasoning` "
                             "(and `reasoning_content`); a response format or forced tool call then applies "
                             "after the block (vLLM's and SGLang's flag; default: none)")
    parser.add_argument("--chat-template", default=None,
                        help="a chat template (a file, or the template itself) over the model's own (vLLM's flag; "
                             "default: the model's)")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="let a request bring its own `chat_template` (vLLM's flag; rendered sandboxed on the "
                             "front end's worker pool; default: off, such a request gets a 400)")
    parser.add_argument("--generation-config", default="auto",
                        help="where a request's unset temperature, top_p, top_k, min_p, repetition_penalty and "
                             "max_tokens come from: auto (the model's generation_config.json), vllm (blink's own "
                             "defaults), or a directory with a generation_config.json (vLLM's flag)" + D)
    parser.add_argument("--override-generation-config", default=None,
                        help="a JSON object of sampling defaults over those, e.g. '{\"temperature\": 0.5}' "
                             "(vLLM's flag; default: none)")
    parser.add_argument("--default-chat-template-kwargs", default=None,
                        help="a JSON object of chat template arguments every chat request starts from, its own "
                             "chat_template_kwargs winning key by key, e.g. '{\"enable_thinking\": false}' "
                             "(vLLM's flag; default: none)")
    parser.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                        help="the tool-call format to parse and force: hermes (<tool_call> blocks: Hermes, Qwen), "
                             "llama3_json or qwen3_coder (XML-like parameters) (vLLM's names; default: the one the "
                             "chat template shows)")
    for flag, why in _VLLM_FLAGS_BLINK_ALWAYS_HONOURS.items():
        parser.add_argument(flag, action="store_true", help="accepted for vLLM command lines: " + why)
    parser.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for readiness" + D)
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="on SIGTERM/SIGINT, seconds in-flight requests get to finish (a second signal "
                             "cuts them at once)" + D)
    parser.add_argument("--engine-module", default="blink.entrypoints.engine_process", help=argparse.SUPPRESS)


def _fail(message: str) -> int:
    print(f"blink serve: error: {message}", file=sys.stderr, flush=True)
    return 2


def serve_main(args: argparse.Namespace) -> int:
    try:
        for cpus in (args.frontend_cpus, args.engine_cpus):
            if cpus:
                parse_cpu_list(cpus)
        if args.stream_interval < 1:
            raise ValueError(f"--stream-interval must be at least 1, got {args.stream_interval}")
        if args.reasoning_parser:
            reasoning_format(args.reasoning_parser)
        if args.chat_template:  # a missing file or a jinja syntax error: one line now, not a dead front end
            ChatTemplate(chat_template_source(args.chat_template), {})
        engine_args = _resolve_model(EngineArgs.from_cli(args))
        sampling_defaults(engine_args.model, args.generation_config, args.override_generation_config)
        template_kwargs(args.default_chat_template_kwargs)
    except Exception as e:  # bad flags or no demo model: one line
        return _fail(str(e))
    name = f"blink-{os.getpid()}-{secrets.token_hex(4)}"
    arena = max(MIN_ARENA_TOKENS, 4 * (engine_args.max_model_len or 0))
    segment = Segment.create(name, SegmentLayout(INGRESS_CAPACITY, arena, EGRESS_CAPACITY,  # + device-mode grammars
                                                 *grammar_staging(engine_args.grammar_arena_mb << 20)))
    stop = StopRequest()
    previous = stop.install()
    children: list[Child] = []
    try:
        code = _run(args, engine_args, segment, children, stop)
        if code == 0 and stop.live:
            drain(segment, _role(children, "engine"), _role(children, "front end"), args.shutdown_timeout, stop)
        return code
    finally:
        _shutdown(segment, children)
        segment.close()
        segment.unlink()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _resolve_model(engine_args: EngineArgs) -> EngineArgs:
    """Both children must see the same model: resolve the default demo model once, here."""
    if engine_args.model is not None:
        return engine_args
    from blink.model.demo import ensure_default_model

    return dataclasses.replace(engine_args, model=str(ensure_default_model()))


def _run(args, engine_args: EngineArgs, segment: Segment, children: list[Child],
         stop: StopRequest) -> int:
    python = sys.executable
    engine = Child("engine", [python, "-m", args.engine_module, "--shm", segment.name, *engine_args.to_cli()],
                   args.engine_cpus, nice=args.engine_nice)
    children.append(engine)
    frontend_cmd = [python, "-m", "blink.frontend.api_server", "--shm", segment.name,
                    "--model", engine_args.model,
                    "--served-model-name", args.served_model_name or args.model or "demo",
                    "--host", args.host, "--port", str(args.port), "--engine-pid", str(engine.pid),
                    "--max-request-body-bytes", str(args.max_request_body_bytes)]
    if args.disable_log_requests:
        frontend_cmd.append("--disable-log-requests")
    if args.stream_interval != 1:
        frontend_cmd += ["--stream-interval", str(args.stream_interval)]
    if args.reasoning_parser:
        frontend_cmd += ["--reasoning-parser", args.reasoning_parser]
    if args.chat_template:
        frontend_cmd += ["--chat-template", args.chat_template]
    if args.tool_call_parser:
        frontend_cmd += ["--tool-call-parser", args.tool_call_parser]
    if args.trust_request_chat_template:
        frontend_cmd.append("--trust-request-chat-template")
    frontend_cmd += ["--generation-config", args.generation_config]
    if args.override_generation_config:
        frontend_cmd += ["--override-generation-config", args.override_generation_config]
    if args.default_chat_template_kwargs:
        frontend_cmd += ["--default-chat-template-kwargs", args.default_chat_template_kwargs]
    if not engine_args.gc_freeze:
        frontend_cmd.append("--no-gc-freeze")
    if engine_args.tokenizer:
        frontend_cmd += ["--tokenizer", engine_args.tokenizer]
    frontend_cmd += ["--tensor-parallel-size", str(engine_args.tensor_parallel_size),
                     "--grammar-arena-mb", str(engine_args.grammar_arena_mb)]
    env = {**os.environ, "BLINK_API_KEY": args.api_key} if args.api_key else None  # not on the command line
    frontend = Child("front end", frontend_cmd, args.frontend_cpus, env, nice=args.frontend_nice)
    children.append(frontend)

    probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(args.host, args.host)
    health_url = f"http://{_url_host(probe_host)}:{args.port}/health"
    deadline = time.monotonic() + args.ready_timeout
    while not (segment.control.ready and http_ok(health_url)):
        for child in children:
            if child.exit_code() is not None:
                code = child.exit_code()
                return _fail(f"the {child.role} failed to start (exit code {code}): {child.last_line}")
        if stop.wait(0.2):  # stopped while starting (a benchmark's timeout, say): show how far it got
            for child in children:
                child.go_live()
            return 0
        if time.monotonic() > deadline:
            return _fail(f"not ready after {args.ready_timeout:.0f} s")
    for child in children:
        child.go_live()
    print(f"blink serve: ready on http://{_url_host(args.host)}:{args.port}", flush=True)
    stop.live = True
    while not stop.wait(0.2):
        for child in children:
            if child.exit_code() is not None:
                print(f"blink serve: the {child.role} exited unexpectedly (exit code {child.exit_code()}); "
                      "shutting down", file=sys.stderr, flush=True)
                return 1
    return 0


def _role(children: list[Child], role: str) -> Child | None:
    return next((c for c in children if c.role == role), None)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _shutdown(segment: Segment, children: list[Child]) -> None:
    """stop_flag for the engine and SIGTERM for the front end, then SIGTERM, then SIGKILL."""
    if segment.control is not None:
        segment.control.stop_flag = 1
    for child in children:
        if child.role != "engine":
            child.signal(signal.SIGTERM)
    for wait_s, escalation in ((STOP_WAIT_S, signal.SIGTERM), (TERM_WAIT_S, signal.SIGKILL), (5.0, None)):
        deadline = time.monotonic() + wait_s
        for child in children:
            child.wait(max(0.0, deadline - time.monotonic()))
        alive = [c for c in children if c.exit_code() is None]
        if not alive:
            break
        for child in alive:
            if escalation is not None:
                child.signal(escalation)
    for child in children:
        child.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="blink serve", description="OpenAI-compatible blink server")
    add_serve_args(parser)
    return serve_main(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
