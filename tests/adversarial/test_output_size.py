"""Outputs that would not fit the bus: an escalation's trajectory is cut to fit, keeping the
step it escalates; and an output that still does not fit goes to the dead-letter topic in
its place, with the reason, instead of stopping the stage."""

from __future__ import annotations

from monitor.stream.history import fit_trajectory
from streams.bus import InMemoryBus
from streams.processor import H_DLQ_REASON, H_DLQ_SIZE, Output, StreamProcessor, publish_record
from streams.records import Record, StepEvent, Trajectory


def _trajectory(n: int, text_chars: int) -> Trajectory:
    return Trajectory.model_validate({"trajectory_id": "t", "task": "pay the rent", "steps": [
        {"step_id": f"s{i}", "index": i, "observation": {"text": "x" * text_chars},
         "action": {"text": f"act {i}"}} for i in range(n)]})


def test_an_escalated_trajectory_is_cut_to_fit_and_keeps_its_last_step() -> None:
    small = _trajectory(3, 100)
    assert fit_trajectory(small, 100_000) is small
    big = fit_trajectory(_trajectory(5, 300_000), 512 * 1024)
    assert len(big.model_dump_json()) <= 512 * 1024
    assert big.steps[-1].step_id == "s4" and big.meta["vigil_cut"] is True
    huge = fit_trajectory(_trajectory(2, 3_000_000), 512 * 1024)
    assert len(huge.model_dump_json()) <= 512 * 1024
    assert [s.step_id for s in huge.steps] == ["s1"]
    assert huge.steps[0].observation.text.endswith("[... cut by vigil]")


def test_an_output_too_large_for_the_bus_is_dead_lettered_in_its_place() -> None:
    bus = InMemoryBus(partitions=1, max_record_bytes=64 * 1024)
    ok = StepEvent.model_validate({"trajectory_id": "a", "step": {
        "step_id": "s", "index": 0, "action": {"text": "hello"}}})
    publish_record(bus, "in", ok, key="a")
    publish_record(bus, "in", ok.model_copy(update={"trajectory_id": "b"}), key="b")

    def handle(rec: Record, _m: object) -> list[Output]:
        assert isinstance(rec, StepEvent)
        grow = rec.trajectory_id == "b"  # b's output is 100 KB: over the bus's limit
        out = rec.model_copy(update={"task": "y" * 100_000}) if grow else rec
        return [Output("out", out, key=rec.trajectory_id)]

    proc = StreamProcessor(bus, {"in": StepEvent}, "g", handle, deadletter_topic="dlq",
                           deadletter_max_bytes=32 * 1024)
    proc.run(max_messages=2, poll_timeout_s=0.01)
    assert [m.key for m in bus.read_all("out")] == ["a"]
    (dead,) = bus.read_all("dlq")
    assert (dead.header(H_DLQ_REASON) or "").startswith("output:")
    assert len(dead.value) == 32 * 1024 and int(dead.header(H_DLQ_SIZE) or 0) > 100_000
    assert bus._committed["g"] == {("in", 0): 2}
