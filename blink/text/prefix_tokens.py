"""Token ids of long prompt texts seen recently, so that a prompt resending one (a shared system prompt, a
chat resending its conversation, an agent's growing context) tokenizes only the part after it.

Why it is exact: with a pre-tokenizer (regex, byte-level, whitespace), BPE and word-level models encode
each pre-token on its own, and whether a pre-token ends at a position depends only on the characters
around it. Learning a text walks it in steps of `STRIDE` characters; at each step a pre-token boundary
`c` is picked from the characters around the step alone, the piece since the last boundary is encoded,
and the pieces must rebuild the text's own encoding exactly, else learning stops. Each boundary is kept
as (digest of the text up to `c + KEY_PAST` characters -> the ids spelling text[:c]). A later text with
the same first `c + KEY_PAST` characters picks the same boundary, and encodes as those ids +
encode(text[c:]). A tokenizer whose split is not local (no pre-tokenizer, a normalizer other than NFC, a
post-processor that appends) is never cached, or fails the rebuild and keeps encoding in full.

The digest is BLAKE2b-128 over the text's UTF-8 (and the special-token flag): a false hit needs a
128-bit collision among at most `MAX_TEXTS * max_len / STRIDE` keys, far below any real chance.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

MIN_CHARS = 2048  # shorter texts encode in a fraction of a millisecond: nothing worth caching
STRIDE = 512  # characters between boundaries: a hit re-encodes at most this much of the shared part
AROUND = 48  # a boundary is chosen from the characters this far either side of its step
KEY_PAST = 64  # a hit must share this many characters past the boundary (more than any added token)
MAX_TEXTS = 64  # learned texts kept, least recently used dropped first
LOCAL_NORMALIZERS = (None, "NFC")


@dataclass(frozen=True)
class Hit:
    cut: int  # characters of the text that `prefix_ids` spell
    prefix_ids: list[int]


class PrefixTokenCache:
    def __init__(self, tokenizer: Tokenizer, max_texts: int = MAX_TEXTS, min_chars: int = MIN_CHARS):
        self.tokenizer = tokenizer
        self.max_texts = max_texts
        self.min_chars = min_chars
        self.enabled = _splits_locally(tokenizer)
        self._keys: dict[bytes, tuple[int, int, np.ndarray, int]] = {}  # digest -> (cut, tokens, ids, text no.)
        self._texts: OrderedDict[int, list[bytes]] = OrderedDict()  # text no. -> its digests, LRU
        self._learned = 0  # texts learned so far: numbers them
        self._lock = threading.Lock()  # learn() runs on the tokenizer workers, lookup() on the event loop
        self.hits = self.misses = 0

    def lookup(self, text: str, add_special_tokens: bool) -> Hit | None:
        """The longest learned prefix of `text`. Sharing a longer prefix implies sharing every shorter one,
        so the steps are galloped (1, 2, 4, ... then bisected): a text that shares nothing costs one probe."""
        if not self.enabled or len(text) < self.min_chars:
            return None
        steps = range(STRIDE, len(text) - KEY_PAST, STRIDE)
        best, lo, hi = None, -1, len(steps)
        i = 0
        while i < len(steps):  # gallop: the first miss bounds the search
            found = self._probe(text, steps[i], add_special_tokens)
            if found is None:
                hi = i
                break
            best, lo, i = found, i, 2 * i + 1
        while best is not None and hi - lo > 1:  # bisect between the last hit and the first miss
            mid = (lo + hi) // 2
            found = self._probe(text, steps[mid], add_special_tokens)
            best, lo, hi = (found, mid, hi) if found is not None else (best, lo, mid)
        with self._lock:
            if best is None:
                self.misses += 1
            else:
                self.hits += 1
        if best is None:
            return None
        cut, tokens, ids, _ = best
        return Hit(cut, ids[:tokens].tolist())

    def _probe(self, text: str, step: int, add_special_tokens: bool) -> tuple | None:
        """The entry of the boundary at `step`, if `text` shares it: (cut, tokens, ids, text number)."""
        cut = self._boundary(text, step)
        if cut is None or cut + KEY_PAST > len(text):
            return None
        with self._lock:
            found = self._keys.get(_digest(text[:cut + KEY_PAST], add_special_tokens))
            if found is not None:
                self._texts.move_to_end(found[3])  # every key's text is listed (eviction drops its keys)
        return found

    def learn(self, text: str, add_special_tokens: bool, ids: list[int], start: Hit | None = None) -> None:
        """Remember `text`'s boundaries after `start` (a hit `ids` began with), as far as its pieces
        rebuild `ids`. Runs on a tokenizer worker: the pieces encode in one batch, without the GIL."""
        if not self.enabled or len(text) < self.min_chars:
            return
        pos, k = (start.cut, len(start.prefix_ids)) if start else (0, 0)
        cuts = []
        for step in range((pos // STRIDE + 1) * STRIDE, len(text) - KEY_PAST, STRIDE):
            cut = self._boundary(text, step)
            if cut is not None and cut > (cuts[-1] if cuts else pos) and cut + KEY_PAST <= len(text):
                cuts.append(cut)
        if not cuts:
            return
        pieces = [text[a:b] for a, b in zip([pos, *cuts[:-1]], cuts, strict=True)]
        special = add_special_tokens and start is None  # the special tokens come with the first piece only
        first = self.tokenizer.encode_batch(pieces[:1], add_special_tokens=special)
        encoded = [e.ids for e in first + self.tokenizer.encode_batch(pieces[1:], add_special_tokens=False)]
        array, digests = np.asarray(ids, dtype=np.int64), []
        for cut, piece in zip(cuts, encoded, strict=True):
            if ids[k:k + len(piece)] != piece:
                break  # not local here (or a special token spans the cut): keep what was rebuilt so far
            k += len(piece)
            digests.append((_digest(text[:cut + KEY_PAST], add_special_tokens), cut, k))
        if not digests:
            return
        with self._lock:
            self._learned += 1
            number = self._learned
            self._texts[number] = [d for d, _, _ in digests]
            for digest, cut, tokens in digests:
                self._keys[digest] = (cut, tokens, array, number)  # a key learned again moves to this text
            while len(self._texts) > self.max_texts:
                gone, keys = self._texts.popitem(last=False)
                for digest in keys:
                    entry = self._keys.get(digest)
                    if entry is not None and entry[3] == gone:  # not learned again by a later text
                        del self._keys[digest]

    def _boundary(self, text: str, step: int) -> int | None:
        """The first pre-token start at or after `step`, read from text[step - AROUND : step + AROUND]
        alone (so every text with those characters picks the same one); the window's first piece may be
        cut by the window and is skipped."""
        lo = max(0, step - AROUND)
        pieces = self.tokenizer.pre_tokenizer.pre_tokenize_str(text[lo:step + AROUND])
        for _, (begin, _) in pieces[1:]:
            if lo + begin >= step:
                return lo + begin
        return None


def _digest(prefix: str, add_special_tokens: bool) -> bytes:
    h = hashlib.blake2b(prefix.encode("utf-8", "surrogatepass"), digest_size=16)
    h.update(b"\x01" if add_special_tokens else b"\x00")
    return h.digest()


def _splits_locally(tokenizer: Tokenizer) -> bool:
    """A pre-tokenizer cuts the text, the normalizer (if any) maps characters one by one, and no added
    token is long enough to span a key's margin."""
    if tokenizer.pre_tokenizer is None:
        return False
    normalizer = tokenizer.normalizer
    if (normalizer.__class__.__name__ if normalizer is not None else None) not in LOCAL_NORMALIZERS:
        return False
    added = tokenizer.get_added_tokens_decoder().values()
    return all(len(token.content) < KEY_PAST for token in added)
