"""vigil as a tool guardrail of an OpenAI Agents SDK agent: ``guard(agent)``.

Every function tool of the agent gets a tool *input* guardrail that screens the call before
the tool runs (L0 and L1 with the policy's tool rules, as ``POST /v1/screen``), in the
trajectory the run has so far: the user's input is the task, and the turn's earlier tool
calls and their outputs are the steps before it. Allow: the tool runs. Block (and, unless
``escalate="allow"``, escalate): the tool does not run and the model gets the reason as
the tool's output (``reject_content``), or with ``raise_on_block=True`` the run stops with
the SDK's ``ToolInputGuardrailTripwireTriggered``::

    from monitor.integrations.openai_agents import guard
    agent = guard(Agent(name="assistant", tools=[...]))

``screen``: any ``(Trajectory, Action) -> ActionCheck`` (default: the screener of the
default policy, loaded once, ``reviewer=False``). With a broker configured, each screened
call goes to the deployment steps topic (an allowed one with its output, from a tool
*output* guardrail), for the async tiers.
"""

from __future__ import annotations

import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from monitor.integrations.common import (
    Screen,
    StepStream,
    default_screen,
    stop_reason,
    stops,
    tool_action,
    trajectory_from_calls,
)
from monitor.pipeline import ActionCheck
from streams.records import Action, Trajectory

__all__ = ["Screen", "default_screen", "guard", "trajectory_of"]

def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(c.get("text", "") if isinstance(c, dict) else c) for c in content)
    return str(content or "")


def trajectory_of(turn_input: Sequence[Any], run_id: str = "agents-run") -> Trajectory:
    """The run so far as a trajectory: the first user message is the task, each earlier
    ``function_call`` with its ``function_call_output`` a step."""
    task = ""
    calls: dict[str, dict[str, Any]] = {}
    outputs: dict[str, str] = {}
    for item in turn_input:
        d = item if isinstance(item, dict) else getattr(item, "model_dump", lambda: {})()
        kind = d.get("type")
        if not task and d.get("role") == "user":
            task = _text(d.get("content"))
        elif kind == "function_call":
            calls[str(d.get("call_id"))] = d
        elif kind == "function_call_output":
            outputs[str(d.get("call_id"))] = _text(d.get("output"))
    return trajectory_from_calls(run_id, task, (
        (tool_action(str(d.get("name")), d.get("arguments")), outputs.get(cid, ""))
        for cid, d in calls.items()))


MAX_RUNS = 1024  # runs whose calls a guard remembers


def guard(agent: Any, *, screen: Screen | None = None, policy: str | None = None,
          raise_on_block: bool = False, escalate: Literal["reject", "allow"] = "reject",
          stream: StepStream | Literal[False] | None = None) -> Any:
    """``agent`` with vigil's guardrail on each of its function tools (returned as is).
    ``stream``: where each screened call goes with its output, for the async tiers (default:
    the deployment steps topic where ``VIGIL_KAFKA_BOOTSTRAP_SERVERS`` is set; ``False``:
    nowhere); a run is one trajectory."""
    from agents import (
        FunctionTool,
        ToolGuardrailFunctionOutput,
        tool_input_guardrail,
        tool_output_guardrail,
    )

    out = StepStream.from_env() if stream is None else stream or None
    # the SDK's turn_input holds the run's input, not the calls made since: the guard keeps
    # each run's calls and outputs itself (one run: one usage counter object)
    # (the usage object is unhashable: keyed by its id, checked against a weak reference,
    # as ids are reused once an object is gone; the last MAX_RUNS runs are kept)
    runs: OrderedDict[int, tuple[Any, str, list[tuple[Action, str]]]] = OrderedDict()
    screened: dict[str, tuple[Trajectory, Action, ActionCheck]] = {}  # call id -> check

    def run_of(ctx: Any) -> tuple[str, list[tuple[Action, str]]]:
        usage = ctx.usage
        got = runs.get(id(usage))
        if got is None or got[0]() is not usage:
            got = runs[id(usage)] = (weakref.ref(usage), f"agents-{uuid.uuid4().hex[:12]}", [])
            while len(runs) > MAX_RUNS:
                runs.popitem(last=False)
        return got[1], got[2]

    def so_far(ctx: Any) -> Trajectory:
        rid, calls = run_of(ctx)
        given = trajectory_of(list(ctx.turn_input or []), rid)
        return trajectory_from_calls(rid, given.task, [
            *((s.action, s.result.text if s.result else "") for s in given.steps), *calls])

    def check(data: Any) -> Any:
        ctx = data.context
        action = tool_action(ctx.tool_name, ctx.tool_arguments)
        traj = so_far(ctx)
        got = (screen or default_screen(policy))(traj, action)
        stop = stops(got, escalate)
        info = {"decision": got.decision, "tier": got.tier, "score": got.score,
                "rule": got.rule}
        if not stop:  # recorded with its output, by the output guardrail
            screened[str(ctx.tool_call_id)] = (traj, action, got)
            while len(screened) > MAX_RUNS:  # calls whose tool raised never come back
                del screened[next(iter(screened))]
            return ToolGuardrailFunctionOutput.allow(output_info=info)
        reason = stop_reason(ctx.tool_name, got)
        run_of(ctx)[1].append((action, reason))  # what the model read instead
        if out is not None:
            out.publish(traj, action, reason, got, forwarded=False)
        if raise_on_block:
            return ToolGuardrailFunctionOutput.raise_exception(output_info={**info,
                                                                            "reason": reason})
        return ToolGuardrailFunctionOutput.reject_content(reason, output_info=info)

    def returned(data: Any) -> Any:
        ctx = data.context
        pending = screened.pop(str(ctx.tool_call_id), None)
        if pending is not None:
            traj, action, got = pending
            text = _text(data.output)
            run_of(ctx)[1].append((action, text))
            if out is not None:
                out.publish(traj, action, text, got, forwarded=True)
        return ToolGuardrailFunctionOutput.allow()

    before = tool_input_guardrail(name="vigil")(check)
    after = tool_output_guardrail(name="vigil-record")(returned)
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            tool.tool_input_guardrails = [*(tool.tool_input_guardrails or []), before]
            tool.tool_output_guardrails = [*(tool.tool_output_guardrails or []), after]
    return agent
