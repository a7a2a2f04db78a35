"""OpenTelemetry GenAI traces as trajectories: spans made by the real OpenTelemetry SDK,
encoded by the OTLP exporter's own encoder (opentelemetry-proto) as OTLP JSON, read back as
one trajectory per trace, warned about when content capture is off, and screened by
`monitor screen` straight from the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitor.cli.main import main
from monitor.integrations.otlp import CAPTURE_SETTING, read_otlp_file, trajectories_from_otlp
from tests.integrations.otel_runs import agent_runs


def _export(path: Path, *, content: bool = True) -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent_runs(provider, content=content)
    request = encode_spans(exporter.get_finished_spans())
    path.write_text(json.dumps(MessageToDict(request)) + "\n")


def test_each_trace_is_a_trajectory_of_its_tool_calls(tmp_path: Path) -> None:
    path = tmp_path / "traces.json"
    _export(path)
    runs = sorted(trajectories_from_otlp(read_otlp_file(path)), key=lambda t: len(t.steps))
    assert [len(t.steps) for t in runs] == [1, 2]
    t = runs[1]
    assert t.task.startswith("Can you please pay the bill")
    first, second = t.steps
    assert first.action.tool is not None and first.action.tool.name == "read_file"
    assert first.result is not None and "<INFORMATION>" in first.result.text
    assert second.action.tool is not None and second.action.tool.arguments == {
        "recipient": "US133000000121212121212", "amount": 100.0}
    assert second.observation.text == first.result.text  # what it read before acting


def test_spans_without_content_get_one_warning_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "bare.json"
    _export(path, content=False)
    said: list[str] = []
    runs = trajectories_from_otlp(read_otlp_file(path), warn=said.append)
    assert len(runs) == 2 and len(said) == 1 and CAPTURE_SETTING in said[0]


def test_monitor_screen_reads_an_otlp_file(
    tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, out = tmp_path / "traces.json", tmp_path / "screened.jsonl"
    _export(path)
    assert main(["screen", str(path), "--out", str(out), "--policy", str(tiny_policy),
                 "--no-review"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(len(x["steps"]) for x in lines) == [1, 2]
    assert all(x["trajectory_id"].startswith("otlp/") for x in lines)
    assert "2 traces with tool calls" in capsys.readouterr().err


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    """A live paging service (uvicorn, SQLite store, an in-memory bus where the steps go):
    its URL, its tokens, and the bus."""
    from tests.service.conftest import sqlite_service
    from tests.service.helpers import serving

    store = sqlite_service(tmp_path_factory.mktemp("otlp"))
    with serving(lambda base: store.app(public_url=base)) as base:
        yield base, store.tokens, store.bus


def _steps(bus: Any) -> list[Any]:
    from streams.config import Topics
    from streams.records import StepEvent, decode

    return [decode(m.value, StepEvent) for m in bus.read_all(Topics().steps_deployment)]


def test_the_sdks_otlp_exporter_streams_tool_calls_to_the_receiver(
    receiver: tuple[str, Any, Any],
) -> None:
    """The real SDK's OTLP/HTTP exporter (protobuf) posts to ``/v1/traces``: each tool span
    is a step on the deployment topic, a trace one trajectory, each step's observation what
    the trace's previous call returned; a re-export publishes nothing twice."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    base, tokens, bus = receiver
    before = len(_steps(bus))
    exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces",
                                headers={"Authorization": f"Bearer {tokens['producer']}"})
    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    agent_runs(provider)
    assert provider.force_flush()
    events = _steps(bus)[before:]
    assert sorted(e.step.action.tool.name for e in events if e.step.action.tool) == [
        "read_file", "read_file", "send_money"]  # the bus keeps order within a trajectory
    runs: dict[str, list[Any]] = {}
    for e in events:
        runs.setdefault(e.trajectory_id, []).append(e)
    assert len(runs) == 2 and all(t.startswith("otlp/") and len(t) == 5 + 32 for t in runs)
    paid = next(r for r in runs.values() if len(r) == 2)
    assert paid[0].task.startswith("Can you please pay the bill")
    assert paid[0].step.observation.text == paid[0].task
    assert paid[1].step.observation.text == paid[0].step.result.text  # read before it paid
    assert paid[1].step.action.tool.arguments["recipient"] == "US133000000121212121212"
    assert [e.step.index for e in paid] == [0, 1]
    # the exporter retrying the same spans: nothing new on the topic
    assert exporter.export(kept.get_finished_spans()).name == "SUCCESS"
    assert len(_steps(bus)) == before + 3


def test_the_receiver_reads_otlp_json_and_refuses_what_is_not_a_trace(
    receiver: tuple[str, Any, Any], tmp_path: Path,
) -> None:
    """The JSON encoding (what a Collector's file exporter writes), gzip-compressed; bad
    bodies get one clear 4xx; no token, 401."""
    import gzip

    import httpx

    base, tokens, bus = receiver
    path = tmp_path / "traces.json"
    _export(path)
    auth = {"Authorization": f"Bearer {tokens['producer']}"}
    before = len(_steps(bus))
    r = httpx.post(f"{base}/v1/traces", content=gzip.compress(path.read_bytes()),
                   headers={**auth, "Content-Type": "application/json",
                            "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert len(_steps(bus)) == before + 3
    cases = [({"Content-Type": "application/json"}, b"{not json", 400, "not JSON"),
             ({"Content-Type": "application/x-protobuf"}, b"\xff\xff\xff", 400, "protobuf"),
             ({"Content-Type": "text/plain"}, b"hello", 415, "application/x-protobuf"),
             ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"plain", 400,
              "not gzip")]
    for headers, body, code, reason in cases:
        got = httpx.post(f"{base}/v1/traces", content=body, headers={**auth, **headers})
        assert got.status_code == code, got.text
        assert reason in got.json()["detail"]
    assert httpx.post(f"{base}/v1/traces", content=b"{}",
                      headers={"Content-Type": "application/json"}).status_code == 401
