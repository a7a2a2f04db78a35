"""OpenTelemetry traces through Kafka, both ways (``monitor ingest otlp --kafka``).

In: the OpenTelemetry Collector's Kafka exporter writes each batch of spans to a topic
(``otlp_spans`` by default) as one ``ExportTraceServiceRequest``, binary protobuf
(``otlp_proto``, its default encoding) or JSON (``otlp_json``). :class:`OtlpIngest` reads that
topic and publishes every new tool span as a step event on the deployment steps topic, as
the ``/v1/traces`` receiver does (:func:`monitor.integrations.otlp.step_events_from_otlp`):
one trajectory per trace, ``otlp/<trace id>``, the step id the span id. A message that is
not a trace request goes to the dead-letter topic with the reason; offsets are committed only
once its steps are acknowledged (at-least-once).

Out: :class:`VerdictSpans` reads the stream's step scores and writes, for every scored step of
an OTLP trajectory, a span named ``vigil.verdict`` in the same trace, child of the tool
span, carrying a ``vigil.verdict`` span event (tier, score, flagged, the tier's signals), to a
topic in the same encoding, where a Collector's Kafka receiver takes it back to the tracing
backend the agent's spans went to. The verdict span's id is derived from (trace, step, tier),
so a redelivered score writes the same span again, never a second one.

One ingest process per spans topic keeps a trace's steps in order: the Collector spreads a
trace's spans over partitions unless told ``partition_traces_by_id: true``, and each member of
a group would see only part of a trace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal

from streams.bus import Bus, Message
from streams.config import Topics
from streams.processor import Output, RawOutput, StreamProcessor
from streams.records import Record, RecordError, Score, parse_json

Encoding = Literal["otlp_proto", "otlp_json"]
ENCODINGS: tuple[Encoding, ...] = ("otlp_proto", "otlp_json")
SPANS_TOPIC = "otlp_spans"  # the Collector's Kafka exporter's default traces topic
MAX_BYTES = 4 << 20


class OtlpExport(Record):
    """One ``ExportTraceServiceRequest`` read from the spans topic, in its JSON mapping."""

    kind: ClassVar[str] = "otlp.traces"

    request: dict[str, Any]


def decoder(encoding: Encoding, max_bytes: int = MAX_BYTES) -> Callable[[bytes], OtlpExport]:
    """Reads one message of the Collector's Kafka exporter in ``encoding``; RecordError (the
    dead-letter reason) for anything that is not a trace request."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding {encoding!r}: the Collector's Kafka exporter writes traces "
                         f"as {' or '.join(ENCODINGS)}")

    def read_json(value: bytes) -> OtlpExport:
        doc = parse_json(value, OtlpExport.kind, max_bytes=max_bytes)
        if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
            raise RecordError(OtlpExport.kind, "not an ExportTraceServiceRequest (a JSON "
                                               "object with a resourceSpans list)")
        return OtlpExport(request=doc)

    def read_proto(value: bytes) -> OtlpExport:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        if len(value) > max_bytes:
            raise RecordError(OtlpExport.kind, f"payload of {len(value)} bytes exceeds the "
                                               f"limit of {max_bytes} bytes")
        try:
            msg = ExportTraceServiceRequest.FromString(value)
        except (DecodeError, RecursionError) as e:
            raise RecordError(OtlpExport.kind, "not an ExportTraceServiceRequest protobuf "
                              f"({str(e)[:200] or type(e).__name__}); is the exporter's "
                              "encoding otlp_json?") from None
        return OtlpExport(request=MessageToDict(msg))

    return read_json if encoding == "otlp_json" else read_proto


