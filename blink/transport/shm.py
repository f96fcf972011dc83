"""One POSIX shared-memory segment laid out by `SegmentLayout`: the front end creates it, the engine attaches.

The segment is a plain file under /dev/shm mapped with mmap (ordinary write-back memory, never
write-combined). We avoid multiprocessing.shared_memory on purpose: its resource_tracker unlinks (or
warns about) segments that a process merely attached to, so only the creator here ever unlinks.

The device engine calls cudaHostRegister on `address` (device pointer == host pointer), so the mapping
must stay where it is for the segment's whole life: nothing here ever remaps it.
"""
from __future__ import annotations

import ctypes as C
import mmap
import os

import numpy as np

from blink.transport.layout import GRAMMAR_SLOTS, MAGIC, VERSION, ControlBlock, RingHeader, SegmentLayout

SHM_DIR = "/dev/shm"
TAIL_INDEX = RingHeader.tail.offset // 8  # positions of the counters among a RingHeader's uint64 words
HEAD_INDEX = RingHeader.head.offset // 8
COUNTER_FIELDS = ("engine_mode", "ready", "running", "waiting", "free_kv_blocks", "total_kv_blocks",
                  "error_code", "heartbeat", "steps", "tokens", "preemptions", "exited", "stop_flag")


def _shm_path(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"invalid shared-memory name {name!r}: use a plain file name such as 'blink-1234'")
    return os.path.join(SHM_DIR, name)


class Segment:
    """A mapped segment: `control` (ctypes view), `layout`, `address`, `size`; `ring_header(offset)`."""

    def __init__(self, name: str, layout: SegmentLayout, mapping: mmap.mmap, owner: bool):
        self.name = name
        self.layout = layout
        self.owner = owner
        self._mmap = mapping
        self.size = len(mapping)
        # The address is read once through a throw-away ctypes export, so no live export pins it here.
        self.address = C.addressof(C.c_char.from_buffer(mapping))
        self.control = ControlBlock.from_buffer(mapping, layout.control)

    @classmethod
    def create(cls, name: str, layout: SegmentLayout) -> Segment:
        """Create (exclusively) and initialise the segment; the caller is its owner and unlinks it."""
        for capacity in (layout.ingress_capacity, layout.arena_capacity, layout.egress_capacity):
            if capacity < 1:
                raise ValueError("ring and arena capacities must be at least 1")
        if layout.grammar_slots not in (0, GRAMMAR_SLOTS) or (layout.grammar_slots and layout.grammar_slot_words < 1):
            raise ValueError(f"grammar staging has 0 or {GRAMMAR_SLOTS} slots of at least one word")
        path = _shm_path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, layout.size)  # zero-filled: every head and tail starts at 0
            mapping = mmap.mmap(fd, layout.size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        seg = cls(name, layout, mapping, owner=True)
        ctl = seg.control
        ctl.version = VERSION
        ctl.ingress_capacity = layout.ingress_capacity
        ctl.arena_capacity = layout.arena_capacity
        ctl.egress_capacity = layout.egress_capacity
        ctl.grammar_slots = layout.grammar_slots
        ctl.grammar_slot_words = layout.grammar_slot_words
        ctl.magic = MAGIC  # last, so an attacher that sees the magic sees the capacities too
        return seg

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment, checking magic, version and size. Raises FileNotFoundError/ValueError."""
        fd = os.open(_shm_path(name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < C.sizeof(ControlBlock):
                raise ValueError(f"shared-memory segment {name!r} is too small ({size} bytes) for blink")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        ctl = ControlBlock.from_buffer_copy(mapping, 0)
        problem = None
        if ctl.magic != MAGIC:
            problem = f"bad magic {ctl.magic:#x} (expected {MAGIC:#x})"
        elif ctl.version != VERSION:
            problem = f"layout version {ctl.version}, this build speaks {VERSION}"
        else:
            layout = SegmentLayout(ctl.ingress_capacity, ctl.arena_capacity, ctl.egress_capacity, ctl.grammar_slots,
                                   ctl.grammar_slot_words)
            if (min(ctl.ingress_capacity, ctl.arena_capacity, ctl.egress_capacity) < 1 or layout.size > size
                    or ctl.grammar_slots not in (0, GRAMMAR_SLOTS)):
                problem = f"capacities {layout} need {layout.size} bytes, the segment has {size}"
        if problem:
            mapping.close()
            raise ValueError(f"shared-memory segment {name!r} is not a usable blink segment: {problem}")
        return cls(name, layout, mapping, owner=False)

    def array(self, dtype, count: int, offset: int) -> np.ndarray:
        """A numpy view of `count` items of `dtype` at byte `offset` (writes go straight to shared memory)."""
        return np.frombuffer(self._mmap, dtype, count, offset)

    def ring_header(self, offset: int) -> np.ndarray:
        """The uint64 words of the RingHeader at `offset`: [TAIL_INDEX] is the tail, [HEAD_INDEX] the head."""
        return self.array(np.uint64, C.sizeof(RingHeader) // 8, offset)

    def counters(self) -> dict[str, int]:
        """Engine counters and ring fill levels as plain ints (for /metrics and /health)."""
        ctl = self.control
        out = {field: int(getattr(ctl, field)) for field in COUNTER_FIELDS}
        for ring, offset in (("ingress", self.layout.ingress_header), ("arena", self.layout.arena_header),
                             ("egress", self.layout.egress_header)):
            words = self.ring_header(offset)
            out[f"{ring}_used"] = int(words[TAIL_INDEX]) - int(words[HEAD_INDEX])
        return out

    def close(self) -> None:
        """Drop this process's mapping. Views still held elsewhere (rings) keep it mapped until they go."""
        if self._mmap is None:
            return
        self.control = None
        mapping, self._mmap = self._mmap, None
        try:
            mapping.close()
        except BufferError:
            pass  # live numpy views: the mapping is released with the last of them, never under them

    def unlink(self) -> None:
        """Remove the name from /dev/shm (owner only; attached mappings stay valid until closed)."""
        try:
            os.unlink(_shm_path(self.name))
        except FileNotFoundError:
            pass

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if self.owner:
            self.unlink()

