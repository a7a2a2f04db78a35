"""What every integration shares: the default screener, a tool call as an :class:`Action`,
a run's calls so far as the :class:`Trajectory` a new call is judged in, and the reason a
stopped call gives the model."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from monitor.pipeline import ActionCheck
from streams.records import Action, Observation, Step, ToolCall, Trajectory

Screen = Callable[[Trajectory, Action], ActionCheck]
MAX_STEPS = 32  # the screeners read the last few steps; a long session keeps memory bounded
MAX_RESULT_CHARS = 20_000

_DEFAULT: dict[str, Screen] = {}


def default_screen(policy: str | None = None) -> Screen:
    """The default policy's screener (L0 + L1), loaded once per process."""
    key = policy or ""
    if key not in _DEFAULT:
        from monitor.defaults import ensure_policy
        from monitor.pipeline import load_screener

        _DEFAULT[key] = load_screener(ensure_policy(policy), reviewer=False).check_action
    return _DEFAULT[key]


def tool_action(name: str, arguments: Any, text: str = "", **extra: Any) -> Action:
    """A tool call as vigil's :class:`Action`: arguments given as a JSON string are parsed
    (``{"raw": ...}`` where they do not parse); a value that is not an object is
    ``{"value": ...}``; ``extra`` keys travel with the call (e.g. the MCP ``server``, which
    tool rules match on)."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            arguments = {"raw": arguments}
    args = dict(arguments) if isinstance(arguments, dict) else (
        {} if arguments is None else {"value": arguments})
    return Action(text=text, tool=ToolCall.model_validate({"name": name, "arguments": args,
                                                           **extra}))


def trajectory_from_calls(run_id: str, task: str, calls: Iterable[tuple[Action, str]],
                          *, meta: dict[str, Any] | None = None) -> Trajectory:
    """The run so far: each call with what it returned is a step, the last ``MAX_STEPS``;
    a step's observation is what the step before returned (the first's: the task)."""
    steps: list[Step] = []
    seen = Observation(text=task)
    for action, output in list(calls)[-MAX_STEPS:]:
        result = Observation(text=output[:MAX_RESULT_CHARS])
        steps.append(Step(step_id=str(len(steps)), index=len(steps), observation=seen,
                          action=action, result=result))
        seen = result
    return Trajectory(trajectory_id=run_id, source="deployment", task=task, steps=steps,
                      meta=meta or {})


def stop_reason(name: str, got: ActionCheck) -> str:
    """What the model reads instead of the tool's output when vigil stopped the call."""
    return (f"vigil stopped this call to {name}: the safety screen "
            f"{'blocked' if got.decision == 'block' else 'escalated'} it (score "
            f"{got.score:.3f}, tier L{got.tier}" + (f"; {got.rule}" if got.rule else "")
            + "); it was not run")
