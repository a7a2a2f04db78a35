"""Small helpers for stream tests (no fakes: they drive a real Bus)."""

from __future__ import annotations

import time

from streams.bus import Bus, Consumer, Message


def poll_n(consumer: Consumer, n: int, timeout_s: float = 30.0) -> list[Message]:
    """Poll until ``n`` records arrived (or time out); commits nothing."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got.extend(consumer.poll(0.5))
    return got


def drain(bus: Bus, topic: str, group: str, n: int, timeout_s: float = 30.0) -> list[Message]:
    """Read until ``n`` records arrived on ``topic`` (or time out), then commit and leave."""
    consumer = bus.consumer([topic], group)
    try:
        got = poll_n(consumer, n, timeout_s)
        consumer.commit(got)
    finally:
        consumer.close()
    return got
