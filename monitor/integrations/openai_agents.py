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

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from monitor.pipeline import ActionCheck
from streams.records import Action, Observation, Step, ToolCall, Trajectory

Screen = Callable[[Trajectory, Action], ActionCheck]

_DEFAULT: dict[str, Screen] = {}


def default_screen(policy: str | None = None) -> Screen:
    """The default policy's screener (L0 + L1), loaded once per process."""
    key = policy or ""
    if key not in _DEFAULT:
        from monitor.defaults import ensure_policy
        from monitor.pipeline import load_screener

        _DEFAULT[key] = load_screener(ensure_policy(policy), reviewer=False).check_action
    return _DEFAULT[key]


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
    order: list[str] = []
    outputs: dict[str, str] = {}
    for item in turn_input:
        d = item if isinstance(item, dict) else getattr(item, "model_dump", lambda: {})()
        kind = d.get("type")
        if not task and d.get("role") == "user":
            task = _text(d.get("content"))
        elif kind == "function_call":
            calls[str(d.get("call_id"))] = d
            order.append(str(d.get("call_id")))
        elif kind == "function_call_output":
            outputs[str(d.get("call_id"))] = _text(d.get("output"))
    steps: list[Step] = []
    seen = Observation(text=task)
    for cid in order:
        d = calls[cid]
        try:
            args = json.loads(d.get("arguments") or "{}")
        except ValueError:
            args = {"raw": d.get("arguments")}
        result = Observation(text=outputs.get(cid, ""))
        steps.append(Step(step_id=str(len(steps)), index=len(steps), observation=seen,
                          action=Action(tool=ToolCall(name=str(d.get("name")),
                                                      arguments=args if isinstance(args, dict)
                                                      else {"value": args})),
                          result=result))
        seen = result
    return Trajectory(trajectory_id=run_id, source="deployment", task=task, steps=steps)


def guard(agent: Any, *, screen: Screen | None = None, policy: str | None = None,
          raise_on_block: bool = False, escalate: Literal["reject", "allow"] = "reject"
          ) -> Any:
    """``agent`` with vigil's guardrail on each of its function tools (returned as is)."""
    from agents import FunctionTool, ToolGuardrailFunctionOutput, tool_input_guardrail

    def check(data: Any) -> Any:
        ctx = data.context
        try:
            args = json.loads(ctx.tool_arguments or "{}")
        except ValueError:
            args = {"raw": ctx.tool_arguments}
        action = Action(tool=ToolCall(name=ctx.tool_name, arguments=args if isinstance(
            args, dict) else {"value": args}))
        traj = trajectory_of(list(ctx.turn_input or []))
        got = (screen or default_screen(policy))(traj, action)
        stop = got.decision == "block" or (got.decision == "escalate" and escalate == "reject")
        info = {"decision": got.decision, "tier": got.tier, "score": got.score,
                "rule": got.rule}
        if not stop:
            return ToolGuardrailFunctionOutput.allow(output_info=info)
        reason = (f"vigil stopped this call to {ctx.tool_name}: the safety screen "
                  f"{'blocked' if got.decision == 'block' else 'escalated'} it (score "
                  f"{got.score:.3f}, tier L{got.tier}"
                  + (f"; {got.rule}" if got.rule else "") + "); it was not run")
        if raise_on_block:
            return ToolGuardrailFunctionOutput.raise_exception(output_info={**info,
                                                                            "reason": reason})
        return ToolGuardrailFunctionOutput.reject_content(reason, output_info=info)

    guardrail = tool_input_guardrail(name="vigil")(check)
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            tool.tool_input_guardrails = [*(tool.tool_input_guardrails or []), guardrail]
    return agent
