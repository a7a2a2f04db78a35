"""The run-so-far every gate judges a call in: bounded, and each step id names one step
however long the run grows (the stream dead-letters a different step under an id it saw)."""

from __future__ import annotations

from monitor.integrations.common import MAX_STEPS, tool_action, trajectory_from_calls
from monitor.integrations.mcp_proxy import McpSession


def test_a_long_run_keeps_its_last_steps_under_the_ids_they_had() -> None:
    calls = [(tool_action("read", {"n": i}), f"out {i}") for i in range(MAX_STEPS + 8)]
    t = trajectory_from_calls("run-1", "the task", calls)
    assert len(t.steps) == MAX_STEPS
    assert [s.index for s in t.steps] == list(range(8, MAX_STEPS + 8))
    assert [s.step_id for s in t.steps][:2] == ["8", "9"]
    assert t.steps[0].observation.text == "out 7"  # what the call before it returned
    short = trajectory_from_calls("run-2", "the task", calls[:2])
    assert short.steps[0].observation.text == "the task"
    assert short.steps[1].observation.text == "out 0"


def test_arguments_of_any_shape_become_an_action() -> None:
    assert tool_action("f", '{"a": 1}').tool.arguments == {"a": 1}  # type: ignore[union-attr]
    assert tool_action("f", "not json").tool.arguments == {"raw": "not json"}  # type: ignore[union-attr]
    assert tool_action("f", [1, 2]).tool.arguments == {"value": [1, 2]}  # type: ignore[union-attr]
    assert tool_action("f", None).tool.arguments == {}  # type: ignore[union-attr]
    call = tool_action("git_commit", {}, server="git").tool
    assert call is not None and getattr(call, "server", None) == "git"


def test_an_mcp_session_numbers_its_steps_past_the_cut() -> None:
    session = McpSession(server="git")
    for i in range(MAX_STEPS + 3):
        session.record(session.action("git_status", {"i": i}), f"clean {i}")
    ids = [s.step_id for s in session.trajectory().steps]
    assert len(ids) == MAX_STEPS and len(set(ids)) == MAX_STEPS
    assert ids[-1] == str(MAX_STEPS + 2)
