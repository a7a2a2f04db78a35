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

from monitor.integrations.openai_agents import Screen
from streams.records import Action, Observation, Step, ToolCall, Trajectory

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
    task, seen = "", Observation(text="")
    steps: list[Step] = []
    uses: dict[str, tuple[str, dict[str, Any]]] = {}
    order: list[str] = []
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
                    order.append(str(b.get("id")))
                elif b.get("type") == "tool_result":
                    results[str(b.get("tool_use_id"))] = _text(b)[:20_000]
    for uid in order[-32:]:
        name, args = uses[uid]
        result = Observation(text=results.get(uid, ""))
        steps.append(Step(step_id=str(len(steps)), index=len(steps), observation=seen,
                          action=Action(tool=ToolCall(name=name, arguments=args)),
                          result=result))
        seen = result
    sid = str(payload.get("session_id") or "claude-code")
    return Trajectory(trajectory_id=f"claude-code/{sid}", source="deployment", task=task,
                      steps=steps)


def answer(payload: Mapping[str, Any], screen: Screen, *, approve: bool = False,
           fail_open: bool = False) -> dict[str, Any]:
    """The hook's JSON answer for one ``PreToolUse`` payload. A screener that fails: ``ask``
    (a person confirms the call), or no decision with ``fail_open``."""
    if payload.get("hook_event_name", "PreToolUse") != "PreToolUse":
        return {}
    name = payload.get("tool_name")
    if not isinstance(name, str) or not name:
        raise ValueError("the hook payload has no tool_name: is this a PreToolUse hook?")
    args = payload.get("tool_input")
    action = Action(tool=ToolCall(name=name, arguments=args if isinstance(args, dict)
                                  else {"value": args}))
    try:
        got = screen(trajectory_of(payload), action)
    except Exception as e:  # noqa: BLE001 - the flags say how a broken screener fails
        if fail_open:
            return {}
        return _decision("ask", f"vigil could not screen this {name} call ({type(e).__name__}:"
                                f" {str(e)[:200]}); confirm it yourself")
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
    return _decision(decision, reason)


def _decision(decision: str, reason: str) -> dict[str, Any]:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                   "permissionDecision": decision,
                                   "permissionDecisionReason": reason}}
