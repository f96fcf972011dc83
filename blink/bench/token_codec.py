"""Token ids <-> text for building benchmark prompts: a local tokenizer, or the server's own.

Both codecs encode *without* special tokens (the server adds its BOS itself when it tokenizes the prompt)
and expose `candidate_ids()`: the ids random prompts are drawn from (never special or added tokens).
"""
from __future__ import annotations

import os
import string

import httpx
import numpy as np


class LocalTokenCodec:
    """A tokenizer from a local model dir: tokenizer.json through HF `tokenizers`, else AutoTokenizer."""

    def __init__(self, path: str):
        tokenizer_json = os.path.join(path, "tokenizer.json")
        if os.path.isfile(tokenizer_json):
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(tokenizer_json)
            self._hf = None
            added = set(self._fast.get_added_tokens_decoder())
            size = self._fast.get_vocab_size(with_added_tokens=True)
        else:
            from transformers import AutoTokenizer

            self._fast = None
            self._hf = AutoTokenizer.from_pretrained(path)
            added = set(self._hf.all_special_ids) | set(self._hf.added_tokens_decoder)
            size = len(self._hf)
        plain = [i for i in range(size) if i not in added]
        self._candidates = np.array(self._round_trip_ids(plain), dtype=np.int64)

    def _round_trip_ids(self, ids: list[int]) -> list[int]:
        """The ids whose text re-encodes to themselves alone. This drops byte-level pieces of multi-byte
        characters (alone they decode to U+FFFD, three tokens again), which would make the random
        prompts' lengths drift on each round trip."""
        texts = [self.decode([i]) for i in ids]
        if self._fast is not None:
            encoded = [e.ids for e in self._fast.encode_batch(texts, add_special_tokens=False)]
        else:
            encoded = self._hf(texts, add_special_tokens=False)["input_ids"]
        return [i for i, e in zip(ids, encoded, strict=True) if e == [i]]

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self._hf.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        ids = [int(i) for i in ids]
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=False)
        return self._hf.decode(ids, skip_special_tokens=False)

    def candidate_ids(self) -> np.ndarray:
        return self._candidates


def synthetic_text(seed: int, num_words: int) -> str:
    """Seeded pseudo-words, digits and punctuation: text that exercises much of a BPE vocabulary."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list(string.ascii_letters + string.digits))
    punctuation = [" ", " ", " ", ", ", ". ", "; ", "\n", " (", ") ", "-", "'s "]
    words = []
    for length in rng.integers(1, 11, num_words):
        words.append("".join(rng.choice(alphabet, length)))
        words.append(punctuation[rng.integers(len(punctuation))])
    return "".join(words)


MIN_CANDIDATES = 64
ID_RANGE_SIZES = (4096, 512, 64)


class ServerTokenCodec:
    """The server's POST /tokenize and /detokenize, for when no local tokenizer is at hand.

    The server's vocabulary size is not part of that API, so random ids are drawn from the ids the
    server returns for a seeded synthetic text and for the text of its first few thousand ids.
    """

    def __init__(self, base_url: str, model: str, seed: int = 0, timeout_s: float = 60.0):
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)
        self._model = model
        self._prefix = self._special_prefix()
        pool = self.encode(synthetic_text(seed, num_words=8000)) + self._id_range_pool()
        self._candidates = np.unique(np.asarray(pool, dtype=np.int64))
        if self._candidates.size < MIN_CANDIDATES:  # e.g. every prompt one repeated token: a prefix cache
            raise RuntimeError(  # would then serve the "random" prompts from each other's blocks
                f"the server's tokenizer gave only {self._candidates.size} distinct tokens for random prompts")

    def _id_range_pool(self) -> list[int]:
        """The low ids' text, tokenized again. A preset's word-level tokenizer ("w{i}") maps all of the
        synthetic text to its unknown token, so the text alone would make every prompt the same."""
        for count in ID_RANGE_SIZES:
            try:
                return self.encode(self.decode(list(range(count))))
            except httpx.HTTPStatusError:  # a vocabulary smaller than count
                continue
        return []

    def _special_prefix(self) -> list[int]:
        """What the server still puts before any text (a BOS from a server that ignores
        add_special_tokens): stripped from every encode."""
        try:
            return self._tokenize("")
        except httpx.HTTPStatusError:
            return []

    def _tokenize(self, text: str) -> list[int]:
        body = {"model": self._model, "prompt": text, "add_special_tokens": False}
        response = self._http.post("/tokenize", json=body)
        response.raise_for_status()
        return list(response.json()["tokens"])

    def encode(self, text: str) -> list[int]:
        ids = self._tokenize(text)
        if self._prefix and ids[: len(self._prefix)] == self._prefix:
            ids = ids[len(self._prefix):]
        return ids

    def decode(self, ids: list[int]) -> str:
        body = {"model": self._model, "tokens": [int(i) for i in ids]}
        response = self._http.post("/detokenize", json=body)
        response.raise_for_status()
        return response.json()["prompt"]

    def candidate_ids(self) -> np.ndarray:
        return self._candidates

    def close(self) -> None:
        self._http.close()


def make_codec(tokenizer: str | None, model: str | None, base_url: str, seed: int = 0,
               served_model: str | None = None):
    """--tokenizer, else --model when it is a local dir, else the server's own endpoints (which are
    asked for `served_model`, default `model`)."""
    path = tokenizer or (model if model and os.path.isdir(model) else None)
    if path is not None:
        return LocalTokenCodec(path)
    return ServerTokenCodec(base_url, served_model or model or "", seed=seed)
