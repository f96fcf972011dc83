"""The prefix token cache (blink/text/prefix_tokens.py): a text that shares a learned prefix gets exactly
the ids a full encode gives, on byte-level BPE (a Llama-3-style regex split, and the demo model's), on
the presets' word-level tokenizer, and never a wrong one from tokenizers whose split is not local."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from blink.frontend.text_workers import TextWorkers
from blink.model.demo import ensure_default_model
from blink.text.prefix_tokens import MIN_CHARS, PrefixTokenCache
from blink.text.tokenizer import ModelTokenizer, synthetic_tokenizer

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["The quick brown fox jumps over 1234567 lazy dogs, isn't it?\n\n  Yes!!  ", "naïve café — 東京 12:30",
          "def f(x):\n    return x ** 2  # square\n", "{\"a\": [1, 2, 3], \"b\": \"c\"}", "   \t\n  spaced   out  "]
SYMBOLS = list("abcdefghij ABC  \n\t0123456789.,;:'!?\"{}[]()-_/éü東京🙂") + ["'s", "'re", "  ", "\n\n"]
ALPHABET = st.sampled_from(SYMBOLS)


def llama3_style() -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<bos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 50, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    return tok


@pytest.fixture(scope="module", params=["llama3-style", "demo", "word-level"])
def tokenizer(request) -> Tokenizer:
    if request.param == "llama3-style":
        return llama3_style()
    if request.param == "demo":
        return Tokenizer.from_file(str(ensure_default_model() / "tokenizer.json"))
    return synthetic_tokenizer(5000)


def words(tok: Tokenizer, seed: int, n: int) -> str:
    """Text a tokenizer spells: the word-level one knows only "w<i>" words."""
    import random

    rng = random.Random(seed)
    if isinstance(tok.model, models.WordLevel):
        return " ".join(f"w{rng.randrange(5000)}" for _ in range(n))
    return "".join(rng.choice(CORPUS)[: rng.randrange(4, 40)] for _ in range(n))


def spliced(cache: PrefixTokenCache, tok: Tokenizer, text: str, special: bool = True) -> list[int] | None:
    hit = cache.lookup(text, special)
    return None if hit is None else hit.prefix_ids + tok.encode(text[hit.cut:], add_special_tokens=False).ids


def test_a_shared_prefix_hits_and_equals_the_full_encode(tokenizer):
    prefix = words(tokenizer, 1, 900)
    first, second = prefix + words(tokenizer, 2, 40), prefix + words(tokenizer, 3, 40)
    cache = PrefixTokenCache(tokenizer)
    assert cache.enabled and len(prefix) > 2 * MIN_CHARS
    cache.learn(first, True, tokenizer.encode(first).ids)
    got = spliced(cache, tokenizer, second)
    assert got is not None, "a 2x-stride shared prefix must hit"
    assert got == tokenizer.encode(second).ids
    assert cache.lookup(second, True).cut > len(prefix) - 2 * 512  # most of the prefix is reused
    assert cache.lookup(second, False) is None  # learned with the special tokens, not without
    assert cache.lookup(words(tokenizer, 4, 900), True) is None  # another text shares nothing


def test_a_growing_conversation_hits_its_last_turn(tokenizer):
    turn = words(tokenizer, 5, 700)
    cache = PrefixTokenCache(tokenizer)
    cache.learn(turn, False, tokenizer.encode(turn, add_special_tokens=False).ids)
    longer = turn + words(tokenizer, 6, 300)
    hit = cache.lookup(longer, False)
    assert hit is not None
    ids = hit.prefix_ids + tokenizer.encode(longer[hit.cut:], add_special_tokens=False).ids
    assert ids == tokenizer.encode(longer, add_special_tokens=False).ids
    cache.learn(longer, False, ids, hit)  # from the hit on: the next turn reuses more
    assert cache.lookup(longer + words(tokenizer, 7, 50), False).cut > hit.cut


LLAMA3 = llama3_style()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.lists(ALPHABET, min_size=900, max_size=1600).map("".join),
       a=st.lists(ALPHABET, max_size=200).map("".join), b=st.lists(ALPHABET, max_size=200).map("".join),
       special=st.booleans())
def test_any_text_spliced_equals_the_full_encode(prefix, a, b, special):
    tok = LLAMA3
    cache = PrefixTokenCache(tok, min_chars=1024)
    cache.learn(prefix + a, special, tok.encode(prefix + a, add_special_tokens=special).ids)
    got = spliced(cache, tok, prefix + b, special)
    assert got is None or got == tok.encode(prefix + b, add_special_tokens=special).ids



def test_tokenizers_whose_split_is_not_local_are_never_wrong():
    text = words(LLAMA3, 8, 900)
    no_split = Tokenizer(models.BPE())  # no pre-tokenizer: merges may cross any point
    assert not PrefixTokenCache(no_split).enabled
    lowercase = llama3_style()
    lowercase.normalizer = normalizers.Lowercase()
    assert not PrefixTokenCache(lowercase).enabled
    appends = llama3_style()  # a post-processor that appends: the first piece cannot rebuild the text
    appends.post_processor = processors.TemplateProcessing(single="$A <bos>", special_tokens=[("<bos>", 0)])
    cache = PrefixTokenCache(appends)
    cache.learn(text, True, appends.encode(text).ids)
    assert cache.lookup(text + "more words", True) is None


def test_eviction_keeps_the_most_recent_texts():
    tok = synthetic_tokenizer(5000)
    cache = PrefixTokenCache(tok, max_texts=2)
    texts = [words(tok, 10 + i, 900) for i in range(3)]
    for text in texts:
        cache.learn(text, True, tok.encode(text).ids)
    assert cache.lookup(texts[0] + " w1", True) is None
    assert all(cache.lookup(text + " w1", True) is not None for text in texts[1:])


def test_text_workers_encode_a_shared_prefix_workload_exactly():
    tok = llama3_style()
    workers = TextWorkers(ModelTokenizer(tok, tok.get_vocab_size(), None))
    prefix = words(tok, 11, 900)
    prompts = [prefix + words(tok, 20 + i, 30) for i in range(6)]

    async def run() -> list[list[int]]:
        out = []
        for prompt in prompts:
            out.append(await workers.encode(prompt))
            await asyncio.sleep(0.05)  # the learning job of the first prompt runs on the pool
        return out

    try:
        assert asyncio.run(run()) == [tok.encode(p).ids for p in prompts]
        assert workers.prefixes.hits >= len(prompts) - 2
    finally:
        workers.close()

