"""The host-mode step message rank 0 sends to the other tensor-parallel ranks through the shared-memory
step queue (step_queue.py), and back.

One message per step: a fixed int64 header [op, T, S, admission bytes], the step's inputs packed into
one int64 array (StepBuffers fields, padded to the bucket (T, S)), and, only when requests were admitted,
their sampling parameters pickled (every rank samples, so every rank's SamplingState needs them).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
import torch

OP_STOP, OP_STEP = 0, 1
HEADER_SIZE = 4


def field_lengths(t: int, s: int, max_blocks_per_seq: int) -> dict[str, int]:
    """Elements of each StepBuffers input field in a step of bucket (t, s), in packing order."""
    return {"input_ids": t, "positions": t, "slot_mapping": t, "query_start_loc": s + 1, "seq_lens": s,
            "logits_indices": s, "sample_slots": s, "sample_positions": s, "block_tables": s * max_blocks_per_seq}


@dataclass
class Admission:
    """SamplingState.set_slot's arguments for one admitted (or re-admitted) request."""

    slot: int
    params: object  # SamplingParams
    seed: int
    prompt_ids: list[int]
    output_ids: list[int]


def encode_step(bucket: tuple[int, int], inputs: dict[str, torch.Tensor], admissions: list[Admission]) -> bytes:
    admitted = pickle.dumps(admissions) if admissions else b""
    header = np.array([OP_STEP, *bucket, len(admitted)], dtype=np.int64)
    packed = torch.cat([inputs[name].reshape(-1).to(torch.int64) for name in field_lengths(*bucket, 1)])
    return header.tobytes() + packed.numpy().tobytes() + admitted


def encode_stop() -> bytes:
    return np.array([OP_STOP, 0, 0, 0], dtype=np.int64).tobytes()


def decode_step(message: bytes, max_blocks_per_seq: int):
    """None for a stop, else (bucket, inputs keyed by StepBuffers field, admissions)."""
    op, t, s, admitted_bytes = np.frombuffer(message, dtype=np.int64, count=HEADER_SIZE).tolist()
    if op == OP_STOP:
        return None
    lengths = field_lengths(t, s, max_blocks_per_seq)
    total = sum(lengths.values())
    packed = torch.from_numpy(np.frombuffer(message, dtype=np.int64, count=total, offset=HEADER_SIZE * 8).copy())
    inputs = dict(zip(lengths, packed.split(list(lengths.values())), strict=True))
    inputs["block_tables"] = inputs["block_tables"].view(s, max_blocks_per_seq)
    start = (HEADER_SIZE + total) * 8
    admissions = pickle.loads(message[start:start + admitted_bytes]) if admitted_bytes else []
    return (t, s), inputs, admissions
