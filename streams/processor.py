"""At-least-once stream processing: consume → decode → handle → produce → flush → commit.

A batch's input offsets are committed only after every output of that batch
(including its dead letters) is acknowledged, so a crash anywhere redelivers
the batch and loses nothing; outputs carry an idempotency key so consumers can
drop the duplicates a redelivery makes (DESIGN §2.4).

A record that is too large, too deep, is not JSON, or does not validate goes
to the dead-letter topic with the original bytes as its value (cut to
``deadletter_max_bytes``, the original size in a header) and the reason in its
headers, and the loop moves on: no exception raised while decoding or handling
one record stops the loop. An output too large for the bus is dead-lettered in
its place, with the reason.

A broker that stops acknowledging is waited out, not fatal: every record
published since the last acknowledged flush is kept, and on a
:class:`DeliveryError` the processor reports itself unhealthy, backs off, drops
its producer (``Bus.reset``), makes its topics again where a new broker lacks
them, publishes the kept records again and flushes, until the broker answers;
only then does it commit. Idempotency keys make the repeats harmless.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from streams.bus import Bus, CommitError, Consumer, DeliveryError, Message, RecordTooLarge
from streams.records import SCHEMA_VERSION, Record, RecordError, decode, encode

log = logging.getLogger(__name__)

# Header names on every record vigil writes.
H_KIND = "vigil-kind"
H_SCHEMA = "vigil-schema"
H_IDEMPOTENCY = "vigil-idempotency-key"
# Extra headers on a dead letter.
H_DLQ_REASON = "vigil-dlq-reason"
H_DLQ_TOPIC = "vigil-dlq-topic"
H_DLQ_PARTITION = "vigil-dlq-partition"
H_DLQ_OFFSET = "vigil-dlq-offset"
H_DLQ_GROUP = "vigil-dlq-group"
H_DLQ_SIZE = "vigil-dlq-original-bytes"  # set when the value was cut to the limit


class RetryLater(Exception):  # noqa: N818 - it is an instruction, not an error
    """Raised by a handler when its input is fine but something downstream is not
    (a service it must call is unreachable): the batch is neither dead-lettered nor
    committed, and the processor consumes it again after a pause."""


@dataclass(frozen=True)
class Output:
    """A record to publish, keyed by trajectory or execution id."""

    topic: str
    record: Record
    key: str
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Reject:
    """A batch handler's verdict that one input ``message`` is bad although it decoded (a
    step id already taken by a different step, say): it is dead-lettered with ``reason``
    among the batch's outputs, and the rest of the batch is handled."""

    message: Message
    reason: str


@dataclass(frozen=True)
class RawOutput:
    """Bytes to publish as they are, for a topic another system reads in its own format
    (the OTLP spans vigil's verdicts go back out as): not a vigil record, no vigil headers
    beyond ``headers``."""

    topic: str
    value: bytes
    key: str
    headers: Mapping[str, bytes] = field(default_factory=dict)


def record_headers(record: Record, idempotency_key: str | None = None) -> dict[str, bytes]:
    headers = {H_KIND: record.kind.encode(), H_SCHEMA: str(SCHEMA_VERSION).encode()}
    if idempotency_key:
        headers[H_IDEMPOTENCY] = idempotency_key.encode()
    return headers


def publish_record(
    bus: Bus, topic: str, record: Record, *, key: str, idempotency_key: str | None = None
) -> None:
    bus.publish(topic, encode(record), key=key, headers=record_headers(record, idempotency_key))