class OtlpIngest:
    """The spans topic's tool spans as deployment step events."""

    def __init__(self, topics: Topics, spans_topic: str = SPANS_TOPIC,
                 encoding: Encoding = "otlp_proto", *,
                 warn: Callable[[str], None] | None = None) -> None:
        from monitor.integrations.otlp import TraceMemory

        self.topics, self.spans_topic, self.encoding = topics, spans_topic, encoding
        self.memory = TraceMemory()
        self.warn = warn
        self._warned = False

    def handle(self, rec: Record, _m: Message) -> list[Output]:
        from monitor.integrations.otlp import step_events_from_otlp

        assert isinstance(rec, OtlpExport)
        said: list[str] = []
        events = step_events_from_otlp(rec.request, self.memory, warn=said.append)
        if said and self.warn is not None and not self._warned:  # once a process, not a batch
            self._warned = True
            self.warn(said[0])
        return [Output(self.topics.steps_deployment, e, key=e.trajectory_id,
                       idempotency_key=f"{e.trajectory_id}/{e.step.step_id}") for e in events]

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 100) -> StreamProcessor:
        return StreamProcessor(
            bus, {self.spans_topic: OtlpExport}, group_id, self.handle,
            deadletter_topic=self.topics.deadletter, batch_size=batch_size,
            decoders={self.spans_topic: decoder(self.encoding)},
            ensure_topics=[self.topics.steps_deployment],
        )


def _any(value: Any) -> dict[str, Any]:
    """A Python value as an OTLP ``AnyValue`` (JSON mapping)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _attributes(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any(v)} for k, v in values.items()]


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


def verdict_request(score: Score) -> dict[str, Any] | None:
    """The ``ExportTraceServiceRequest`` (JSON mapping) that carries ``score`` back to its
    trace as a ``vigil.verdict`` span; None for a step that did not come from a trace."""
    trace = score.trajectory_id.removeprefix("otlp/")
    if trace == score.trajectory_id or not _is_hex(trace, 32):
        return None
    parent = score.step_id if _is_hex(score.step_id, 16) else ""
    span_id = hashlib.blake2b(score.idempotency_key.encode(), digest_size=8).hexdigest()
    at = str(int(score.created_at * 1e9))
    verdict: dict[str, Any] = {"vigil.tier": score.tier, "vigil.score": float(score.score),
                               "vigil.flagged": bool(score.flagged)}
    signals = {f"vigil.signal.{k}": float(v) for k, v in sorted(score.signals.items())}
    span: dict[str, Any] = {
        "traceId": trace, "spanId": span_id, "name": "vigil.verdict", "kind": 1,
        "startTimeUnixNano": at, "endTimeUnixNano": at,
        "attributes": _attributes(verdict),
        "events": [{"timeUnixNano": at, "name": "vigil.verdict",
                    "attributes": _attributes({**verdict, **signals})}],
    }
    if parent:
        span["parentSpanId"] = parent
    return {"resourceSpans": [{
        "resource": {"attributes": _attributes({"service.name": "vigil"})},
        "scopeSpans": [{"scope": {"name": "vigil"}, "spans": [span]}],
    }]}


def encode_request(request: Mapping[str, Any], encoding: Encoding) -> bytes:
    """A trace request (JSON mapping, ids in hex) as the Collector's Kafka receiver reads it."""
    import json

    if encoding == "otlp_json":
        return json.dumps(request, separators=(",", ":")).encode()
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return ParseDict(_ids_base64(request), ExportTraceServiceRequest()).SerializeToString()


def _ids_base64(obj: Any) -> Any:
    """OTLP JSON writes ids in hex, protobuf's JSON mapping reads bytes as base64."""
    import base64

    if isinstance(obj, list):
        return [_ids_base64(x) for x in obj]
    if isinstance(obj, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode()
                    if k in ("traceId", "spanId", "parentSpanId") else _ids_base64(v))
                for k, v in obj.items()}
    return obj


class VerdictSpans:
    """The stream's step scores for OTLP trajectories as spans on ``out_topic``."""

    def __init__(self, topics: Topics, out_topic: str, encoding: Encoding = "otlp_proto"
                 ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding {encoding!r}: expected {' or '.join(ENCODINGS)}")
        self.topics, self.out_topic, self.encoding = topics, out_topic, encoding

    def handle(self, rec: Record, _m: Message) -> Iterable[RawOutput]:
        assert isinstance(rec, Score)
        request = verdict_request(rec)
        if request is None:
            return []
        return [RawOutput(self.out_topic, encode_request(request, self.encoding),
                          key=rec.trajectory_id.removeprefix("otlp/"))]

    def processor(self, bus: Bus, group_id: str, *, batch_size: int = 500) -> StreamProcessor:
        return StreamProcessor(bus, {self.topics.scores: Score}, group_id, self.handle,
                               deadletter_topic=self.topics.deadletter, batch_size=batch_size,
                               ensure_topics=[self.out_topic])
