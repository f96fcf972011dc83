"""blink: an LLM inference server whose steady-state loop runs on the GPU."""
from blink.request import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name):
    # LLM pulls in torch and the model; import it lazily so `import blink` stays light.
    if name == "LLM":
        from blink.entrypoints.llm import LLM

        return LLM
    raise AttributeError(name)
