"""A one-writer, many-reader message queue in shared memory: how host-mode tensor parallelism sends each
step from rank 0 to the other ranks, the way vLLM's shared-memory broadcast does (readers poll a ring of
slots; the writer reuses a slot once every reader has acknowledged it). A message longer than a slot
spans consecutive slots.

File layout (/dev/shm/NAME): header [magic, readers, slots, slot_bytes] (u64), then one u64 ack per
reader (the last sequence number it consumed), then `slots` slots of [seq, nbytes, last, 0] (u64) +
slot_bytes of payload. Sequence numbers start at 1; slot of seq = (seq - 1) % slots. Publication order
is payload, then nbytes/last, then seq, which x86's store ordering (TSO) keeps: the queue refuses other
CPUs rather than add fences Python cannot express.
"""
from __future__ import annotations

import mmap
import os
import platform
import time

import numpy as np

MAGIC = 0x424C494E4B535451  # "BLINKSTQ"
MAX_READERS = 8
HEADER_WORDS = 4 + MAX_READERS
SLOT_HEADER = 32
SPIN_S = 0.05  # poll with sched_yield this long before sleeping: between steps a rank spins, as in vLLM
MAX_SLEEP_S = 1e-3
X86 = ("x86_64", "amd64", "i686", "i386")


class StepQueue:
    def __init__(self, name: str, mapping: mmap.mmap, reader: int | None, owner: bool):
        self.name, self._mmap, self.reader, self.owner = name, mapping, reader, owner
        head = np.frombuffer(mapping, dtype=np.uint64, count=HEADER_WORDS)
        if int(head[0]) != MAGIC:
            raise RuntimeError(f"/dev/shm/{name} is not a blink step queue")
        self.readers, self.slots, self.slot_bytes = int(head[1]), int(head[2]), int(head[3])
        self.acks = head[4:4 + self.readers]
        stride = SLOT_HEADER + self.slot_bytes
        base = HEADER_WORDS * 8
        self.slot_words = [np.frombuffer(mapping, dtype=np.uint64, count=4, offset=base + k * stride)
                           for k in range(self.slots)]
        self.slot_data = [memoryview(mapping)[base + k * stride + SLOT_HEADER: base + (k + 1) * stride]
                          for k in range(self.slots)]
        self.next_seq = 1

    @classmethod
    def create(cls, name: str, readers: int, slots: int = 8, slot_bytes: int = 1 << 20) -> StepQueue:
        if platform.machine().lower() not in X86:
            raise RuntimeError(f"the shared-memory step queue relies on x86 store ordering, not {platform.machine()}")
        if not 1 <= readers <= MAX_READERS:
            raise ValueError(f"a step queue has 1 to {MAX_READERS} readers, not {readers}")
        size = HEADER_WORDS * 8 + slots * (SLOT_HEADER + slot_bytes)
        path = f"/dev/shm/{name}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        np.frombuffer(mapping, dtype=np.uint64, count=4)[:] = [MAGIC, readers, slots, slot_bytes]
        return cls(name, mapping, None, owner=True)

    @classmethod
    def attach(cls, name: str, reader: int) -> StepQueue:
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        queue = cls(name, mapping, reader, owner=False)
        if not 0 <= reader < queue.readers:
            raise ValueError(f"reader {reader} of a queue with {queue.readers}")
        return queue

    def put(self, message: bytes, timeout: float | None = 60.0, failure=None) -> None:
        """Writer: publish `message` (in as many slots as it needs); waits while the ring is full. failure:
        called while it waits past the spin phase; an exception it returns (a dead reader) is raised."""
        view, chunks = memoryview(message), max(1, -(-len(message) // self.slot_bytes))
        for k in range(chunks):
            seq = self.next_seq
            _wait(lambda s=seq: int(self.acks.min()) >= s - self.slots, timeout, "every reader to take a step",
                  failure)
            words, data = self.slot_words[(seq - 1) % self.slots], self.slot_data[(seq - 1) % self.slots]
            part = view[k * self.slot_bytes:(k + 1) * self.slot_bytes]
            data[:len(part)] = part
            words[1], words[2] = len(part), int(k == chunks - 1)
            words[0] = seq  # last: the reader trusts the slot once it sees its sequence number
            self.next_seq += 1

    def get(self, timeout: float | None = None) -> bytes:
        """Reader: the next message, in order."""
        parts = []
        while True:
            seq = self.next_seq
            words, data = self.slot_words[(seq - 1) % self.slots], self.slot_data[(seq - 1) % self.slots]
            _wait(lambda s=seq, w=words: int(w[0]) == s, timeout, "the next step")
            parts.append(bytes(data[:int(words[1])]))
            last = bool(words[2])
            self.acks[self.reader] = seq
            self.next_seq += 1
            if last:
                return b"".join(parts)

    def unlink(self) -> None:
        """Remove the file; mappings stay valid. The owner does it once every reader has attached, so that
        nothing is left in /dev/shm even if the owner is killed."""
        if self.owner:
            try:
                os.unlink(f"/dev/shm/{self.name}")
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.slot_words = self.slot_data = self.acks = None  # drop the buffer views before unmapping
        self._mmap.close()
        self.unlink()


def _wait(ready, timeout: float | None, what: str, failure=None) -> None:
    if ready():
        return
    start = time.monotonic()
    sleep = 20e-6
    while not ready():
        now = time.monotonic()
        if timeout is not None and now - start > timeout:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        if now - start < SPIN_S:
            os.sched_yield()
        else:
            error = failure() if failure is not None else None
            if error is not None:
                raise error
            time.sleep(sleep)
            sleep = min(2 * sleep, MAX_SLEEP_S)
