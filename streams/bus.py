"""The ``Bus``: publish with key and headers, consume as a group member, commit.

Two backends implement it: :class:`InMemoryBus` here (unit tests and
single-process runs) and :class:`streams.kafka.KafkaBus` (kafka-python against
any Kafka-protocol broker). The same behavioural test suite runs on both.

Delivery contract (DESIGN §2.4): ``publish`` may buffer; ``flush`` returns only
when every published record is acknowledged (and raises
:class:`DeliveryError` otherwise). A consumer's position advances as it polls,
but only ``commit`` makes progress durable: a member that dies before
committing has its records redelivered to the group.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class DeliveryError(RuntimeError):
    """The broker did not acknowledge one or more published records (it may be down):
    transient, so the caller publishes them again once it is back (``Bus.reset``)."""


class CommitError(RuntimeError):
    """A commit did not complete (a rebalance, or the broker is away): nothing is lost,
    the next commit covers the same offsets, or the records are consumed again."""


class RecordTooLarge(ValueError):
    """One record is over the largest the bus can carry: that record's fault, not the
    broker's, so retrying cannot help (the input that made it is dead-lettered)."""


@dataclass(frozen=True)
class Message:
    """One consumed record, with where it came from."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: Mapping[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0

    def header(self, name: str, default: str | None = None) -> str | None:
        raw = self.headers.get(name)
        return raw.decode("utf-8", "replace") if raw is not None else default


@runtime_checkable
class Consumer(Protocol):
    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Message]:
        """Next records for this member's partitions, in partition order; [] on timeout."""
        ...

    def commit(self, messages: Iterable[Message]) -> None:
        """Make the given messages (and everything before them per partition) durable."""
        ...

    def commit_positions(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Commit ``{(topic, partition): next offset to read}``; :class:`CommitError` if
        the commit did not complete."""
        ...

    def close(self) -> None: ...

    def lags(self) -> dict[tuple[str, int], int]:
        """Records behind the high-water mark, per assigned partition (known ones only)."""
        ...

    @property
    def assigned(self) -> bool:
        """Whether the group has given this member its partitions yet."""
        ...


@runtime_checkable
class Bus(Protocol):
    def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> None:
        """Queue one record; it is durable once ``flush`` returns."""
        ...

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until every published record is acknowledged; raise DeliveryError if not."""
        ...

    def consumer(self, topics: Sequence[str], group_id: str) -> Consumer:
        """Join ``group_id`` and consume ``topics`` from the last committed offsets."""
        ...

    def ensure_topics(self, topics: Iterable[str]) -> None:
        """Create the topics that do not exist yet."""
        ...

    def read_before_committed(self, topic: str, group_id: str, per_partition: int
                              ) -> Iterator[Message]:
        """Up to the last ``per_partition`` records of each partition of ``topic`` before
        ``group_id``'s committed offset, without joining the group or moving its offsets:
        what a restarted stage reads to rebuild the state its group's commits left behind."""
        ...

    def reset(self) -> None:
        """After a :class:`DeliveryError`: drop the producer and the records it had not
        had acknowledged; the next ``publish`` connects afresh (a restarted broker)."""
        ...

    def ping(self, timeout_s: float = 3.0) -> set[str]:
        """The topics the broker has, within ``timeout_s``; :class:`DeliveryError` if it
        does not answer (health checks)."""
        ...

    def close(self) -> None: ...


def partition_for(key: str | None, partitions: int, counter: int) -> int:
    """Stable key → partition (records of one trajectory stay in order)."""
    if key is None:
        return counter % partitions
    return zlib.crc32(key.encode()) % partitions


def commit_offsets(messages: Iterable[Message]) -> dict[tuple[str, int], int]:
    """The next offset to read per (topic, partition) after ``messages``."""
    nxt: dict[tuple[str, int], int] = {}
    for m in messages:
        tp = (m.topic, m.partition)
        nxt[tp] = max(nxt.get(tp, 0), m.offset + 1)
    return nxt


# --- in-process backend --------------------------------------------------------


class _Log:
    def __init__(self, partitions: int) -> None:
        self.partitions: list[list[Message]] = [[] for _ in range(partitions)]


class InMemoryBus:
    """A thread-safe in-process bus with Kafka's group semantics.

    Each group keeps committed offsets per partition; members of a group split
    partitions round-robin, re-split whenever a member joins or leaves. Nothing
    outlives the process. ``max_record_bytes`` is the largest value ``publish`` takes
    (:class:`RecordTooLarge` above it), as a Kafka producer's request size limit is.
    """

    def __init__(self, partitions: int = 3, max_record_bytes: int | None = None) -> None:
        self.partitions = partitions
        self.max_record_bytes = max_record_bytes
        self._logs: dict[str, _Log] = {}
        self._committed: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)
        self._members: dict[str, list[InMemoryConsumer]] = defaultdict(list)
        self._cond = threading.Condition()
        self._counter = 0
        self._closed = False

    def _log(self, topic: str) -> _Log:
        if topic not in self._logs:
            self._logs[topic] = _Log(self.partitions)
        return self._logs[topic]

    def ensure_topics(self, topics: Iterable[str]) -> None:
        with self._cond:
            for t in topics:
                self._log(t)

    def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> None:
        if self._closed:
            raise DeliveryError("bus is closed")
        if not isinstance(value, bytes | bytearray):
            raise TypeError(f"value must be bytes, got {type(value).__name__}")
        if self.max_record_bytes is not None and len(value) > self.max_record_bytes:
            raise RecordTooLarge(f"a record of {len(value)} bytes for {topic} is over the "
                                 f"bus's limit of {self.max_record_bytes} bytes")
        with self._cond:
            log = self._log(topic)
            p = partition_for(key, self.partitions, self._counter)
            self._counter += 1
            part = log.partitions[p]
            part.append(
                Message(
                    topic=topic,
                    partition=p,
                    offset=len(part),
                    key=key,
                    value=bytes(value),
                    headers=dict(headers or {}),
                    timestamp_ms=int(time.time() * 1000),
                )
            )
            self._cond.notify_all()

    def flush(self, timeout_s: float = 30.0) -> None:
        return None  # appends are synchronous: acknowledged on return

    def consumer(self, topics: Sequence[str], group_id: str) -> InMemoryConsumer:
        c = InMemoryConsumer(self, list(topics), group_id)
        with self._cond:
            for t in topics:
                self._log(t)
            self._members[group_id].append(c)
            self._rebalance(group_id)
        return c

    def _rebalance(self, group_id: str) -> None:
        members = self._members[group_id]
        if not members:
            return
        tps = sorted({(t, p) for m in members for t in m.topics for p in range(self.partitions)})
        for m in members:
            m._assignment = {}
        for i, tp in enumerate(tps):
            owner = members[i % len(members)]
            if tp[0] in owner.topics:
                owner._assignment[tp] = self._committed[group_id].get(tp, 0)

    def _leave(self, consumer: InMemoryConsumer) -> None:
        with self._cond:
            members = self._members[consumer.group_id]
            if consumer in members:
                members.remove(consumer)
                self._rebalance(consumer.group_id)

    def read_before_committed(self, topic: str, group_id: str, per_partition: int
                              ) -> Iterator[Message]:
        with self._cond:
            committed = self._committed[group_id]
            out = []
            for p, part in enumerate(self._log(topic).partitions):
                end = committed.get((topic, p), 0)
                out.extend(part[max(0, end - per_partition):end])
        yield from out

    def end_offsets(self, topic: str) -> list[int]:
        with self._cond:
            return [len(p) for p in self._log(topic).partitions]

    def read_all(self, topic: str) -> list[Message]:
        """Every record of a topic (test and tail helper), partition by partition."""
        with self._cond:
            return [m for p in self._log(topic).partitions for m in p]

    def reset(self) -> None:
        return None  # nothing is ever left unacknowledged

    def ping(self, timeout_s: float = 3.0) -> set[str]:
        if self._closed:
            raise DeliveryError("bus is closed")
        with self._cond:
            return set(self._logs)

    def close(self) -> None:
        self._closed = True


