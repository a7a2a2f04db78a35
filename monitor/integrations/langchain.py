"""vigil as a LangChain v1 agent middleware: ``create_agent(..., middleware=[VigilMiddleware()])``.

``wrap_tool_call`` screens each tool call before the tool runs (L0 and L1 with the policy's
tool rules, as ``POST /v1/screen``), in the trajectory the agent's messages make so far (the
first human message is the task; each earlier AI tool call with its ``ToolMessage`` a
step). Allow: the tool runs. Block (and, unless ``escalate="allow"``, escalate): the tool
never runs and the agent gets a ``ToolMessage`` with the reason (``status="error"``).
``screen``: any ``(Trajectory, Action) -> ActionCheck`` (default: the default policy's
screener, loaded once, ``reviewer=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from monitor.integrations.common import (
    Screen,
    default_screen,
    stop_reason,
    tool_action,
    trajectory_from_calls,
)
from streams.records import Trajectory


def trajectory_of(messages: Sequence[Any], run_id: str = "langchain-run") -> Trajectory:
    """The agent's messages so far as a trajectory."""
    task = next((str(m.content) for m in messages if isinstance(m, HumanMessage)), "")
    results = {m.tool_call_id: str(m.content) for m in messages if isinstance(m, ToolMessage)}
    return trajectory_from_calls(run_id, task, (
        (tool_action(call["name"], call.get("args"), text=str(m.content or "")),
         results.get(str(call.get("id")), ""))
        for m in messages if isinstance(m, AIMessage) for call in m.tool_calls))


class VigilMiddleware(AgentMiddleware):  # type: ignore[misc]
    """Screens every tool call of a LangChain agent before it runs."""

    def __init__(self, *, screen: Screen | None = None, policy: str | None = None,
                 escalate: Literal["reject", "allow"] = "reject") -> None:
        super().__init__()
        self._screen = screen
        self._policy = policy
        self._escalate = escalate

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        call = request.tool_call
        traj = trajectory_of(list((request.state or {}).get("messages", [])))
        action = tool_action(call["name"], call.get("args"))
        got = (self._screen or default_screen(self._policy))(traj, action)
        stop = got.decision == "block" or (got.decision == "escalate"
                                           and self._escalate == "reject")
        if not stop:
            return handler(request)
        reason = stop_reason(call["name"], got)
        return ToolMessage(content=reason, tool_call_id=str(call.get("id")), name=call["name"],
                           status="error")
