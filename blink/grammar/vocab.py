"""The bytes each token id stands for: what a grammar over text needs to know about a tokenizer.

Byte-level BPE (Llama 3, Qwen, GPT-2) spells bytes with printable stand-ins (GPT-2's bytes_to_unicode);
SentencePiece-style vocabularies (Mistral, Llama 2) use "▁" for a space and "<0xHH>" for byte fallback.
Special tokens (BOS, EOS, chat markers) map to None: a grammar never produces them; EOS is handled by
the automaton's accepting states instead.
"""
from __future__ import annotations

import json
from functools import cache

from tokenizers import Tokenizer


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes, strict=True)}


def _decoder_types(spec: dict | None) -> set[str]:
    if not spec:
        return set()
    if spec.get("type") == "Sequence":
        return {t for d in spec.get("decoders", []) for t in _decoder_types(d)}
    return {spec.get("type", "")}


def token_bytes(tokenizer: Tokenizer, vocab_size: int) -> list[bytes | None]:
    """Per token id in [0, vocab_size): its bytes, or None for special and unused ids."""
    spec = json.loads(tokenizer.to_str())
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    kinds = _decoder_types(spec.get("decoder"))
    byte_level = "ByteLevel" in kinds
    metaspace = "Metaspace" in kinds or "Replace" in kinds or "ByteFallback" in kinds
    decoder = _byte_decoder()
    out: list[bytes | None] = [None] * vocab_size
    for piece, tid in tokenizer.get_vocab(with_added_tokens=True).items():
        if not 0 <= tid < vocab_size or tid in special:
            continue
        if byte_level:
            try:
                out[tid] = bytes(decoder[ch] for ch in piece)
            except KeyError:  # an added, non-special token written as plain text
                out[tid] = piece.encode()
        elif metaspace and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out[tid] = bytes([int(piece[3:5], 16)])
        elif metaspace:
            out[tid] = piece.replace("▁", " ").encode()
        else:  # word-level vocabularies (the presets' synthetic one): the piece is its text
            out[tid] = piece.encode()
    return out
