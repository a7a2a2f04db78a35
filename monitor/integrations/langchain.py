"""vigil as a LangChain v1 agent middleware: ``create_agent(..., middleware=[VigilMiddleware()])``.

``wrap_tool_call`` screens each tool call before the tool runs (L0 and L1 with the policy's
tool rules, as ``POST /v1/screen``), in the trajectory the agent's messages make so far (the
first human message is the task; each earlier AI tool call with its ``ToolMessage`` a
step). Allow: the tool runs. Block (and, unless ``escalate="allow"``, escalate): the tool
never runs and the agent gets a ``ToolMessage`` with the reason (``status="error"``). With
a broker configured, every screened call goes to the deployment steps topic with its result
(:class:`~monitor.integrations.common.StepStream`), for the async tiers.
``screen``: any ``(Trajectory, Action) -> ActionCheck`` (default: the default policy's
screener, loaded once, ``reviewer=False``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from monitor.integrations.common import (
    Screen,
    StepStream,
    default_screen,
    stop_reason,
    stops,
    tool_action,
    trajectory_from_calls,
)
from streams.records import Trajectory


def trajectory_of(messages: Sequence[Any], run_id: str = "langchain-run",
                  pending: str | None = None) -> Trajectory:
    """The agent's messages so far as a trajectory; ``pending``: the id of the call being
    screened (its AI message is in the state already; it is not a step before itself)."""
    task = next((str(m.content) for m in messages if isinstance(m, HumanMessage)), "")
    results = {m.tool_call_id: str(m.content) for m in messages if isinstance(m, ToolMessage)}
    return trajectory_from_calls(run_id, task, (
        (tool_action(call["name"], call.get("args"), text=str(m.content or "")),
         results.get(str(call.get("id")), ""))
        for m in messages if isinstance(m, AIMessage) for call in m.tool_calls
        if pending is None or str(call.get("id")) != pending))


class VigilMiddleware(AgentMiddleware):  # type: ignore[misc]
    """Screens every tool call of a LangChain agent before it runs. ``stream``: where each
    screened call goes with its result (default: the deployment steps topic where
    ``VIGIL_KAFKA_BOOTSTRAP_SERVERS`` is set; ``False``: nowhere)."""

    def __init__(self, *, screen: Screen | None = None, policy: str | None = None,
                 escalate: Literal["reject", "allow"] = "reject",
                 stream: StepStream | Literal[False] | None = None,
                 run_id: str | None = None) -> None:
        super().__init__()
        self._screen = screen
        self._policy = policy
        self._escalate = escalate
        self._stream = StepStream.from_env() if stream is None else stream or None
        self._run_id = run_id or f"langchain-{uuid.uuid4().hex[:12]}"

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        call = request.tool_call
        messages = list((request.state or {}).get("messages", []))
        # one trajectory per conversation: LangGraph gives each message in the state an id
        first = getattr(messages[0], "id", None) if messages else None
        traj = trajectory_of(messages, f"{self._run_id}/{first}" if first else self._run_id,
                             pending=str(call.get("id")))
        action = tool_action(call["name"], call.get("args"))
        got = (self._screen or default_screen(self._policy))(traj, action)
        stop = stops(got, self._escalate)
        if stop:
            out = ToolMessage(content=stop_reason(call["name"], got),
                              tool_call_id=str(call.get("id")), name=call["name"],
                              status="error")
        else:
            out = handler(request)
        if self._stream is not None:
            self._stream.publish(traj, action, str(getattr(out, "content", out)), got,
                                 forwarded=not stop)
        return out