def dead_letter_record(
    message: Message, reason: str, group_id: str = "", max_bytes: int | None = None
) -> tuple[bytes, dict[str, bytes]]:
    """The value and headers of ``message``'s dead letter: the original bytes (the first
    ``max_bytes`` of them, with the original size in a header) and why and where."""
    headers = {k: v for k, v in list(message.headers.items())[:64]}
    headers.update(
        {
            H_DLQ_REASON: reason.encode("utf-8", "replace")[:4096],
            H_DLQ_TOPIC: message.topic.encode(),
            H_DLQ_PARTITION: str(message.partition).encode(),
            H_DLQ_OFFSET: str(message.offset).encode(),
            H_DLQ_GROUP: group_id.encode(),
        }
    )
    value = message.value
    if max_bytes is not None and len(value) > max_bytes:
        headers[H_DLQ_SIZE] = str(len(value)).encode()
        value = value[:max_bytes]
    return value, headers


Handler = Callable[[Record, Message], Iterable[Output | RawOutput]]
BatchHandler = Callable[[list[tuple[Record, Message]]], Iterable[Output | RawOutput | Reject]]
# reads one input topic's payloads in a format of its own (not vigil's JSON records): a
# record, or RecordError (the message is dead-lettered with the reason)
Decoder = Callable[[bytes], Record]
Positions = Mapping[tuple[str, int], int]


@dataclass
class ProcessorStats:
    consumed: int = 0
    processed: int = 0
    dead_lettered: int = 0
    produced: int = 0
    batches: int = 0
    retries: int = 0
    delivery_failures: int = 0  # flushes the broker did not acknowledge (then retried)
    commit_failures: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Pending:
    """A record published but not yet acknowledged: published again after a reset."""

    topic: str
    value: bytes
    key: str | None
    headers: Mapping[str, bytes]


