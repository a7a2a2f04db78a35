"""OpenTelemetry GenAI traces as vigil trajectories (``monitor ingest otlp``, and
``monitor screen`` on an OTLP JSON file).

An agent instrumented with OpenTelemetry exports spans; OTLP JSON (the
``ExportTraceServiceRequest`` of the OTLP/HTTP JSON encoding, or the Collector's file
exporter: one request per line) carries them as ``resourceSpans[].scopeSpans[].spans[]``.
A trace is one trajectory; its steps are its tool spans, in start order:

* GenAI semantic conventions: a span whose ``gen_ai.operation.name`` is ``execute_tool`` (or
  named ``execute_tool ...``): ``gen_ai.tool.name``, ``gen_ai.tool.call.arguments``,
  ``gen_ai.tool.call.result``; the task is the first user message of the trace's first
  ``chat`` / ``invoke_agent`` span (``gen_ai.input.messages``);
* OpenInference: ``openinference.span.kind`` ``TOOL`` with ``tool.name``, ``input.value``,
  ``output.value``; the task from the first ``LLM`` / ``AGENT`` span's ``input.value``.

Instrumentations leave message and argument content out unless told to record it: a trace
whose tool spans carry no arguments or results gets one warning naming the setting
(:data:`CAPTURE_SETTING`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streams.records import Action, Observation, Step, ToolCall, Trajectory

CAPTURE_SETTING = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true"
MAX_TEXT = 20_000


def _value(v: Mapping[str, Any]) -> Any:
    """An OTLP ``AnyValue`` (JSON encoding) as a Python value."""
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: _value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    return None


def _attrs(span: Mapping[str, Any]) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in span.get("attributes", [])
            if isinstance(a, Mapping) and "key" in a}


def spans_of(request: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    """Every span of one ``ExportTraceServiceRequest`` (JSON), attributes decoded."""
    for rs in request.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                yield {"trace": hex_id(s.get("traceId")), "span": hex_id(s.get("spanId")),
                       "name": str(s.get("name", "")),
                       "start": int(s.get("startTimeUnixNano", 0) or 0), "attrs": _attrs(s)}


def hex_id(value: Any) -> str:
    """A trace or span id as OTLP JSON writes it (lowercase hex), from that or from the
    base64 that protobuf's JSON mapping gives the same bytes."""
    text = str(value or "")
    if len(text) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    import base64
    import binascii

    try:
        return base64.b64decode(text, validate=True).hex()
    except (binascii.Error, ValueError):
        return text


def _first_user_text(messages: Any) -> str:
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            return messages
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, Mapping) and m.get("role") == "user":
            parts = m.get("parts") or m.get("content") or []
            if isinstance(parts, str):
                return parts
            return " ".join(str(p.get("content", p.get("text", ""))) for p in parts
                            if isinstance(p, Mapping))
    return ""


def _tool(span: Mapping[str, Any]) -> tuple[Action, str, bool] | None:
    """A tool span as (its call, what it returned, whether it carries no content); None for
    another span. Arguments given as a JSON string are parsed (``{"input": ...}`` where they
    do not parse); a value that is not an object is ``{"value": ...}``."""
    a = span["attrs"]
    if a.get("gen_ai.operation.name") == "execute_tool" or span["name"].startswith(
            "execute_tool"):
        name = a.get("gen_ai.tool.name") or span["name"].removeprefix("execute_tool").strip()
        raw, result = a.get("gen_ai.tool.call.arguments"), a.get("gen_ai.tool.call.result")
    elif a.get("openinference.span.kind") == "TOOL":
        name, raw, result = a.get("tool.name") or span["name"], a.get("input.value"), a.get(
            "output.value")
    else:
        return None
    args: Any = raw
    if isinstance(raw, str):
        try:
            args = json.loads(raw)
        except ValueError:
            args = {"input": raw}
    action = Action(tool=ToolCall(name=str(name), arguments=args if isinstance(args, dict)
                                  else {"value": args}))
    text = str(result or "")
    return action, text[:MAX_TEXT], raw is None and not text


