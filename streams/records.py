"""Record contracts (DESIGN §2): the payloads that cross process boundaries.

Every record is a pydantic model with a ``schema_version``; ``encode`` and
``decode`` are the only JSON serde, and ``decode`` raises one
:class:`RecordError` that names the record kind, the field and (for files) the
line. Trajectory-format records keep unknown keys (the interchange format
allows extra keys and round-trips them); the others reject them, so a typo in
a producer is caught at the edge instead of silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SCHEMA_VERSION = 1
# Bounds checked before a payload is parsed: deeper JSON is refused (a 5,000-deep list
# overflows the parser's stack), and so is a payload over ``max_bytes`` where one is given.
MAX_DEPTH = 64

Role = Literal["main", "main_summary", "sub", "sub_summary"]
Source = Literal["rollout", "deployment", "benchmark"]
Label = Literal[0, 1]


class RecordError(ValueError):
    """A payload that cannot be decoded or validated as the expected record.

    ``str(error)`` is one sentence naming where (line), what (record kind) and
    which field is wrong, so it can go straight into a dead-letter header or a
    CLI error.
    """

    def __init__(
        self, kind: str, reason: str, *, field: str | None = None, line: int | None = None
    ) -> None:
        self.kind = kind
        self.reason = reason
        self.field = field
        self.line = line
        where = f"line {line}: " if line is not None else ""
        at = f" field '{field}':" if field else ""
        super().__init__(f"{where}invalid {kind} record:{at} {reason}")


class Record(BaseModel):
    """Base of every payload: carries its kind and schema version."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    kind: ClassVar[str] = "record"
    schema_version: int = SCHEMA_VERSION

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v > SCHEMA_VERSION or v < 1:
            raise ValueError(
                f"unsupported schema_version {v} (this build reads 1..{SCHEMA_VERSION})"
            )
        return v


class _Open(BaseModel):
    """Interchange-format parts: extra keys are kept and written back."""

    model_config = ConfigDict(extra="allow", frozen=True)


# --- trajectory interchange format (§2.1) ------------------------------------


class ToolCall(_Open):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class GuiAction(_Open):
    kind: str
    x: float | None = None
    y: float | None = None
    text: str | None = None


class Observation(_Open):
    text: str = ""
    screenshot: str | None = None


class Action(_Open):
    text: str = ""
    tool: ToolCall | None = None
    gui: GuiAction | None = None


class Step(_Open):
    step_id: str = Field(min_length=1)
    index: int = Field(ge=0)
    role: Role = "main"
    observation: Observation = Field(default_factory=Observation)
    action: Action
    result: Observation | None = None
    label: Label | None = None
    category: str | None = None


class Trajectory(Record):
    model_config = ConfigDict(extra="allow", frozen=True)
    kind: ClassVar[str] = "trajectory"

    trajectory_id: str = Field(min_length=1)
    source: Source = "benchmark"
    task: str = ""
    steps: list[Step]
    label: Label | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("steps")
    @classmethod
    def _unique_step_ids(cls, steps: list[Step]) -> list[Step]:
        seen: set[str] = set()
        for s in steps:
            if s.step_id in seen:
                raise ValueError(f"step_id {s.step_id!r} appears twice")
            seen.add(s.step_id)
        return steps

    @property
    def harmful(self) -> bool | None:
        """Harmful if any step is labelled 1, or the trajectory is; None if unknown."""
        if self.label is not None:
            return bool(self.label)
        step_labels = [s.label for s in self.steps if s.label is not None]
        if not step_labels:
            return None
        return any(step_labels)


class StepEvent(Record):
    """One step as it streams on a steps topic, with the context to screen it.

    ``final`` marks the trajectory's last step (its label and meta ride on it).
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: ClassVar[str] = "step"

    trajectory_id: str = Field(min_length=1)
    source: Source = "deployment"
    task: str = ""
    step: Step
    final: bool = False
    trajectory_label: Label | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


def step_events(trajectory: Trajectory) -> list[StepEvent]:
    """Split a trajectory into the step events a live agent would have emitted."""
    last = len(trajectory.steps) - 1
    return [
        StepEvent(
            trajectory_id=trajectory.trajectory_id,
            source=trajectory.source,
            task=trajectory.task,
            step=step,
            final=i == last,
            trajectory_label=trajectory.label if i == last else None,
            meta=trajectory.meta if i == last else {},
        )
        for i, step in enumerate(trajectory.steps)
    ]


# --- TITO rollout records (§2.2) ----------------------------------------------


class TitoCall(Record):
    """One model call recorded by a token-in/token-out harness proxy."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: ClassVar[str] = "tito.call"

    execution_id: str = Field(min_length=1)
    query_id: str = ""
    call_id: str = Field(min_length=1)
    role: Role = "main"
    policy_version: int | None = None
    dispatch_version: int | None = None
    input_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float] | None = None
    trainer_logprobs: list[float] | None = None
    input_text: str | None = None
    output_text: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    started_at: float = 0.0
    ended_at: float = 0.0

    @field_validator("output_logprobs", "trainer_logprobs")
    @classmethod
    def _one_per_output(cls, v: list[float] | None, info: Any) -> list[float] | None:
        out = info.data.get("output_ids")
        if v is not None and out is not None and len(v) != len(out):
            raise ValueError(f"has {len(v)} values for {len(out)} output_ids")
        return v


