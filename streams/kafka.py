"""Kafka backend of the ``Bus`` (kafka-python), for any Kafka-protocol broker.

Producer: ``acks=all`` with idempotence, so a retried send is written once.
Consumer: auto-commit off; the caller commits after its outputs are flushed.

A broker that goes away is never fatal here: ``publish`` does not raise for it
(the record's failure surfaces at ``flush`` as :class:`DeliveryError`), ``reset``
drops a producer that a restarted broker no longer knows, and metadata is
refreshed every few seconds, so topics made again on a new broker are found.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, MessageSizeTooLargeError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from streams.bus import CommitError, DeliveryError, Message, RecordTooLarge, commit_offsets
from streams.config import KafkaSettings

log = logging.getLogger(__name__)


class KafkaBus:
    """``Bus`` over kafka-python. Clients are created on first use."""

    def __init__(self, settings: KafkaSettings) -> None:
        if not settings.bootstrap_servers:
            raise ValueError(
                "KafkaBus needs bootstrap servers: set VIGIL_KAFKA_BOOTSTRAP_SERVERS "
                "or start the embedded broker (streams.broker.EmbeddedBroker)"
            )
        self.settings = settings
        self._producer: KafkaProducer | None = None
        self._pending: list[Any] = []
        self._admin: KafkaAdminClient | None = None

    @property
    def producer(self) -> KafkaProducer:
        if self._producer is None:
            s = self.settings
            self._producer = KafkaProducer(
                **s.client_options(),
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                max_block_ms=s.max_block_ms,
                metadata_max_age_ms=s.metadata_max_age_ms,
                # room for a dead-lettered record plus its headers
                max_request_size=max(2 * s.max_record_bytes, 1_048_576) + 65_536,
            )
        return self._producer

    def publish(
        self,
        topic: str,
        value: bytes,
        *,
        key: str | None = None,
        headers: Mapping[str, bytes] | None = None,
    ) -> None:
        try:
            fut = self.producer.send(
                topic,
                value=bytes(value),
                key=key.encode() if key is not None else None,
                headers=list((headers or {}).items()),
            )
        except MessageSizeTooLargeError as e:
            raise RecordTooLarge(f"a record of {len(value)} bytes for {topic}: {e}") from None
        except KafkaError as e:  # the broker, not the record: surfaces at flush
            fut = _Failed(e)
        self._pending.append(fut)

    def flush(self, timeout_s: float = 30.0) -> None:
        if self._producer is None:
            return
        pending, self._pending = self._pending, []
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as e:
            raise DeliveryError(f"flush did not complete: {e}") from e
        except AssertionError as e:  # kafka-python asserts on a producer a broker forgot
            raise DeliveryError(f"flush did not complete: {e!r}") from e
        failed = [f for f in pending if not f.succeeded()]
        if failed:
            first = failed[0]
            reason = first.exception if first.is_done else "not acknowledged in time"
            raise DeliveryError(f"{len(failed)} record(s) not acknowledged: {reason}")

    def _consumer_options(self, group_id: str) -> dict[str, Any]:
        s = self.settings
        return dict(
            s.client_options(),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            metadata_max_age_ms=s.metadata_max_age_ms,
            max_partition_fetch_bytes=max(2 * s.max_record_bytes, 1_048_576),
            fetch_max_bytes=max(4 * s.max_record_bytes, 52_428_800),
        )

    def consumer(self, topics: Sequence[str], group_id: str) -> KafkaBusConsumer:
        return KafkaBusConsumer(KafkaConsumer(*topics, **self._consumer_options(group_id)))

    def read_before_committed(self, topic: str, group_id: str, per_partition: int,
                              *, timeout_s: float = 300.0) -> Iterator[Message]:
        """Assigned by hand (the group is not joined, its offsets not touched): reads its
        committed offsets, seeks ``per_partition`` records back and reads up to them."""
        consumer = KafkaConsumer(**self._consumer_options(group_id))
        try:
            partitions = consumer.partitions_for_topic(topic) or set()
            ends: dict[TopicPartition, int] = {}
            for p in sorted(partitions):
                tp = TopicPartition(topic, p)
                committed = consumer.committed(tp)
                if committed:
                    ends[tp] = committed
            if not ends:
                return
            consumer.assign(list(ends))
            for tp, end in ends.items():
                consumer.seek(tp, max(0, end - per_partition))
            wrapped = KafkaBusConsumer(consumer)
            deadline = time.monotonic() + timeout_s
            while ends:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"reading {topic} back to {group_id}'s committed offsets took over "
                        f"{timeout_s:.0f} s; {len(ends)} partition(s) unfinished")
                for m in wrapped.poll(timeout_s=1.0):
                    tp = TopicPartition(m.topic, m.partition)
                    if tp in ends and m.offset < ends[tp]:
                        yield m
                for tp in list(ends):  # done once the position reaches the commit
                    if consumer.position(tp) >= ends[tp]:
                        del ends[tp]
                        consumer.pause(tp)
        finally:
            consumer.close(autocommit=False)

    def ensure_topics(self, topics: Iterable[str]) -> None:
        admin = KafkaAdminClient(**self.settings.client_options())
        try:
            existing = set(admin.list_topics())
            new = [
                NewTopic(t, self.settings.partitions, 1)
                for t in dict.fromkeys(topics)
                if t not in existing
            ]
            for topic in new:  # one at a time: a concurrent creator only costs a retry
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics([topic])
        finally:
            admin.close()

    def reset(self) -> None:
        producer, self._producer, self._pending = self._producer, None, []
        if producer is not None:
            with contextlib.suppress(Exception):  # it is being dropped for failing
                producer.close(timeout=0)

    def ping(self, timeout_s: float = 3.0) -> set[str]:
        """The broker's topics, by one metadata request of at most ``timeout_s``."""
        try:
            if self._admin is None:
                opts = self.settings.client_options()
                opts["request_timeout_ms"] = int(timeout_s * 1000)
                opts["bootstrap_timeout_ms"] = int(timeout_s * 1000)
                self._admin = KafkaAdminClient(**opts)
            return set(self._admin.list_topics())
        except Exception as e:  # noqa: BLE001 - any failure means "not answering"
            admin, self._admin = self._admin, None  # a client of a dead broker may not recover
            if admin is not None:
                with contextlib.suppress(Exception):
                    admin.close()
            raise DeliveryError(f"the broker at {self.settings.bootstrap_servers} does not "
                                f"answer: {type(e).__name__}: {e}") from None

    def close(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None
        if self._producer is not None:
            try:
                self.flush()
            finally:
                self._producer.close(timeout=5)
                self._producer = None


class _Failed:
    """A send that failed before it was queued, as a future that flush reports."""

    is_done = True

    def __init__(self, exception: Exception) -> None:
        self.exception = exception

    def succeeded(self) -> bool:
        return False


class KafkaBusConsumer:
    commit_timeout_ms = 10_000  # a commit that cannot finish raises instead of hanging

    def __init__(self, consumer: KafkaConsumer) -> None:
        self._c = consumer

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[Message]:
        batches = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[Message] = []
        for tp in sorted(batches, key=lambda t: (t.topic, t.partition)):
            for r in batches[tp]:
                out.append(
                    Message(
                        topic=r.topic,
                        partition=r.partition,
                        offset=r.offset,
                        key=r.key.decode("utf-8", "replace") if r.key is not None else None,
                        value=r.value if r.value is not None else b"",
                        headers=dict(r.headers or []),
                        timestamp_ms=r.timestamp,
                    )
                )
        return out

    @property
    def assigned(self) -> bool:
        return bool(self._c.assignment())

    def commit(self, messages: Iterable[Message]) -> None:
        self.commit_positions(commit_offsets(messages))

    def commit_positions(self, positions: Mapping[tuple[str, int], int]) -> None:
        offsets = {
            TopicPartition(t, p): OffsetAndMetadata(nxt, "", -1)
            for (t, p), nxt in positions.items()
        }
        if offsets:
            try:
                self._c.commit(offsets, timeout_ms=self.commit_timeout_ms)
            except (KafkaError, AssertionError) as e:
                raise CommitError(f"commit did not complete: {type(e).__name__}: {e}") from e

    def lags(self) -> dict[tuple[str, int], int]:
        """Records behind the high watermark, per assigned partition whose watermark the
        last fetch reported (``consumer.highwater``: Tansu does not answer ``end_offsets``)."""
        out: dict[tuple[str, int], int] = {}
        for tp in self._c.assignment():
            hw = self._c.highwater(tp)
            if hw is not None:
                out[(tp.topic, tp.partition)] = max(0, hw - self._c.position(tp))
        return out

    def lag(self) -> int:
        """Records behind the high watermark on this member's partitions."""
        return sum(self.lags().values())

    def close(self) -> None:
        self._c.close(autocommit=False)
