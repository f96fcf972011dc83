"""The ingress and egress rings over a `Segment`: single producer / single consumer each, never lossy.
This module is their face: the ring protocol is ring.py, the two rings ingress.py and egress.py.

Counters are 64-bit and only grow; the slot of counter c is c % capacity. The producer owns `tail`, the
consumer owns `head`; a full ring means the producer waits (backpressure), nothing is ever overwritten.

Ordering: the producer writes the payload, then stores the tail; the consumer loads the tail, then reads
the payload, then stores the head. Every store and load below is its own numpy call (an opaque C call,
so the compiler cannot move one across another), counters are aligned 8-byte words (single-copy atomic)
and x86-64 keeps store->store and load->load order, which gives release/acquire for these plain accesses.
The GPU side of the same protocol must use st.release.sys / ld.acquire.sys (see csrc/layout.h).
All state lives in the segment, so either side may be a different process, a new object, or the GPU.
Each side is single-threaded by contract: one producer and one consumer object per ring, whose calls
never overlap (an asyncio front end should submit with timeout=0 and retry, not block its loop).
"""
from __future__ import annotations

from blink.transport.egress import EgressConsumer, EgressProducer
from blink.transport.ingress import IngressConsumer, IngressItem, IngressProducer
from blink.transport.ring import DESCRIPTOR_DTYPE, TOKEN_DTYPE, wait_for

__all__ = ["DESCRIPTOR_DTYPE", "TOKEN_DTYPE", "EgressConsumer", "EgressProducer", "IngressConsumer", "IngressItem",
           "IngressProducer", "wait_for"]
