"""Entry points: the engine process, the engine factory, the offline LLM API and the `blink serve` supervisor."""
