"""vigil as a Claude Code ``PreToolUse`` hook (``monitor hook claude-code``).

Claude Code runs the hook before each tool call with a JSON payload on stdin
(``session_id``, ``transcript_path``, ``tool_name``, ``tool_input``, ...) and reads the
answer on stdout. The call is screened in the session so far (L0 and L1 with the policy's
tool rules, as ``POST /v1/screen``): the transcript's first user message is the task, its
earlier ``tool_use`` blocks with their ``tool_result`` the steps. Block: ``deny`` with the
reason (Claude sees it); escalate: ``ask`` (the user confirms); allow: no decision, so
Claude Code's own permission rules apply (``approve=True``: ``allow``, skipping them); a
screener that fails: ``ask`` (``fail_open``: no decision).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monitor.integrations.common import (
    MAX_RESULT_CHARS,
    MAX_STEPS,
    Screen,
    tool_action,
    trajectory_from_calls,
)
from monitor.pipeline import ActionCheck
from streams.records import Action, Trajectory

MAX_TRANSCRIPT_BYTES = 20_000_000  # a transcript larger than this is read from its end


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text(block: Mapping[str, Any]) -> str:
    c = block.get("content", block.get("text", ""))
    if isinstance(c, list):
        return " ".join(str(x.get("text", "")) for x in c if isinstance(x, dict))
    return str(c)


def trajectory_of(payload: Mapping[str, Any]) -> Trajectory:
    """The session so far, from the transcript the payload names (none: no steps)."""
    task = ""
    uses: dict[str, tuple[str, dict[str, Any]]] = {}
    results: dict[str, str] = {}
    path = Path(str(payload.get("transcript_path") or ""))
    if path.is_file():
        with path.open("rb") as f:
            size = path.stat().st_size
            f.seek(max(0, size - MAX_TRANSCRIPT_BYTES))
            lines = f.read().splitlines()
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            message = entry.get("message") if isinstance(entry, dict) else None
            if not isinstance(message, dict):
                continue
            for b in _blocks(message):
                if b.get("type") == "text" and message.get("role") == "user" and not task:
                    task = _text(b)
                elif b.get("type") == "tool_use":
                    uses[str(b.get("id"))] = (str(b.get("name")), dict(b.get("input") or {}))
                elif b.get("type") == "tool_result":
                    results[str(b.get("tool_use_id"))] = _text(b)
    return trajectory_from_calls(Sessions.key(payload), task, (
        (tool_action(name, args), results.get(uid, "")) for uid, (name, args) in uses.items()))


def action_of(payload: Mapping[str, Any]) -> Action:
    """The tool call a ``PreToolUse`` (or ``PostToolUse``) payload names."""
    name = payload.get("tool_name")
    if not isinstance(name, str) or not name:
        raise ValueError("the hook payload has no tool_name: is this a PreToolUse hook?")
    return tool_action(name, payload.get("tool_input"))


def answer(payload: Mapping[str, Any], screen: Screen, *, approve: bool = False,
           fail_open: bool = False, trajectory: Trajectory | None = None) -> dict[str, Any]:
    """The hook's JSON answer for one ``PreToolUse`` payload, screened in ``trajectory``
    (default: the session read from the transcript the payload names). A screener that
    fails: ``ask`` (a person confirms the call), or no decision with ``fail_open``."""
    if payload.get("hook_event_name", "PreToolUse") != "PreToolUse":
        return {}
    action = action_of(payload)
    name = action.tool.name if action.tool else ""
    try:
        got = screen(trajectory if trajectory is not None else trajectory_of(payload), action)
    except Exception as e:  # noqa: BLE001 - the flags say how a broken screener fails
        if fail_open:
            return {}
        return permission("ask", f"vigil could not screen this {name} call ({type(e).__name__}:"
                                f" {str(e)[:200]}); confirm it yourself")
    return decision_of(name, got, approve=approve)


def decision_of(name: str, got: ActionCheck, *, approve: bool = False) -> dict[str, Any]:
    """The hook's answer for a screened ``name`` call: block: ``deny``; escalate: ``ask``;
    allow: no decision (``approve``: ``allow``)."""
    why = (f"vigil: the safety screen scored this {name} call {got.score:.3f} (tier "
           f"L{got.tier}" + (f"; {got.rule}" if got.rule else "") + ")")
    if got.decision == "block":
        decision, reason = "deny", why + " and blocked it"
    elif got.decision == "escalate":
        decision, reason = "ask", why + " and asks a person to confirm it"
    elif approve:
        decision, reason = "allow", why + " and allowed it"
    else:
        return {}
    return permission(decision, reason)


def permission(decision: str, reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                   "permissionDecision": decision,
                                   "permissionDecisionReason": reason}}


class Sessions:
    """What a service that answers the hook over HTTP knows of each session: the calls its
    ``PostToolUse`` payloads reported, with their results (the transcript the payload names
    is on the client's disk, and a request never makes the service read a file). Bounded:
    the last few calls of the last ``max_sessions`` sessions, each result cut."""

    def __init__(self, max_sessions: int = 1024) -> None:
        from collections import OrderedDict

        self.max_sessions = max_sessions
        self._calls: OrderedDict[str, list[tuple[Action, str]]] = OrderedDict()

    @staticmethod
    def key(payload: Mapping[str, Any]) -> str:
        return f"claude-code/{payload.get('session_id') or 'claude-code'}"

    def trajectory(self, payload: Mapping[str, Any]) -> Trajectory:
        key = self.key(payload)
        return trajectory_from_calls(key, "", self._calls.get(key, ()))

    def record(self, payload: Mapping[str, Any]) -> None:
        """A ``PostToolUse`` payload's call and result, as the session's next step."""
        key = self.key(payload)
        action = action_of(payload)
        calls = self._calls.pop(key, [])
        self._calls[key] = calls  # the most recent session last
        while len(self._calls) > self.max_sessions:
            self._calls.popitem(last=False)
        response = payload.get("tool_response")
        text = response if isinstance(response, str) else json.dumps(response, default=str)
        calls.append((action, text[:MAX_RESULT_CHARS]))
        del calls[:-MAX_STEPS]
