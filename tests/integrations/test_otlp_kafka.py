"""The OpenTelemetry Collector's Kafka topic, both ways, on the real broker: spans the real
OpenTelemetry SDK recorded, encoded by its OTLP encoder (opentelemetry-proto) as the
Collector's Kafka exporter writes them, are read by `monitor ingest otlp --kafka`, screened
by `monitor stream` (the tiny policy's real L0), and every screened step comes back out as a
``vigil.verdict`` span in the agent's own trace; a message that is not a trace request goes to
the dead-letter topic with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from monitor.integrations.otlp_kafka import decoder, encode_request, verdict_request
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import H_DLQ_REASON
from streams.records import RecordError, Score
from tests.integrations.otel_runs import agent_runs
from tests.worker.conftest import ROOT, start_stream, topic_env

__all__ = ["start_stream"]  # the fixture, shared with the worker tests

pytestmark = pytest.mark.broker


def _recorded() -> tuple[Any, list[Any]]:
    """The two runs' spans as the SDK finished them, and the export request of them all."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    agent_runs(provider)
    spans = list(kept.get_finished_spans())
    return encode_spans(spans), spans


def _ingest(topics: Topics, settings: KafkaSettings, log: Path, *args: str
            ) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env.update(topic_env(topics))
    env.update({"PYTHONPATH": str(ROOT), "VIGIL_KAFKA_BOOTSTRAP_SERVERS":
                str(settings.bootstrap_servers)})
    return subprocess.Popen([sys.executable, "-m", "monitor.cli", "ingest", "otlp", "--kafka",
                             *args], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"))


def test_collector_spans_are_screened_and_verdicts_return_to_the_trace(
    request: pytest.FixtureRequest, topics: Topics, kafka_settings: KafkaSettings,
    unique: str, tmp_path: Path,
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    stream: Callable[..., Any] = request.getfixturevalue("start_stream")
    export, spans = _recorded()
    tools = {format(s.context.span_id, "016x"): s for s in spans
             if s.name.startswith("execute_tool")}
    spans_topic, verdicts_topic = f"{unique}.otlp_spans", f"{unique}.otlp_verdicts"
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics([spans_topic, verdicts_topic])
    bus.publish(spans_topic, export.SerializeToString(), key=None)
    bus.publish(spans_topic, b"\x0a\xff\xff\xff garbage", key=None)  # no trace request
    bus.flush()
    screen = stream(topics, "--role", "screen", "--group", f"{unique}.w", name="l0")
    log = tmp_path / "ingest.log"
    ingest = _ingest(topics, kafka_settings, log, "--topic", spans_topic, "--verdicts-topic",
                     verdicts_topic, "--group", f"{unique}.otlp")
    reader = bus.consumer([verdicts_topic, topics.deadletter], f"{unique}.reader")
    got: dict[str, list[Any]] = {}
    deadline = time.monotonic() + 240
    try:
        while len(got.get(verdicts_topic, [])) < 3 and time.monotonic() < deadline:
            assert ingest.poll() is None, log.read_text()
            for m in reader.poll(0.5):
                got.setdefault(m.topic, []).append(m)
    finally:
        ingest.send_signal(signal.SIGTERM)
        code = ingest.wait(60)
        screen.terminate()
        reader.close()
        bus.close()
    said = log.read_text()
    assert code == 0, said
    verdicts = [ExportTraceServiceRequest.FromString(m.value) for m in got[verdicts_topic]]
    assert len(verdicts) == 3, said  # one a tool span: read_file twice, send_money once
    for v in verdicts:
        (span,) = v.resource_spans[0].scope_spans[0].spans
        tool = tools[span.parent_span_id.hex()]  # a child of the tool span it judges ...
        assert span.trace_id.hex() == format(tool.context.trace_id, "032x")  # ... in its trace
        assert span.name == "vigil.verdict"
        (event,) = span.events
        facts = {a.key: a.value for a in event.attributes}
        assert facts["vigil.tier"].int_value == 0 and facts["vigil.flagged"].HasField(
            "bool_value")
        assert 0.0 <= facts["vigil.score"].double_value <= 1.0
    (dead,) = got[topics.deadletter]
    reason = dead.header(H_DLQ_REASON) or ""
    assert "ExportTraceServiceRequest" in reason and "otlp_json" in reason
    assert "ingest: 2 messages, 3 out, 1 dead-lettered" in said


def test_the_json_encoding_reads_and_writes_what_the_collector_does() -> None:
    """otlp_json: the exporter's JSON request read as the same steps as the protobuf, a
    verdict written back that protobuf's JSON parser reads as a span of the trace; a
    message that is not a request is refused in one sentence."""
    import base64

    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from monitor.integrations.otlp import TraceMemory, step_events_from_otlp

    def hex_ids(obj: Any) -> Any:  # OTLP JSON writes ids in hex, protobuf's mapping base64
        if isinstance(obj, list):
            return [hex_ids(x) for x in obj]
        if isinstance(obj, dict):
            return {k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId")
                    else hex_ids(v) for k, v in obj.items()}
        return obj

    request, _ = _recorded()
    as_json = decoder("otlp_json")(json.dumps(hex_ids(MessageToDict(request))).encode()).request
    as_proto = decoder("otlp_proto")(request.SerializeToString()).request
    steps = [step_events_from_otlp(r, TraceMemory()) for r in (as_json, as_proto)]
    assert [e.model_dump() for e in steps[0]] == [e.model_dump() for e in steps[1]]
    e = steps[0][-1]
    assert e.step.action.tool is not None and e.step.action.tool.name == "send_money"
    score = Score(trajectory_id=e.trajectory_id, step_id=e.step.step_id, tier=1, score=0.9,
                  flagged=True, signals={"probe": 0.8}, created_at=time.time())
    verdict = verdict_request(score)
    assert verdict is not None
    (span,) = json.loads(encode_request(verdict, "otlp_json"))["resourceSpans"][0][
        "scopeSpans"][0]["spans"]
    assert span["parentSpanId"] == e.step.step_id  # hex, as OTLP JSON has it
    assert span["traceId"] == e.trajectory_id.removeprefix("otlp/")
    back = ExportTraceServiceRequest.FromString(encode_request(verdict, "otlp_proto"))
    (proto,) = back.resource_spans[0].scope_spans[0].spans
    assert proto.parent_span_id.hex() == e.step.step_id
    assert {a.key for a in proto.events[0].attributes} >= {"vigil.flagged",
                                                          "vigil.signal.probe"}
    with pytest.raises(RecordError, match="resourceSpans"):
        decoder("otlp_json")(json.dumps(["not", "a", "request"]).encode())
    assert verdict_request(score.model_copy(update={"trajectory_id": "agentdojo/x"})) is None