class ExecutionEnd(Record):
    """The end of one execution: its reward, and whether the harness timed out."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: ClassVar[str] = "tito.execution"

    execution_id: str = Field(min_length=1)
    query_id: str = ""
    reward: float | None = None
    timed_out: bool = False
    consumed_version: int | None = None
    ended_at: float = 0.0


# --- monitor outputs ------------------------------------------------------------


class _StepTierRecord(Record):
    """What a tier says about one step. Idempotent by (trajectory_id, step_id, tier)."""

    trajectory_id: str
    step_id: str
    tier: int
    score: float = Field(ge=0.0, le=1.0)
    signals: dict[str, float] = Field(default_factory=dict)
    source: Source = "deployment"
    created_at: float = 0.0

    @property
    def idempotency_key(self) -> str:
        return f"{self.trajectory_id}/{self.step_id}/{self.tier}"


class Score(_StepTierRecord):
    """A tier's score for one step."""

    kind: ClassVar[str] = "score"

    tier: int = Field(ge=0, le=3)
    flagged: bool = False


class Escalation(_StepTierRecord):
    """A step passed up from one tier to the next."""

    kind: ClassVar[str] = "escalation"

    tier: int = Field(ge=1, le=3, description="the tier the step is escalated to")
    reason: str = ""
    trajectory: Trajectory | None = Field(
        default=None, description="the trajectory up to and including the step, for the next tier"
    )


class RolloutVerdict(Record):
    """Per-execution admission verdict a trainer consumes (quarantine or admit)."""

    kind: ClassVar[str] = "verdict.rollout"

    execution_id: str
    quarantine: bool
    score: float = Field(ge=0.0, le=1.0)
    reasons: list[str] = Field(default_factory=list)
    step_ids: list[str] = Field(default_factory=list)
    created_at: float = 0.0
    incomplete: bool = Field(
        default=False,
        description="the execution timed out before its final step: the verdict covers "
        "only the steps that arrived",
    )
    trajectory_score: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="the policy's trajectory verdict over every step's score (None: the "
        "policy has no trajectory section); at or above the trajectory threshold it "
        "quarantines the execution",
    )


class LabelRecord(Record):
    """Ground truth for a step or a whole trajectory (human verdict, dataset, canary)."""

    kind: ClassVar[str] = "label"

    trajectory_id: str
    step_id: str | None = None
    label: Label
    category: str | None = None
    origin: Literal["human", "dataset", "canary", "reviewer"] = "human"
    reviewer: str | None = None
    note: str = ""
    created_at: float = 0.0


class L0Step(Record):
    """A step the L0 stage has scored, on its way to the L1 stage (``vigil.steps.l0``).

    Every step is passed on, escalated or not: the L1 stage rebuilds each trajectory's
    history from them and closes rollout executions; it runs its models only on the steps
    with ``escalate`` (gate 0 passed, by the L0 stage's thresholds)."""

    kind: ClassVar[str] = "step.l0"

    event: StepEvent
    score: float = Field(ge=0.0, le=1.0, description="gate 0's probability of harm")
    escalate: bool = False
    signals: dict[str, float] = Field(default_factory=dict, description="the L0 signals")
    produced_ms: int = Field(default=0, description="when the step was produced (broker time)")
    created_at: float = 0.0

    @property
    def idempotency_key(self) -> str:
        return f"{self.event.trajectory_id}/{self.event.step.step_id}/l0"


class GateState(Record):
    """The screen stage's live gate sketches (``monitor stream --adapt``), saved to the gates
    topic every few seconds and read back on a restart (``monitor.adaptive``)."""

    kind: ClassVar[str] = "gate.state"

    group: str = Field(min_length=1)  # the screen stage's consumer group
    state: str  # LiveGates.to_bytes(), as text
    created_at: float = 0.0


RECORD_TYPES: dict[str, type[Record]] = {
    t.kind: t
    for t in (
        Trajectory,
        StepEvent,
        TitoCall,
        ExecutionEnd,
        Score,
        Escalation,
        RolloutVerdict,
        LabelRecord,
        GateState,
        L0Step,
    )
}

R = TypeVar("R", bound=Record)


# --- serde --------------------------------------------------------------------


def encode(record: Record) -> bytes:
    """Compact JSON, UTF-8. Defaults are written so every record carries its version."""
    return record.model_dump_json(exclude_none=False).encode()


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


