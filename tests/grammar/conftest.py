import pytest
from tokenizers import Tokenizer

from blink.grammar.compiler import GrammarCompiler
from blink.grammar.vocab import token_bytes


@pytest.fixture(scope="session")
def demo_vocab():
    """(tokenizer, eos ids) of the demo model: a byte-level BPE of about 1k tokens."""
    from blink.model.config import ModelConfig
    from blink.model.demo import ensure_default_model

    path = ensure_default_model()
    cfg = ModelConfig.from_dir(path)
    return Tokenizer.from_file(str(path / "tokenizer.json")), tuple(cfg.eos_token_ids), cfg.vocab_size


@pytest.fixture(scope="session")
def demo_compiler(demo_vocab):
    tok, eos, vocab = demo_vocab
    return GrammarCompiler(token_bytes(tok, vocab), eos, max_states=4096, max_cells=1 << 22)
