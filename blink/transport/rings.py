"""The ingress and egress rings over a `Segment`, one import for their users: the protocol both share is
ring.py (single producer / single consumer, never lossy), the two rings are ingress.py and egress.py."""
from __future__ import annotations

from blink.transport.egress import EgressConsumer, EgressProducer
from blink.transport.ingress import IngressConsumer, IngressItem, IngressProducer
from blink.transport.ring import DESCRIPTOR_DTYPE, TOKEN_DTYPE, wait_for

__all__ = ["DESCRIPTOR_DTYPE", "TOKEN_DTYPE", "EgressConsumer", "EgressProducer", "IngressConsumer", "IngressItem",
           "IngressProducer", "wait_for"]
