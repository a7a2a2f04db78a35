"""``POST /v1/traces``: an OTLP/HTTP trace receiver, so an agent instrumented with
OpenTelemetry (its SDK's OTLP exporter, or a Collector's ``otlphttp`` exporter) streams its
tool calls into vigil with no code of ours.

Each request is an ``ExportTraceServiceRequest``, binary protobuf
(``application/x-protobuf``) or JSON (``application/json``), gzip-compressed or not. Its tool
spans (GenAI ``execute_tool``, OpenInference ``TOOL``: :mod:`monitor.integrations.otlp`)
become step events on the deployment steps topic, one trajectory per trace
(``otlp/<trace id>``), where the stream's tiers screen them as any other deployment traffic.
A trace's spans may come in many exports; a retried export publishes nothing twice (the
service remembers the last few thousand traces' span ids). Producer tokens
(``OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status

from monitor.service.api import responses
from monitor.service.deps import HarnessDep
from monitor.service.schemas import Problem

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["ingest"], responses=responses.AUTH)

PROTOBUF, JSON = "application/x-protobuf", "application/json"


def _memory(request: Request) -> Any:
    from monitor.integrations.otlp import TraceMemory

    got = getattr(request.app.state, "otlp_traces", None)
    if got is None:
        got = request.app.state.otlp_traces = TraceMemory()
    return got


def _decode(body: bytes, kind: str) -> dict[str, Any]:
    """The request as OTLP JSON; 400 naming what is wrong."""
    if kind == JSON:
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                f"the body is not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "the body is not an "
                                "ExportTraceServiceRequest (a JSON object with resourceSpans)")
        return doc
    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        msg = ExportTraceServiceRequest.FromString(body)
    except DecodeError as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"the body is not an ExportTraceServiceRequest protobuf: {e}") from None
    return MessageToDict(msg)


def _inflate(body: bytes, limit: int) -> bytes:
    """A gzip body, decompressed up to ``limit`` bytes (413 past it: a small bomb stays small)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"the body is not gzip: {e}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                            f"the body inflates past {limit} bytes (VIGIL_PAGING_MAX_BODY_BYTES)")
    return out


@router.post(
    "/traces",
    responses={**responses.BAD_REQUEST,
               415: {"model": Problem, "description": "not protobuf or JSON"},
               503: {"model": Problem, "description": "no broker to publish the steps to"}},
    summary="Receive OTLP/HTTP traces: tool spans become deployment steps",
)
async def receive_traces(request: Request, _: HarnessDep) -> Response:
    """An OTLP/HTTP export (protobuf or JSON): each new tool span is published as a step
    event on the deployment steps topic; the answer is an empty
    `ExportTraceServiceResponse` in the request's encoding."""
    from monitor.integrations.otlp import step_events_from_otlp
    from streams.config import Topics
    from streams.processor import publish_record

    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in (PROTOBUF, JSON):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                            f"content type {kind or '(none)'!r}: OTLP/HTTP sends {PROTOBUF} or "
                            f"{JSON}")
    bus = getattr(request.app.state, "bus", None)
    if bus is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "no Kafka is configured "
                            "(VIGIL_KAFKA_BOOTSTRAP_SERVERS): traces would have nowhere to go")
    limit = request.app.state.settings.max_body_bytes
    body = await request.body()
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        body = _inflate(body, limit)
    elif encoding not in ("identity", ""):
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                            f"content encoding {encoding!r}: expected gzip or none")
    doc = _decode(body, kind)
    warnings: list[str] = []
    try:
        events = step_events_from_otlp(doc, _memory(request), warn=warnings.append)
    except (ValueError, TypeError, AttributeError) as e:  # a span the records refuse
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"a span could not be read as a step: {str(e)[:300]}") from None
    for w in warnings:
        log.warning("OTLP: %s", w)
    topic = Topics().steps_deployment

    def publish() -> None:
        for e in events:
            publish_record(bus, topic, e, key=e.trajectory_id)
        bus.flush()

    try:
        await asyncio.to_thread(publish)
    except Exception as e:  # noqa: BLE001 - the exporter retries on 503
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                            f"could not publish the steps ({type(e).__name__}); retry") from None
    if kind == JSON:
        return Response("{}", media_type=JSON)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)
