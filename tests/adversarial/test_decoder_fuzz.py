"""The record decoder is total: any bytes become a valid record or one RecordError.

Property tests (hypothesis) over arbitrary bytes, over JSON-shaped text built to be
odd (deep, huge numbers, NaN, lone surrogates), and over valid records with one field
mutated; and the processor on the in-process bus: a batch of any bytes never raises,
each bad input is dead-lettered exactly once, and the commit reaches the end.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.bus import InMemoryBus
from streams.processor import H_DLQ_REASON, Output, StreamProcessor
from streams.records import (
    MAX_DEPTH,
    RECORD_TYPES,
    RecordError,
    StepEvent,
    TitoCall,
    Trajectory,
    decode,
    encode,
)

MODELS = list(RECORD_TYPES.values())


def _decodes_or_refuses(data: bytes | str, model: type) -> None:  # type: ignore[type-arg]
    try:
        rec = decode(data, model)
    except RecordError as e:
        assert str(e).startswith(("invalid", "line")), str(e)
        return
    # a record that decodes can be written back and read again unchanged
    assert decode(encode(rec), model) == rec


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from(MODELS))
def test_any_bytes_decode_or_raise_one_record_error(data: bytes, model: type) -> None:  # type: ignore[type-arg]
    _decodes_or_refuses(data, model)


json_leaf = st.one_of(
    st.none(), st.booleans(), st.text(max_size=20),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
)
json_value = st.recursive(
    json_leaf,
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=20,
)
odd_fragment = st.sampled_from([
    "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, '"\\ud800"', '"\\udfff"',
    "[" * 5000 + "]" * 5000, "{" * 100, '"' + "x" * 10_000 + '"', "\x00", "\ufeff",
])


@st.composite
def odd_json(draw: st.DrawFn) -> str:
    """A valid step event or TITO call with one value swapped for an odd fragment."""
    base = draw(st.sampled_from([
        {"trajectory_id": "t", "step": {"step_id": "s", "index": 0, "action": {"text": "a"}}},
        {"execution_id": "e", "call_id": "c", "input_ids": [1], "output_ids": [2],
         "output_logprobs": [-0.1]},
    ]))
    text = json.dumps(base)
    keys = [k for k in ("\"a\"", "0", "[1]", "[2]", "-0.1", "\"t\"", "\"e\"") if k in text]
    target = draw(st.sampled_from(keys))
    return text.replace(target, draw(st.one_of(odd_fragment,
                                                json_value.map(json.dumps))), 1)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(odd_json(), st.sampled_from([StepEvent, TitoCall, Trajectory]))
def test_odd_json_decodes_or_raises_one_record_error(text: str, model: type) -> None:  # type: ignore[type-arg]
    _decodes_or_refuses(text, model)
    _decodes_or_refuses(text.encode("utf-8", "surrogatepass"), model)


@pytest.mark.parametrize("payload, says", [
    (b"[" * 5000 + b"]" * 5000, "nested 5000 levels deep"),
    (b'{"trajectory_id": "t", "step": ' * 70 + b"1" + b"}" * 70, f"limit of {MAX_DEPTH}"),
    (b'{"trajectory_id": "t", "score": NaN}', "NaN is not a JSON number"),
    (b'{"trajectory_id": "t", "score": 1e999}', "out of range"),
    (b'{"trajectory_id": "' + b"9" * 6000 + b'"}', "step"),  # a long string is fine JSON
    (b'{"trajectory_id": ' + b"9" * 6000 + b"}", "digits"),
    (b'{"trajectory_id": "t", "meta": {"k": "\\ud800"}, "step": {}}', "surrogate"),
    # the same surrogate as raw bytes (not UTF-8; json.loads would pass it through)
    (b'{"trajectory_id": "t", "meta": {"k": "\xed\xa0\x80"}, "step": {}}', "surrogate"),
    (b"\xff\xfe\x00", "not valid"),
])
def test_each_odd_payload_gets_a_reason_that_names_it(payload: bytes, says: str) -> None:
    with pytest.raises(RecordError, match=says):
        decode(payload, StepEvent)


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    code = "def f(x): return [[[[" * 40 + "]]]]" * 40
    ev = StepEvent.model_validate({"trajectory_id": "t", "step": {
        "step_id": "s", "index": 0, "action": {"text": code}, "observation": {"text": code}}})
    assert decode(encode(ev), StepEvent) == ev


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.binary(max_size=300), odd_json().map(str.encode)),
                min_size=1, max_size=40))
def test_the_processor_dead_letters_each_bad_input_once_and_commits_to_the_end(
    payloads: list[bytes],
) -> None:
    bus = InMemoryBus(partitions=2)
    for i, p in enumerate(payloads):
        bus.publish("in", p, key=f"k{i}")

    def handle(rec: object, _m: object) -> list[Output]:
        assert isinstance(rec, StepEvent)
        return [Output("out", rec, key=rec.trajectory_id)]

    proc = StreamProcessor(bus, {"in": StepEvent}, "g", handle, deadletter_topic="dlq")
    stats = proc.run(max_messages=len(payloads), poll_timeout_s=0.01)
    assert stats.consumed == len(payloads)
    good = sum(1 for p in payloads if _valid(p))
    assert len(bus.read_all("out")) == good
    dead = bus.read_all("dlq")
    assert len(dead) == len(payloads) - good
    assert all(m.header(H_DLQ_REASON) for m in dead)
    assert bus._committed["g"] == {("in", p): n for p, n in enumerate(bus.end_offsets("in")) if n}


def _valid(p: bytes) -> bool:
    try:
        decode(p, StepEvent)
    except RecordError:
        return False
    return True