def _by_trace(requests: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The spans of ``requests`` by trace, each trace's in start order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        for s in spans_of(r):
            out.setdefault(s["trace"], []).append(s)
    for spans in out.values():
        spans.sort(key=lambda s: s["start"])
    return out


def _warn_bare(bare: int, warn: Callable[[str], None] | None) -> None:
    if bare and warn is not None:
        warn(f"{bare} tool span(s) carry no arguments or result: the instrumentation records "
             f"no content; set {CAPTURE_SETTING} (or your instrumentation's equivalent)")


def _task(span: Mapping[str, Any]) -> str:
    a = span["attrs"]
    if a.get("gen_ai.operation.name") in ("chat", "invoke_agent", "text_completion"):
        return _first_user_text(a.get("gen_ai.input.messages"))
    if a.get("openinference.span.kind") in ("LLM", "AGENT", "CHAIN"):
        return _first_user_text(a.get("input.value"))
    return ""


def trajectories_from_otlp(requests: Iterable[Mapping[str, Any]], *,
                           warn: Callable[[str], None] | None = None) -> list[Trajectory]:
    """One trajectory per trace of ``requests`` with at least one tool span."""
    out, bare = [], 0
    for trace, spans in _by_trace(requests).items():
        task = next((t for t in map(_task, spans) if t), "")[:MAX_TEXT]
        steps: list[Step] = []
        seen = Observation(text=task)
        for got in filter(None, map(_tool, spans)):
            action, result, empty = got
            bare += empty
            res = Observation(text=result)
            steps.append(Step(step_id=str(len(steps)), index=len(steps), observation=seen,
                              action=action, result=res))
            seen = res
        if steps:
            out.append(Trajectory(trajectory_id=f"otlp/{trace}", source="deployment",
                                  task=task, steps=steps))
    _warn_bare(bare, warn)
    return out


def is_otlp(obj: Any) -> bool:
    """Whether a parsed JSON line is an OTLP trace request rather than a trajectory."""
    return isinstance(obj, Mapping) and "resourceSpans" in obj


def read_otlp_file(path: Any) -> list[dict[str, Any]]:
    """The trace requests of an OTLP JSON file: one per line (the Collector's file
    exporter), or one JSON document."""
    from pathlib import Path

    text = Path(path).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except ValueError:
        out = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}: line {n}: not OTLP JSON ({e})") from None
        return out
    return whole if isinstance(whole, list) else [whole]


def sniff_otlp(path: Any) -> bool:
    """Whether the file's first JSON value is an OTLP trace request."""
    from pathlib import Path

    with Path(path).open("rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"{") and b'"resourceSpans"' in head


class TraceMemory:
    """What a receiver remembers of the traces it has turned into step events, bounded (the
    last ``max_traces`` traces): each trace's task, its steps so far, the last result (the
    next step's observation) and the span ids already published (a retried export publishes
    nothing twice)."""

    def __init__(self, max_traces: int = 4096, max_spans: int = 1024) -> None:
        from collections import OrderedDict

        self.max_traces, self.max_spans = max_traces, max_spans
        self._traces: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, trace: str) -> dict[str, Any]:
        got = self._traces.pop(trace, None) or {"task": "", "n": 0, "last": None,
                                                "seen": {}}
        self._traces[trace] = got
        while len(self._traces) > self.max_traces:
            self._traces.popitem(last=False)
        return got


def step_events_from_otlp(request: Mapping[str, Any], memory: TraceMemory, *,
                          warn: Callable[[str], None] | None = None) -> list[Any]:
    """The tool spans of one ``ExportTraceServiceRequest`` (JSON) as
    :class:`~streams.records.StepEvent` records for the deployment steps topic, in start
    order within each trace: trajectory ``otlp/<trace id>`` (as :func:`trajectories_from_otlp`
    names it), step id the span id (stable when an export is retried), the observation what
    the trace's previous tool span returned (the first's: the task). Spans of one trace that
    arrive in several exports continue the same trajectory (``memory``)."""
    from streams.records import StepEvent

    out: list[StepEvent] = []
    bare = 0
    for trace, spans in _by_trace([request]).items():
        state = memory.get(trace)
        state["task"] = state["task"] or next((t for t in map(_task, spans) if t), "")[:MAX_TEXT]
        for s in spans:
            got = _tool(s)
            if got is None or s["span"] in state["seen"]:
                continue
            action, result, empty = got
            bare += empty
            seen = Observation(text=state["last"] if state["last"] is not None
                               else state["task"])
            step = Step(step_id=s["span"] or str(state["n"]), index=state["n"], observation=seen,
                        action=action, result=Observation(text=result))
            out.append(StepEvent(trajectory_id=f"otlp/{trace}", source="deployment", step=step,
                                 task=state["task"],
                                 meta={"otlp_trace_id": trace, "otlp_span_id": s["span"]}))
            state["n"] += 1
            state["last"] = result
            state["seen"][s["span"]] = None
            while len(state["seen"]) > memory.max_spans:
                state["seen"].pop(next(iter(state["seen"])))
    _warn_bare(bare, warn)
    return out
