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
default policy, loaded once, ``reviewer=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from monitor.integrations.common import (
    Screen,
    default_screen,
    stop_reason,
    tool_action,
    trajectory_from_calls,
)
from streams.records import Trajectory

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


def guard(agent: Any, *, screen: Screen | None = None, policy: str | None = None,
          raise_on_block: bool = False, escalate: Literal["reject", "allow"] = "reject"
          ) -> Any:
    """``agent`` with vigil's guardrail on each of its function tools (returned as is)."""
    from agents import FunctionTool, ToolGuardrailFunctionOutput, tool_input_guardrail

    def check(data: Any) -> Any:
        ctx = data.context
        action = tool_action(ctx.tool_name, ctx.tool_arguments)
        traj = trajectory_of(list(ctx.turn_input or []))
        got = (screen or default_screen(policy))(traj, action)
        stop = got.decision == "block" or (got.decision == "escalate" and escalate == "reject")
        info = {"decision": got.decision, "tier": got.tier, "score": got.score,
                "rule": got.rule}
        if not stop:
            return ToolGuardrailFunctionOutput.allow(output_info=info)
        reason = stop_reason(ctx.tool_name, got)
        if raise_on_block:
            return ToolGuardrailFunctionOutput.raise_exception(output_info={**info,
                                                                            "reason": reason})
        return ToolGuardrailFunctionOutput.reject_content(reason, output_info=info)

    guardrail = tool_input_guardrail(name="vigil")(check)
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            tool.tool_input_guardrails = [*(tool.tool_input_guardrails or []), guardrail]
    return agent
