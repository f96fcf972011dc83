"""The front-end process: `python -m blink.frontend.api_server --shm NAME --model M ...` runs uvicorn.

`blink serve` starts it; it attaches the segment the parent created and serves HTTP until SIGINT/SIGTERM
(uvicorn's own handlers: it stops accepting, gives open streams a moment, then exits).
"""
from __future__ import annotations

import argparse
import atexit
import logging
import logging.handlers
import os
import queue
import sys

import uvicorn

from blink.frontend.app import DEFAULT_MAX_BODY_BYTES, AppConfig, build_app
from blink.frontend.tools import TOOL_PARSERS

GRACEFUL_SHUTDOWN_S = 3  # open streams are cut after this; the parent's budget is 20 s in all


def add_frontend_args(parser: argparse.ArgumentParser) -> None:
    D = " (default: %(default)s)"
    parser.add_argument("--shm", required=True, help="shared-memory segment created by blink serve")
    parser.add_argument("--model", required=True, help="model dir or preset (for the tokenizer)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model dir)")
    parser.add_argument("--served-model-name", default=None, help="model name in the API (default: --model)")
    parser.add_argument("--api-key", default=os.environ.get("BLINK_API_KEY"),
                        help="(default: $BLINK_API_KEY, which keeps the key off the command line)")
    parser.add_argument("--engine-pid", type=int, default=None, help="the engine's pid, for /metrics")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only)" + D)
    parser.add_argument("--port", type=int, default=8000, help="HTTP port" + D)
    parser.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="larger request bodies get a 413" + D)
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="the engine's tensor-parallel ranks, for /get_server_info" + D)
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0,
                        help="seconds without an engine heartbeat before /health fails" + D)
    parser.add_argument("--grammar-arena-mb", type=int, default=64,
                        help="the engine's --grammar-arena-mb (structured outputs: 400/503 decided here)" + D)
    parser.add_argument("--disable-log-requests", action="store_true",
                        help="turn the access log off (default: on)")
    parser.add_argument("--stream-interval", type=int, default=1,
                        help="blink serve's --stream-interval" + D)
    parser.add_argument("--reasoning-parser", default=None, help="blink serve's --reasoning-parser" + D)
    parser.add_argument("--chat-template", default=None, help="blink serve's --chat-template" + D)
    parser.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                        help="blink serve's --tool-call-parser" + D)
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="blink serve's --trust-request-chat-template (default: off)")
    parser.add_argument("--generation-config", default="auto", help="blink serve's --generation-config" + D)
    parser.add_argument("--override-generation-config", default=None,
                        help="blink serve's --override-generation-config" + D)
    parser.add_argument("--default-chat-template-kwargs", default=None,
                        help="blink serve's --default-chat-template-kwargs" + D)
    parser.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                        help="freeze the startup heap out of the garbage collector once serving (default: on)")


def setup_logging(log_requests: bool) -> None:
    """Our loggers to stderr, one line each; `blink serve` relays the front end's stderr. A thread writes
    them: the event loop only queues a record (py-spy: the access log's write to the pipe was about a
    fifth of the loop's busy time at concurrency 1, docs/perf.md 2026-12-01 session 6). The thread is
    flushed and stopped at exit."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    records: queue.SimpleQueue = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    atexit.register(listener.stop)
    root = logging.getLogger("blink")
    root.addHandler(logging.handlers.QueueHandler(records))
    root.setLevel(logging.INFO)
    root.propagate = False
    logging.getLogger("blink.access").setLevel(logging.INFO if log_requests else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="blink front end (normally started by `blink serve`)")
    add_frontend_args(parser)
    args = parser.parse_args(argv)
    if args.stream_interval < 1:
        parser.error(f"--stream-interval must be at least 1, got {args.stream_interval}")
    config = AppConfig(
        shm_name=args.shm, model=args.model, served_model_name=args.served_model_name or args.model,
        tokenizer=args.tokenizer, api_key=args.api_key,
        engine_pid=args.engine_pid, max_body_bytes=args.max_request_body_bytes,
        heartbeat_timeout_s=args.heartbeat_timeout, log_requests=not args.disable_log_requests,
        tensor_parallel_size=args.tensor_parallel_size, grammar_arena_mb=args.grammar_arena_mb,
        gc_freeze=args.gc_freeze, stream_interval=args.stream_interval, reasoning_parser=args.reasoning_parser,
        chat_template=args.chat_template, tool_call_parser=args.tool_call_parser,
        trust_request_chat_template=args.trust_request_chat_template, generation_config=args.generation_config,
        override_generation_config=args.override_generation_config,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
    )
    setup_logging(config.log_requests)
    try:
        app = build_app(config)
    except Exception as e:  # a bad model dir or preset: one line, not a traceback
        print(f"blink frontend: error: {e}", file=sys.stderr)
        return 2
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # loop and http "auto" (the defaults): uvloop and httptools (dependencies) where installed, else asyncio, h11
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
