"""The host-mode step message rank 0 broadcasts to the other tensor-parallel ranks (over gloo).

Three broadcasts per step, the conventional way: a fixed int64 header [op, T, S, admission bytes], the
step's inputs packed into one int64 tensor (StepBuffers fields, padded to the bucket (T, S)), and, only
when requests were admitted, their sampling parameters pickled into a uint8 tensor (every rank samples,
so every rank's SamplingState needs them).
"""
from __future__ import annotations

import datetime
import pickle
from dataclasses import dataclass

import torch

from blink.parallel.group import TPGroup

OP_STOP, OP_STEP = 0, 1
HEADER_SIZE = 4
# An idle server sends nothing for as long as it likes: a worker waits for the next header this long.
IDLE_WAIT = datetime.timedelta(days=365)


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


def send_step(group: TPGroup, bucket: tuple[int, int], inputs: dict[str, torch.Tensor],
              admissions: list[Admission]) -> None:
    admitted = pickle.dumps(admissions) if admissions else b""
    group.broadcast_cpu(torch.tensor([OP_STEP, *bucket, len(admitted)], dtype=torch.int64))
    group.broadcast_cpu(torch.cat([inputs[name].reshape(-1).to(torch.int64)
                                   for name in field_lengths(*bucket, 1)]))
    if admitted:
        group.broadcast_cpu(torch.frombuffer(bytearray(admitted), dtype=torch.uint8))


def send_stop(group: TPGroup) -> None:
    group.broadcast_cpu(torch.tensor([OP_STOP, 0, 0, 0], dtype=torch.int64))


def receive_step(group: TPGroup, max_blocks_per_seq: int):
    """On ranks > 0: None for a stop, else (bucket, inputs keyed by StepBuffers field, admissions)."""
    header = group.broadcast_cpu(torch.zeros(HEADER_SIZE, dtype=torch.int64), timeout=IDLE_WAIT).tolist()
    op, t, s, admitted_bytes = header
    if op == OP_STOP:
        return None
    lengths = field_lengths(t, s, max_blocks_per_seq)
    packed = group.broadcast_cpu(torch.empty(sum(lengths.values()), dtype=torch.int64))
    inputs = dict(zip(lengths, packed.split(list(lengths.values())), strict=True))
    inputs["block_tables"] = inputs["block_tables"].view(s, max_blocks_per_seq)
    admissions = []
    if admitted_bytes:
        raw = group.broadcast_cpu(torch.empty(admitted_bytes, dtype=torch.uint8))
        admissions = pickle.loads(raw.numpy().tobytes())
    return (t, s), inputs, admissions
