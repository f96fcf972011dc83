"""One GrammarCompiler per model, built the same way in the front end (to validate and size) and in
the engine (to load the tables): same vocabulary bytes, EOS ids and arena partition size."""
from __future__ import annotations

from blink.grammar.arena import arena_geometry
from blink.grammar.compiler import GrammarCompiler
from blink.grammar.vocab import token_bytes


def model_eos_ids(model_or_preset: str) -> tuple[int, ...]:
    from pathlib import Path

    from blink.model import presets
    from blink.model.config import eos_token_ids_of_dir

    if Path(model_or_preset).is_dir():
        return eos_token_ids_of_dir(model_or_preset)
    return tuple(presets.get(model_or_preset).eos_token_ids)


def build_compiler(tokenizer, vocab_size: int, eos_ids: tuple[int, ...], arena_bytes: int) -> GrammarCompiler | None:
    """tokenizer: a `tokenizers.Tokenizer`. None when the arena is off (constraints are then refused)."""
    slots, states, cells = arena_geometry(vocab_size, arena_bytes)
    if slots == 0:
        return None
    return GrammarCompiler(token_bytes(tokenizer, vocab_size), eos_ids, max_states=states, max_cells=cells)
