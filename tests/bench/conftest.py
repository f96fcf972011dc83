"""Fixtures of the bench tests: a small byte-level BPE tokenizer dir and the fake OpenAI server."""
import os

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from blink.bench.token_codec import synthetic_text
from tests.bench.fake_openai_server import FakeServer


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory) -> str:
    """A 600-token byte-level BPE (the Llama 3 / GPT-2 family of tokenizer), saved as tokenizer.json."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(synthetic_text(seed=3, num_words=3000).split("\n"), trainer)
    path = tmp_path_factory.mktemp("bpe")
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    return str(path)


@pytest.fixture
def fake_server():
    with FakeServer() as server:
        yield server