def validate(obj: Any, model: type[R], *, line: int | None = None) -> R:
    """Validate a parsed JSON value as ``model``; raise one :class:`RecordError`."""
    if not isinstance(obj, dict):
        raise RecordError(
            model.kind, f"expected a JSON object, got {type(obj).__name__}", line=line
        )
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        field = _field_path(err["loc"]) or None
        msg = err["msg"][:1].lower() + err["msg"][1:]
        if err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise RecordError(model.kind, f"{msg}{more}", field=field, line=line) from None
    except (ValueError, TypeError, RecursionError) as e:  # a validator's own failure
        raise RecordError(model.kind, f"{type(e).__name__}: {str(e)[:200]}", line=line) from None


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(data: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings do
    not count). Linear in the input, and free for a text with at most ``limit`` opening
    brackets, whose depth cannot exceed the limit (the answer is then that count)."""
    opened = data.count(b"[") + data.count(b"{")
    if opened <= limit:
        return opened
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    steps = (1 if b in (0x5B, 0x7B) else -1 for b in brackets)  # [ {  vs  ] }
    return max(accumulate(steps, initial=0))


# an escaped surrogate (\uD800-\uDFFF), or one written as raw bytes (ED A0-BF ..: not UTF-8,
# but json.loads decodes bytes with "surrogatepass")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


def _lone_surrogate(obj: Any) -> str | None:
    """The first string (key or value) in ``obj`` that UTF-8 cannot encode, if any."""
    todo = [obj]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
        elif isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return x
    return None


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"number {text[:40]} is out of range")
    return x


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(
    data: bytes | str,
    kind: str,
    *,
    line: int | None = None,
    max_bytes: int | None = None,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Parse one JSON text, bounded: over ``max_bytes`` or nested deeper than
    ``max_depth`` is refused before parsing; NaN, Infinity and numbers out of float range
    are refused (they are not JSON, and no score can be computed from them). Every
    failure is one :class:`RecordError`; nothing else escapes."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if max_bytes is not None and len(raw) > max_bytes:
        raise RecordError(kind, f"payload of {len(raw)} bytes exceeds the limit of "
                                f"{max_bytes} bytes", line=line)
    depth = nesting_depth(raw, max_depth)
    if depth > max_depth:
        raise RecordError(kind, f"nested {depth} levels deep, over the limit of {max_depth}",
                          line=line)
    try:
        obj = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RecordError(kind, f"not valid JSON ({e})", line=line) from None
    except UnicodeDecodeError as e:
        raise RecordError(kind, f"not valid UTF-8 ({e.reason} at byte {e.start})",
                          line=line) from None
    except (ValueError, RecursionError, MemoryError) as e:  # huge ints, NaN, out of range
        raise RecordError(kind, f"not valid JSON ({type(e).__name__}: {str(e)[:200]})",
                          line=line) from None
    if _SURROGATE.search(raw) and (bad := _lone_surrogate(obj)) is not None:
        raise RecordError(kind, f"a string holds an unpaired UTF-16 surrogate ({ascii(bad)[:60]})",
                          line=line)
    return obj


def decode(
    data: bytes | str, model: type[R], *, line: int | None = None, max_bytes: int | None = None
) -> R:
    """Parse and validate one JSON payload as ``model``; any failure is one
    :class:`RecordError` (the dead-letter reason), never another exception."""
    return validate(parse_json(data, model.kind, line=line, max_bytes=max_bytes), model, line=line)


def read_jsonl(path: str | Path, model: type[R], *,
               rejected: Callable[[int, bytes, RecordError], None] | None = None
               ) -> Iterator[R]:
    """Yield records from a JSON Lines file; blank lines are skipped.

    Errors name the file and the line: ``trajs.jsonl: line 3: invalid trajectory
    record: field 'steps.0.action' required key is missing``. ``rejected``: a line that
    cannot be read is handed to it (line number, the line's bytes, the error) and skipped,
    as the stream dead-letters a record and goes on; without it the first such line raises.
    """
    p = Path(path)
    with p.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield decode(raw, model, line=n)
            except RecordError as e:
                if rejected is None:
                    raise
                rejected(n, raw, e)


def write_jsonl(path: str | Path, records: Iterable[Record]) -> int:
    n = 0
    with Path(path).open("wb") as f:
        for r in records:
            f.write(encode(r) + b"\n")
            n += 1
    return n


def sniff_kind(obj: dict[str, Any]) -> type[Record]:
    """Which record a parsed JSON object is, by its required keys (for mixed files)."""
    if "steps" in obj and "trajectory_id" in obj:
        return Trajectory
    if "call_id" in obj or "output_ids" in obj:
        return TitoCall
    if "execution_id" in obj and ("reward" in obj or "timed_out" in obj):
        return ExecutionEnd
    if "step" in obj and "trajectory_id" in obj:
        return StepEvent
    if "execution_id" in obj:
        return TitoCall
    return Trajectory
