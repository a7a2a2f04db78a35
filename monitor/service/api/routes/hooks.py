"""``POST /v1/hooks/claude-code``: the Claude Code hook (``monitor hook claude-code``) as an
HTTP endpoint, for a team that runs one service instead of the models on every laptop.

Claude Code posts each ``PreToolUse`` payload and gets the hook's JSON answer: ``deny``
(block), ``ask`` (escalate) or no decision (allow: its own permission rules apply;
``?approve=true``: ``allow``). The call is screened (L0 and L1 with the policy's tool rules,
as ``POST /v1/screen``) against the session's earlier calls, which the service learns from
the same hook's ``PostToolUse`` payloads (call and result); the transcript the payload
names is on the client's disk, and a request never makes the service read a file.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request, status
from pydantic import BaseModel, ConfigDict, Field

from monitor.service.api import responses
from monitor.service.deps import HarnessDep, ScreenQueueDep
from monitor.service.schemas import Problem

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/hooks", tags=["screen"], responses=responses.AUTH)


class ClaudeCodeHook(BaseModel):
    """The fields of a Claude Code tool hook's payload that vigil reads (the rest, such as
    ``cwd`` and ``transcript_path``, are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    hook_event_name: Literal["PreToolUse", "PostToolUse"] = "PreToolUse"
    session_id: str = Field(default="claude-code", max_length=255)
    tool_name: str = Field(min_length=1, max_length=255)
    tool_input: dict[str, Any] = Field(default_factory=dict)
    tool_response: Any = None


def _sessions(request: Request) -> Any:
    from monitor.integrations.claude_code import Sessions

    got = getattr(request.app.state, "claude_code_sessions", None)
    if got is None:
        got = request.app.state.claude_code_sessions = Sessions()
    return got


@router.post(
    "/claude-code",
    responses={503: {"model": Problem, "description": "screening is not configured"}},
    summary="Answer a Claude Code PreToolUse hook (deny / ask / no decision)",
)
async def claude_code_hook(
    hook: ClaudeCodeHook, request: Request, _: HarnessDep, queue: ScreenQueueDep,
    approve: bool = False,
) -> dict[str, Any]:
    """A `PreToolUse` payload: the hook's answer, as `monitor hook claude-code` prints it. A
    `PostToolUse` payload: the call and its result join the session (the next call is judged
    against them); the answer is empty. A screener that fails: `ask`, or no decision where
    the policy's `tools.on_screener_error` is `open`."""
    from monitor.integrations.claude_code import action_of, decision_of, permission

    payload = hook.model_dump()
    sessions = _sessions(request)
    try:
        if hook.hook_event_name == "PostToolUse":
            sessions.record(payload)
            return {}
        trajectory = sessions.trajectory(payload)
        action = action_of(payload)
    except ValueError as e:  # a payload the records refuse (e.g. an odd tool input)
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, str(e)) from e
    try:
        check = await queue.check(trajectory, action)
    except Exception as e:  # noqa: BLE001 - logged by the queue; the policy says how to fail
        if queue.screener.policy.config.tools.on_screener_error == "open":
            return {}
        return permission("ask", f"vigil could not screen this {hook.tool_name} call "
                                 f"({type(e).__name__}); confirm it yourself")
    return decision_of(hook.tool_name, check, approve=approve)