class InMemoryConsumer:
    def __init__(self, bus: InMemoryBus, topics: list[str], group_id: str) -> None:
        self.bus = bus
        self.topics = topics
        self.group_id = group_id
        self._assignment: dict[tuple[str, int], int] = {}
        self._closed = False

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Message]:
        if self._closed:
            raise RuntimeError("consumer is closed")
        deadline = time.monotonic() + timeout_s
        with self.bus._cond:
            while True:
                out: list[Message] = []
                for tp in sorted(self._assignment):
                    pos = self._assignment[tp]
                    part = self.bus._logs[tp[0]].partitions[tp[1]]
                    take = part[pos : pos + max_records - len(out)]
                    out.extend(take)
                    self._assignment[tp] = pos + len(take)
                    if len(out) >= max_records:
                        break
                if out:
                    return out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self.bus._cond.wait(remaining)

    @property
    def assigned(self) -> bool:
        return True

    def commit(self, messages: Iterable[Message]) -> None:
        self.commit_positions(commit_offsets(messages))

    def commit_positions(self, positions: Mapping[tuple[str, int], int]) -> None:
        with self.bus._cond:
            committed = self.bus._committed[self.group_id]
            for tp, nxt in positions.items():
                committed[tp] = nxt

    def lags(self) -> dict[tuple[str, int], int]:
        with self.bus._cond:
            return {
                tp: max(0, len(self.bus._logs[tp[0]].partitions[tp[1]]) - pos)
                for tp, pos in self._assignment.items()
            }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.bus._leave(self)
