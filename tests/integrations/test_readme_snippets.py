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

from tests.integrations.test_default_policy import TASK, _agents_sdk, _langchain, runs
from tests.integrations.test_mcp_proxy import _git_server, _repo, _run
from tests.worker.conftest import ROOT

__all__ = ["runs"]  # the fixture, shared with test_default_policy


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
