"""docs/api.md names every request field the server accepts and every metric /metrics exports: a field or a
metric added without its line in the doc fails here (the brief: every endpoint, field and metric, supported or
refused)."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from pydantic import BaseModel

from blink.frontend import messages_protocol, protocol, responses_protocol
from blink.frontend.metrics import FrontendMetrics
from blink.transport.layout import ITERATION_TOKEN_BOUNDS, STEP_INTERVAL_BOUNDS_NS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
# every name the doc writes as code: `top_p`, `stream_options.include_usage`, `blink:engine_steps_total`, ...
CODE_NAMES = {part for span in re.findall(r"`([^`]+)`", DOC) for part in re.findall(r"[\w:.]+", span)}


def documented(name: str) -> bool:
    return any(code == name or code.endswith("." + name) for code in CODE_NAMES)


def request_models() -> list[type[BaseModel]]:
    return [value for module in (protocol, messages_protocol, responses_protocol) for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__]


def test_every_request_field_is_in_the_doc():
    models = request_models()
    assert {"CompletionRequest", "ChatCompletionRequest", "MessagesRequest", "TokenizeRequest", "ResponsesRequest"} <= {
        m.__name__ for m in models}
    missing = [f"{m.__name__}.{name}" for m in models for name, field in m.model_fields.items()
               if not documented(field.alias or name)]  # the name on the wire (TextFormat's `schema`)
    assert missing == [], f"fields docs/api.md does not name: {missing}"


def test_every_exported_metric_is_in_the_doc():
    metrics = FrontendMetrics(None, "m")
    control = SimpleNamespace(total_kv_blocks=8, free_kv_blocks=8, running=0, waiting=0, preemptions=0, steps=0,
                              tokens=0, prefix_cache_queries=0, prefix_cache_hits=0,
                              iteration_tokens=[0] * (len(ITERATION_TOKEN_BOUNDS) + 1), iteration_tokens_sum=0,
                              step_intervals=[0] * (len(STEP_INTERVAL_BOUNDS_NS) + 1), step_intervals_sum_ns=0)
    metrics.engine.control = control  # as render() sets it at a scrape
    kinds = {family.name: family.type for family in metrics.registry.collect()}
    assert "blink:engine_steps" in kinds and "blink:time_to_first_token_seconds" in kinds  # both sources
    exported = [name + "_total" if kind == "counter" else name for name, kind in kinds.items()]
    missing = [name for name in exported if name not in CODE_NAMES]
    assert missing == [], f"metrics docs/api.md does not name: {missing}"
