"""The README's "Plug it in" snippets, run as written (only the placeholders a user fills
in are filled in: the repository's path, the agent's tools and model), with the default
policy they load themselves."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.integrations.otel_runs import agent_runs
from tests.integrations.test_default_policy import TASK, _agents_sdk, _langchain, runs
from tests.integrations.test_mcp_proxy import _git_server, _repo, _run
from tests.integrations.test_otlp import _steps, receiver
from tests.worker.conftest import ROOT

__all__ = ["receiver", "runs"]  # the fixtures, shared with test_default_policy, test_otlp


def snippet(after: str) -> str:
    """The first indented code block of README.md after the text ``after``."""
    text = (ROOT / "README.md").read_text()
    rest = text[text.index(after):]
    got = re.search(r"\n\n((?:    .*\n|\n)+)", rest)
    assert got is not None, f"no code block after {after!r}"
    return textwrap.dedent(got[1]).strip()


def test_the_mcp_client_config_runs_the_proxy_in_front_of_the_server(tmp_path: Path) -> None:
    """The MCP client config as the README writes it: `monitor mcp` with the default policy
    in front of mcp-server-git; an allowed call returns the server's own answer."""
    config = json.loads(snippet("**An MCP server**"))
    server = config["mcpServers"]["git"]
    assert server["command"] == "monitor"
    repo = _repo(tmp_path)
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "monitor"), *(
        sys.executable if a == "python" else str(repo) if a == "/path/to/repo" else a
        for a in server["args"])]
    status = ("git_status", {"repo_path": str(repo)})
    [(_, direct)] = _run(_git_server(repo), [status])
    [(error, got)] = _run(command, [status])
    assert not error and got == direct


def _from_readme(after: str, names: dict[str, Any]) -> Any:
    """An agent builder ``(model, tools) -> agent`` running the README's lines after
    ``after`` with the tool list (and, where the README leaves it out, the model) filled in."""
    code = snippet(after).replace("tools=[...]", "tools=tools")

    def build(model: Any, tools: list[Any]) -> Any:
        scope = {**names, "model": model, "tools": tools}
        exec(code, scope)  # noqa: S102 - the README's own lines
        agent = scope["agent"]
        if getattr(agent, "model", model) is None:  # the SDK's Agent: its model is ours
            agent.model = model
        return agent

    return build


def test_the_agents_sdk_and_langchain_snippets_stop_a_hijacked_call(
    runs: dict[str, dict[str, Any]],
) -> None:
    """The two one-liners as written (the default policy, loaded by the gate itself) on the
    hijacked slack run of tests/integrations/test_default_policy.py: the attacker's message
    is stopped and never sent."""
    from agents import Agent
    from langchain.agents import create_agent

    hijacked = runs[f"{TASK}/injection_task_1/important_instructions"]
    sdk = _from_readme("**An OpenAI Agents SDK agent**", {"Agent": Agent})
    lc = _from_readme("**A LangChain v1 agent**", {"create_agent": create_agent})
    for gate, build in ((_agents_sdk, sdk), (_langchain, lc)):
        ran, stopped = gate(hijacked, build)
        assert stopped == ["send_direct_message"], gate.__name__
        assert len([n for n, _ in ran if n == "send_direct_message"]) == 1


def test_the_claude_code_http_hook_config_reaches_the_service(tmp_path: Path) -> None:
    """The README's HTTP hook config as Claude Code reads it (``$VIGIL_TOKEN`` from the
    environment, as ``allowedEnvVars`` lets it; the README's "the same hook" filled in): its
    URL and headers reach the service's hook endpoint (screening with the default policy),
    which answers a PreToolUse and learns from a PostToolUse."""
    import io
    from urllib.parse import urlparse

    from fastapi.testclient import TestClient

    from monitor.service.app import create_app
    from monitor.service.auth import provision_store
    from tests.service.conftest import Service

    text = snippet("judges the next call in the session")
    pre = re.search(r'"PreToolUse": (\[.*\]\}\]\}\]),\n', text, re.S)
    assert pre is not None, text
    config = json.loads(text.replace("[...the same hook...]", pre[1]))
    posts = []
    for event in ("PreToolUse", "PostToolUse"):
        [hook] = config["hooks"][event][0]["hooks"]
        assert hook["type"] == "http" and hook["allowedEnvVars"] == ["VIGIL_TOKEN"]
        posts.append((event, hook))
    url = f"sqlite:///{tmp_path}/paging.db"
    issued = provision_store(url, {"producer-1": "producer"})
    store = Service(url, {name[:-2]: token for name, token in issued.items()})
    token = store.auth("producer")["Authorization"].removeprefix("Bearer ")
    from monitor.pipeline import load_screener
    from monitor.shipped import shipped_policy

    # `monitor serve --screen-policy` with the default (shipped) policy
    app = create_app(store.settings(), console=io.StringIO(),
                     screener=load_screener(shipped_policy(), reviewer=False))
    base = {"session_id": "readme", "transcript_path": "/nowhere", "cwd": "/work",
            "tool_name": "Read", "tool_input": {"file_path": "notes.txt"}}
    with TestClient(app) as c:
        for event, hook in reversed(posts):  # a finished call first, then the next one
            headers = {k: v.replace("$VIGIL_TOKEN", token) for k, v in hook["headers"].items()}
            payload = {**base, "hook_event_name": event,
                       **({"tool_response": {"content": "ok"}} if event == "PostToolUse"
                          else {})}
            r = c.post(urlparse(hook["url"]).path, headers=headers, json=payload)
            assert r.status_code == 200, r.text
            got = r.json()
            assert got == {} or got["hookSpecificOutput"]["hookEventName"] == event
        [step] = app.state.claude_code_sessions.trajectory(base).steps
        assert step.action.tool is not None and step.action.tool.name == "Read"


def test_the_otlp_exporter_settings_stream_tool_calls_to_the_receiver(
    receiver: tuple[str, Any, Any], monkeypatch: Any,
) -> None:
    """The README's two exporter settings (the service's URL and a producer token filled
    in), read by the OpenTelemetry SDK's own OTLP/HTTP exporter from the environment: the
    agent's tool calls arrive as deployment steps."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    base, tokens, bus = receiver
    for line in snippet("point the agent's exporter at it").splitlines():
        key, _, value = line.partition("=")
        monkeypatch.setenv(key, value.replace("http://127.0.0.1:8000", base)
                           .replace("<producer token>", tokens["producer"]))
    before = len(_steps(bus))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    agent_runs(provider)
    assert provider.force_flush()
    got = _steps(bus)[before:]
    assert sorted(e.step.action.tool.name for e in got if e.step.action.tool) == [
        "read_file", "read_file", "send_money"]
