"""Record contracts: lossless serde round trips, and errors that name the field and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.records import (
    RECORD_TYPES,
    Escalation,
    ExecutionEnd,
    GateState,
    L0Step,
    LabelRecord,
    Record,
    RecordError,
    RolloutVerdict,
    Score,
    StepEvent,
    TitoCall,
    Trajectory,
    decode,
    encode,
    read_jsonl,
    step_events,
)

text = st.text(max_size=40)
ident = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_/", min_size=1, max_size=12)
unit = st.floats(0.0, 1.0, allow_nan=False)
finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
label = st.sampled_from([None, 0, 1])
role = st.sampled_from(["main", "main_summary", "sub", "sub_summary"])
source = st.sampled_from(["rollout", "deployment", "benchmark"])
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), text)
json_value = st.recursive(
    json_scalar,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(ident, c, max_size=3),
    max_leaves=6,
)
signals = st.dictionaries(ident, finite, max_size=4)


@st.composite
def steps(draw: st.DrawFn, n: int) -> list[dict]:
    out = []
    for i in range(n):
        action: dict = {"text": draw(text)}
        if draw(st.booleans()):
            action["tool"] = {
                "name": draw(ident),
                "arguments": draw(st.dictionaries(ident, json_value, max_size=3)),
            }
        if draw(st.booleans()):
            action["gui"] = {
                "kind": draw(st.sampled_from(["click", "type", "scroll"])),
                "x": draw(st.integers(0, 1000)),
                "y": draw(st.integers(0, 1000)),
                "text": draw(st.none() | text),
            }
        step = {
            "step_id": f"s{i}-{draw(ident)}",
            "index": i,
            "role": draw(role),
            "observation": {"text": draw(text), "screenshot": draw(st.none() | text)},
            "action": action,
            "label": draw(label),
            "category": draw(st.none() | ident),
        }
        if draw(st.booleans()):
            step["result"] = {"text": draw(text)}
        step.update(
            draw(
                st.dictionaries(st.sampled_from(["x_extra", "latency_ms"]), json_value, max_size=2)
            )
        )
        out.append(step)
    return out


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    obj = {
        "trajectory_id": draw(ident),
        "source": draw(source),
        "task": draw(text),
        "steps": draw(st.integers(0, 4).flatmap(steps)),
        "label": draw(label),
        "meta": draw(st.dictionaries(ident, json_value, max_size=3)),
    }
    obj.update(draw(st.dictionaries(st.just("extra_key"), json_value, max_size=1)))
    return Trajectory.model_validate(obj)


@st.composite
def tito_calls(draw: st.DrawFn) -> TitoCall:
    out = draw(st.lists(st.integers(0, 50_000), max_size=8))
    lp = draw(st.none() | st.lists(finite, min_size=len(out), max_size=len(out)))
    return TitoCall(
        execution_id=draw(ident),
        query_id=draw(ident),
        call_id=draw(ident),
        role=draw(role),
        policy_version=draw(st.none() | st.integers(0, 100)),
        dispatch_version=draw(st.none() | st.integers(0, 100)),
        input_ids=draw(st.lists(st.integers(0, 50_000), max_size=8)),
        output_ids=out,
        output_logprobs=lp,
        input_text=draw(st.none() | text),
        output_text=draw(st.none() | text),
        tool_calls=draw(st.lists(st.dictionaries(ident, json_value, max_size=2), max_size=2)),
        started_at=draw(finite),
        ended_at=draw(finite),
    )


records = st.one_of(
    trajectories(),
    trajectories().flatmap(lambda t: st.sampled_from(step_events(t)) if t.steps else st.nothing()),
    tito_calls(),
    st.builds(
        ExecutionEnd,
        execution_id=ident,
        query_id=ident,
        reward=st.none() | finite,
        timed_out=st.booleans(),
        consumed_version=st.none() | st.integers(0, 99),
        ended_at=finite,
    ),
    st.builds(
        Score,
        trajectory_id=ident,
        step_id=ident,
        tier=st.integers(0, 3),
        score=unit,
        flagged=st.booleans(),
        signals=signals,
        source=source,
        created_at=finite,
    ),
    st.builds(
        Escalation,
        trajectory_id=ident,
        step_id=ident,
        tier=st.integers(1, 3),
        score=unit,
        reason=text,
        signals=signals,
        source=source,
        created_at=finite,
    ),
    st.builds(
        RolloutVerdict,
        execution_id=ident,
        quarantine=st.booleans(),
        score=unit,
        reasons=st.lists(text, max_size=3),
        step_ids=st.lists(ident, max_size=3),
        trajectory_score=st.none() | unit,
    ),
    st.builds(
        LabelRecord,
        trajectory_id=ident,
        step_id=st.none() | ident,
        label=st.sampled_from([0, 1]),
        category=st.none() | ident,
        origin=st.sampled_from(["human", "dataset", "canary", "reviewer"]),
        reviewer=st.none() | ident,
        note=text,
        created_at=finite,
    ),
    st.builds(GateState, group=ident, state=text, created_at=finite),
    trajectories().flatmap(lambda t: st.sampled_from(step_events(t)) if t.steps else st.nothing())
    .flatmap(lambda e: st.builds(L0Step, event=st.just(e), score=unit, escalate=st.booleans(),
                                 signals=signals, produced_ms=st.integers(0, 2**41),
                                 created_at=finite)),
)


@settings(max_examples=300, deadline=None)
@given(records)
def test_every_record_type_round_trips_losslessly(record: Record) -> None:
    data = encode(record)
    back = decode(data, type(record))
    assert back == record
    assert encode(back) == data
    assert json.loads(data)["schema_version"] == 1


def test_every_record_type_is_covered_by_the_round_trip() -> None:
    kinds = {
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
    }
    assert set(RECORD_TYPES.values()) == kinds


def test_extra_keys_of_the_interchange_format_are_kept() -> None:
    raw = {
        "trajectory_id": "t",
        "steps": [
            {
                "step_id": "a",
                "index": 0,
                "action": {"text": "hi", "thought": "hmm"},
                "latency_ms": 12,
            }
        ],
        "team": "red",
    }
    out = json.loads(encode(decode(json.dumps(raw), Trajectory)))
    assert out["team"] == "red"
    assert out["steps"][0]["latency_ms"] == 12
    assert out["steps"][0]["action"]["thought"] == "hmm"


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        (
            '{"trajectory_id": "t", "steps": [{"step_id": "a", "index": 0}]}',
            "steps.0.action",
            "required key is missing",
        ),
        (
            '{"trajectory_id": "t", "steps": [{"step_id": "a", "index": "zero", "action": {}}]}',
            "steps.0.index",
            "valid integer",
        ),
        ('{"trajectory_id": "t", "steps": [], "label": 7}', "label", "input should be 0 or 1"),
        ('{"steps": []}', "trajectory_id", "required key is missing"),
        (
            '{"trajectory_id": "t", "steps": [{"step_id": "a", "index": 0, "action": {}},'
            ' {"step_id": "a", "index": 1, "action": {}}]}',
            "steps",
            "appears twice",
        ),
    ],
)
def test_invalid_lines_name_the_line_and_the_field(
    tmp_path: Path, line: str, field: str, reason: str
) -> None:
    ok = '{"trajectory_id": "ok", "steps": []}'
    path = tmp_path / "t.jsonl"
    path.write_text(f"{ok}\n\n{ok}\n{line}\n")
    with pytest.raises(RecordError) as err:
        list(read_jsonl(path, Trajectory))
    assert err.value.line == 4 and err.value.field == field
    assert str(err.value).startswith(f"line 4: invalid trajectory record: field '{field}':")
    assert reason in str(err.value)


def test_truncated_json_and_unknown_versions_are_clear_errors() -> None:
    with pytest.raises(RecordError, match="not valid JSON"):
        decode(b'{"trajectory_id": "t", "ste', Trajectory)
    with pytest.raises(RecordError, match="unsupported schema_version 9"):
        decode(b'{"schema_version": 9, "trajectory_id": "t", "steps": []}', Trajectory)
    with pytest.raises(RecordError, match="field 'output_logprobs': .*2 values for 1 output_ids"):
        decode(
            b'{"execution_id": "e", "call_id": "c", "input_ids": [], "output_ids": [1],'
            b' "output_logprobs": [0.1, 0.2]}',
            TitoCall,
        )
    with pytest.raises(RecordError, match="field 'bogus': unknown key"):
        decode(
            b'{"trajectory_id": "t", "step_id": "s", "tier": 0, "score": 0.1, "bogus": 1}', Score
        )


def test_harmful_is_any_step_or_the_trajectory_label() -> None:
    def traj(step_labels: list, label: int | None = None) -> Trajectory:
        return Trajectory.model_validate(
            {
                "trajectory_id": "t",
                "label": label,
                "steps": [
                    {"step_id": str(i), "index": i, "action": {}, "label": lab}
                    for i, lab in enumerate(step_labels)
                ],
            }
        )

    assert traj([0, 1, None]).harmful is True
    assert traj([0, 0]).harmful is False
    assert traj([None]).harmful is None
    assert traj([0], label=1).harmful is True