class StreamProcessor:
    """Runs ``handler`` over the records of ``topics`` as member of ``group_id``.

    ``models`` maps each input topic to the record type its payloads must
    validate as. The handler returns the outputs for one input; it raising
    ``Exception`` is treated like a bad record (dead-lettered with the
    exception), so one poisoned input never stalls the stream.

    ``batch_handler`` (instead of ``handler``) takes every decoded record of a
    polled batch at once, so a model scores the batch in one call. Records that
    fail to decode are dead-lettered one by one before it runs. If it raises,
    the batch is handled again one record at a time, so only the record that
    makes it raise is dead-lettered; a batch handler with state must therefore
    leave its state unchanged when it raises.

    Stateful handlers (which buffer inputs before they can produce) pass
    ``tick``, called after every poll to emit what became ready, and ``hold``,
    which returns per partition the first offset whose input is still only in
    memory: commits never pass it, so a crash redelivers what was buffered.

    ``on_health(ok, reason)`` is called when delivery to the broker fails (``ok``
    false, with why) and again when it works again; ``ensure_topics`` are the topics
    made again on a broker that lacks them (the inputs and the dead-letter topic
    always are). ``decoders`` read the topics another system writes in its own format (the
    OpenTelemetry Collector's OTLP protobuf): a topic there is decoded by its decoder, not
    as a JSON record.
    """

    def __init__(
        self,
        bus: Bus,
        models: Mapping[str, type[Record]],
        group_id: str,
        handler: Handler | None = None,
        *,
        deadletter_topic: str,
        batch_handler: BatchHandler | None = None,
        max_record_bytes: int = 1_048_576,
        deadletter_max_bytes: int = 1_048_576,
        batch_size: int = 500,
        tick: Callable[[], Iterable[Output]] | None = None,
        hold: Callable[[], Positions] | None = None,
        on_batch: Callable[[ProcessorStats], None] | None = None,
        ensure_topics: Sequence[str] = (),
        flush_timeout_s: float = 10.0,
        decoders: Mapping[str, Decoder] | None = None,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise ValueError("a StreamProcessor takes exactly one of handler and batch_handler")
        self.bus = bus
        self.models = dict(models)
        self.group_id = group_id
        self.handler = handler
        self.batch_handler = batch_handler
        self.deadletter_topic = deadletter_topic
        self.max_record_bytes = max_record_bytes
        self.deadletter_max_bytes = deadletter_max_bytes
        self.batch_size = batch_size
        self.tick = tick
        self.hold = hold
        self.on_batch = on_batch
        self.ensure_topics = list(dict.fromkeys([*self.models, deadletter_topic, *ensure_topics]))
        self.flush_timeout_s = flush_timeout_s
        self.decoders = dict(decoders or {})
        self.on_assigned: Callable[[], None] | None = None  # called once partitions arrive
        self.on_health: Callable[[bool, str], None] | None = None  # delivery lost / back
        # called at most every ``lag_every_s`` with the input lag per partition (metrics)
        self.on_lag: Callable[[Mapping[tuple[str, int], int]], None] | None = None
        self.lag_every_s = 1.0
        self.last_batch: Sequence[Message] = ()  # the batch ``on_batch`` reports on
        self.stats = ProcessorStats()
        self._seen: dict[tuple[str, int], int] = {}  # next offset after the last polled
        self._committed: dict[tuple[str, int], int] = {}
        self._unacked: list[_Pending] = []  # published since the last acknowledged flush
        self._delivering = True  # the last flush was acknowledged
        self._broker_away = threading.Event()  # set by a broker watch while the broker is gone

    # --- publishing -----------------------------------------------------------------

    def _publish(self, topic: str, value: bytes, key: str | None,
                 headers: Mapping[str, bytes]) -> None:
        self.bus.publish(topic, value, key=key, headers=headers)  # RecordTooLarge: not kept
        self._unacked.append(_Pending(topic, value, key, headers))

    def reject(self, message: Message, reason: str) -> None:
        """Dead-letter ``message`` (original bytes, reason in the headers)."""
        log.warning(
            "dead-lettering %s[%d]@%d: %s", message.topic, message.partition, message.offset,
            reason[:500],
        )
        value, headers = dead_letter_record(message, reason, self.group_id,
                                             self.deadletter_max_bytes)
        self._publish(self.deadletter_topic, value, message.key, headers)
        self.stats.dead_lettered += 1
        kind = reason.split(":", 1)[0]
        self.stats.reasons[kind] = self.stats.reasons.get(kind, 0) + 1

    def _emit(self, outputs: Iterable[Output | RawOutput | Reject]) -> None:
        for out in outputs:
            if isinstance(out, Reject):
                self.reject(out.message, out.reason)
                continue
            if isinstance(out, RawOutput):
                try:
                    self._publish(out.topic, out.value, out.key, out.headers)
                except RecordTooLarge as e:
                    self.reject(Message(out.topic, -1, -1, out.key, out.value, dict(out.headers)),
                                f"output: {out.topic} payload too large ({e})")
                    continue
                self.stats.produced += 1
                continue
            value = encode(out.record)
            headers = record_headers(out.record, out.idempotency_key)
            try:
                self._publish(out.topic, value, out.key, headers)
            except RecordTooLarge as e:  # that output's fault: it goes to the dead letters
                self.reject(
                    Message(out.topic, -1, -1, out.key, value, headers),
                    f"output: {out.record.kind} record for {out.topic} too large ({e})",
                )
                continue
            self.stats.produced += 1

    # --- handling -------------------------------------------------------------------

    def process(self, messages: Sequence[Message]) -> None:
        """Handle one polled batch and publish its outputs (not yet flushed)."""
        decoded: list[tuple[Record, Message]] = []
        for m in messages:
            self.stats.consumed += 1
            tp = (m.topic, m.partition)
            self._seen[tp] = max(self._seen.get(tp, 0), m.offset + 1)
            if len(m.value) > self.max_record_bytes:
                self.reject(
                    m,
                    f"oversize: record of {len(m.value)} bytes exceeds the "
                    f"limit of {self.max_record_bytes} bytes",
                )
                continue
            try:
                decoder = self.decoders.get(m.topic)
                record = (decoder(m.value) if decoder is not None
                          else decode(m.value, self.models[m.topic]))
            except RecordError as e:
                self.reject(m, f"invalid: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - decode's contract is RecordError; be sure
                self.reject(m, f"invalid: {type(e).__name__}: {str(e)[:300]}")
                continue
            if self.batch_handler is None:
                self._handle_one(record, m)
            else:
                decoded.append((record, m))
        if self.batch_handler is None or not decoded:
            return
        try:
            outputs = list(self.batch_handler(decoded))
        except RetryLater:
            raise
        except Exception:  # find the poisoned record: one at a time
            log.exception("batch handler failed on %d records; retrying one by one", len(decoded))
            for record, m in decoded:
                self._handle_one(record, m)
            return
        self._emit(outputs)
        self.stats.processed += len(decoded)

    def _handle_one(self, record: Record, m: Message) -> None:
        try:
            if self.batch_handler is not None:
                outputs = list(self.batch_handler([(record, m)]))
            else:
                assert self.handler is not None
                outputs = list(self.handler(record, m))
        except RetryLater:
            raise
        except Exception as e:  # a poisoned record must not stop the stream
            log.exception("handler failed on %s[%d]@%d", m.topic, m.partition, m.offset)
            self.reject(m, f"handler: {type(e).__name__}: {str(e)[:1000]}")
            return
        self._emit(outputs)
        self.stats.processed += 1

    # --- delivery and commits -------------------------------------------------------

    def _health(self, ok: bool, reason: str) -> None:
        if ok == self._delivering:
            return
        self._delivering = ok
        if ok:
            log.warning("%s: the broker acknowledges again", self.group_id)
        else:
            log.error("%s: %s", self.group_id, reason)
        if self.on_health is not None:
            self.on_health(ok, reason)

    def deliver(self, stop: threading.Event | None = None, backoff_s: float = 1.0) -> bool:
        """Flush until the broker acknowledges everything published since the last flush;
        False if ``stop`` was set first (then nothing may be committed)."""
        backoff = backoff_s
        while True:
            try:
                self.bus.flush(self.flush_timeout_s)
            except DeliveryError as e:
                self.stats.delivery_failures += 1
                self._health(False, f"the broker did not acknowledge {len(self._unacked)} "
                                    f"record(s): {str(e)[:300]}; retrying in {backoff:.0f} s")
            else:
                self._unacked.clear()
                self._health(True, "")
                return True
            if stop is not None and stop.wait(backoff):
                return False
            if stop is None:
                time.sleep(backoff)
            backoff = min(2 * backoff, 30.0)
            self.bus.reset()
            try:  # a broker that came back empty lacks our topics
                self.bus.ensure_topics(self.ensure_topics)
            except Exception as e:  # noqa: BLE001 - still down: the next flush says so
                log.debug("ensure_topics failed: %s", e)
            for r in self._unacked:  # each was taken once, so none is too large
                self.bus.publish(r.topic, r.value, key=r.key, headers=r.headers)

    def _commit(self, consumer: Consumer) -> None:
        held = self.hold() if self.hold else {}
        positions = {}
        for tp, nxt in self._seen.items():
            pos = min(nxt, held.get(tp, nxt))
            if pos > self._committed.get(tp, -1):
                positions[tp] = pos
        if positions:
            try:
                consumer.commit_positions(positions)
            except CommitError as e:  # the outputs are acknowledged; the next commit covers it
                self.stats.commit_failures += 1
                log.warning("%s: %s (offsets are committed with the next batch)",
                            self.group_id, e)
                return
            self._committed.update(positions)

    def broker_lost(self) -> None:
        """The broker stopped answering: consume nothing until :meth:`broker_back`."""
        self._broker_away.set()

    def broker_back(self) -> None:
        """The broker answers again: join the group again from its committed offsets."""
        self._broker_away.clear()

    def _sit_out_outage(self, consumer: Consumer, stop: threading.Event | None) -> Consumer | None:
        """Positions from before an outage may not hold on the broker that comes back: one
        that restarted empty numbers its new records from 0 again, so a consumer that kept
        its position would skip them. Drop the consumer, wait for the broker, and join again
        from the committed offsets (none on an empty broker: from the earliest record). The
        outputs still unacknowledged wait in memory and go out with the next delivery.
        ``None`` when ``stop`` was set first."""
        consumer.close()
        self._seen = {}
        self._committed = {}
        while not (stop is not None and stop.is_set()):
            if not self._broker_away.is_set():
                try:
                    return self.bus.consumer(list(self.models), self.group_id)
                except Exception as e:  # noqa: BLE001 - the broker went away again
                    log.warning("%s: joining again failed (%s); retrying", self.group_id, e)
            time.sleep(0.5)
        return None

    def run(
        self,
        *,
        stop: threading.Event | None = None,
        idle_timeout_s: float | None = None,
        max_messages: int | None = None,
        poll_timeout_s: float = 0.5,
        retry_backoff_s: float = 2.0,
    ) -> ProcessorStats:
        """Loop until ``stop`` is set, ``idle_timeout_s`` passes with no input,
        or ``max_messages`` have been consumed. The idle clock starts once the
        group has assigned partitions (joining a group takes seconds).

        When the handler raises :class:`RetryLater`, what the batch published so
        far is flushed, nothing is committed, and the member leaves the group
        and joins again after ``retry_backoff_s`` (doubling up to a minute), so
        the batch is redelivered from the last commit. When the broker does not
        acknowledge, :meth:`deliver` waits it out before anything is committed."""
        consumer = self.bus.consumer(list(self.models), self.group_id)
        open_ = True
        backoff = retry_backoff_s
        last_input: float | None = None
        last_lag = 0.0
        announced = False
        try:
            while not (stop and stop.is_set()):
                if max_messages is not None and self.stats.consumed >= max_messages:
                    break
                if self._broker_away.is_set():
                    back = self._sit_out_outage(consumer, stop)
                    if back is None:
                        open_ = False
                        break
                    consumer, last_input = back, None
                    continue
                limit = self.batch_size
                if max_messages is not None:
                    limit = min(limit, max_messages - self.stats.consumed)
                batch = consumer.poll(poll_timeout_s, limit)
                if not announced and (batch or consumer.assigned):
                    announced = True
                    if self.on_assigned:
                        self.on_assigned()
                if batch:
                    try:
                        self.process(batch)
                    except RetryLater as e:
                        self.stats.retries += 1
                        log.warning("%s: %s; consuming the batch again in %.1f s",
                                    self.group_id, e, backoff)
                        if not self.deliver(stop):
                            break
                        consumer.close()
                        if stop is not None:
                            stop.wait(backoff)
                        else:
                            time.sleep(backoff)
                        backoff = min(2 * backoff, 60.0)
                        self._seen = dict(self._committed)
                        consumer = self.bus.consumer(list(self.models), self.group_id)
                        last_input = None
                        continue
                    backoff = retry_backoff_s
                    last_input = time.monotonic()  # idle counts from the end of the work
                elif last_input is None and consumer.assigned:
                    last_input = time.monotonic()
                if self.tick:
                    self._emit(self.tick())
                if batch or self.tick:
                    if not self.deliver(stop):  # outputs acknowledged ...
                        break  # stopped while the broker was away: commit nothing
                    self._commit(consumer)  # ... before the inputs are committed
                if self.on_lag and time.monotonic() - last_lag >= self.lag_every_s:
                    last_lag = time.monotonic()
                    self.on_lag(consumer.lags())
                if batch:
                    self.stats.batches += 1
                    self.last_batch = batch
                    if self.on_batch:
                        self.on_batch(self.stats)
                elif (
                    idle_timeout_s is not None
                    and last_input is not None
                    and time.monotonic() - last_input > idle_timeout_s
                ):
                    break
        finally:
            if open_:
                consumer.close()
        return self.stats
