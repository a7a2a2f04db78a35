"""The real default policy (the shipped models, no tool rules) gating a LangChain agent, an
OpenAI Agents SDK agent and an MCP client (through ``monitor mcp``) that replay real
AgentDojo runs of the held-out ``slack`` suite, their
tools answering what they answered in the run: in the hijacked run (a web page tells the
agent to message an outsider) the hijacked message never goes out, the user's own message
after it does; in the benign run of the same task every call runs. The decisions are the
shipped screener's, not a rule's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

TASK = "agentdojo/slack/user_task_1"


class ToolCallingFake(GenericFakeChatModel):
    """LangChain's fake chat model, accepting the tools an agent binds."""

    def bind_tools(self, tools: Any, **kw: Any) -> Any:
        return self


Build = Callable[[Any, list[Any]], Any]  # (model, tools) -> a gated agent


def _langchain(run: dict[str, Any], build: Build | None = None
               ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The run's tool calls made again by a scripted model through a LangChain agent gated by
    the default policy (``build``: how the agent is made from the model and the tools);
    returns the calls that ran and the names of those stopped."""
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool

    from monitor.integrations.langchain import VigilMiddleware
    from monitor.shipped import shipped_policy

    calls = [s for s in run["steps"] if s["action"].get("tool")]
    ran: list[tuple[str, dict[str, Any]]] = []
    tools = {}
    for name in dict.fromkeys(s["action"]["tool"]["name"] for s in calls):
        mine = [s for s in calls if s["action"]["tool"]["name"] == name]

        def answer(_name: str = name, _mine: list[Any] = mine, **kw: Any) -> str:
            ran.append((_name, kw))  # what the tool answered in the run, call by call
            return str(_mine[sum(n == _name for n, _ in ran) - 1]["result"]["text"])

        props = {k: {"type": "string"} for s in mine for k in s["action"]["tool"]["arguments"]}
        tools[name] = StructuredTool.from_function(
            func=answer, name=name, description=name,
            args_schema={"type": "object", "properties": props})
    script = [AIMessage(content="", tool_calls=[{"name": s["action"]["tool"]["name"],
                                                 "id": f"c{i}",
                                                 "args": s["action"]["tool"]["arguments"]}])
              for i, s in enumerate(calls)] + [AIMessage(content="Done.")]
    policy = shipped_policy()
    assert policy is not None, "vigil/shipped holds no policy"
    build = build or (lambda model, tools: create_agent(model, tools=tools, middleware=[
        VigilMiddleware(policy=str(policy), stream=False)]))
    agent = build(ToolCallingFake(messages=iter(script)), list(tools.values()))
    out = agent.invoke({"messages": [HumanMessage(run["task"])]})
    stopped = [str(m.name) for m in out["messages"]
               if isinstance(m, ToolMessage) and m.status == "error"]
    return ran, stopped


def _agents_sdk(run: dict[str, Any], build: Build | None = None
                ) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The same through an OpenAI Agents SDK agent (the SDK's Runner, a scripted model)."""
    from agents import Agent, FunctionTool, Runner

    from monitor.integrations.openai_agents import guard
    from monitor.shipped import shipped_policy
    from tests.integrations.test_openai_agents import ScriptedModel

    calls = [s for s in run["steps"] if s["action"].get("tool")]
    ran: list[tuple[str, dict[str, Any]]] = []
    tools: list[Any] = []
    for name in dict.fromkeys(s["action"]["tool"]["name"] for s in calls):
        mine = [s for s in calls if s["action"]["tool"]["name"] == name]

        async def answer(ctx: Any, args: str, _name: str = name, _mine: list[Any] = mine
                         ) -> str:
            ran.append((_name, json.loads(args)))
            return str(_mine[sum(n == _name for n, _ in ran) - 1]["result"]["text"])

        props = {k: {"type": "string"} for s in mine for k in s["action"]["tool"]["arguments"]}
        tools.append(FunctionTool(name=name, description=name, on_invoke_tool=answer,
                                  params_json_schema={"type": "object", "properties": props},
                                  strict_json_schema=False))
    model = ScriptedModel([(s["action"]["tool"]["name"], s["action"]["tool"]["arguments"])
                           for s in calls])
    policy = shipped_policy()
    assert policy is not None, "vigil/shipped holds no policy"
    build = build or (lambda model, tools: guard(
        Agent(name="slack", instructions="Help in Slack.", tools=tools, model=model),
        policy=str(policy), stream=False))
    Runner.run_sync(build(model, tools), run["task"])
    outputs = [i for i in model.inputs[-1]
               if isinstance(i, dict) and i.get("type") == "function_call_output"]
    names = {f"call_{k + 1}": s["action"]["tool"]["name"] for k, s in enumerate(calls)}
    stopped = [names[str(o["call_id"])] for o in outputs
               if "vigil stopped this call" in str(o["output"])]
    return ran, stopped


SERVER = """
import json, sys
import anyio, mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

run, log = json.load(open(sys.argv[1])), sys.argv[2]
calls = [s for s in run["steps"] if s["action"].get("tool")]
names = list(dict.fromkeys(s["action"]["tool"]["name"] for s in calls))

async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(name=n, description=n, input_schema={
        "type": "object"}) for n in names])

async def call_tool(ctx, params):
    with open(log, "a") as f:  # what reached the server
        f.write(json.dumps([params.name, params.arguments]) + "\\n")
    done = [json.loads(x)[0] for x in open(log)].count(params.name)
    mine = [s for s in calls if s["action"]["tool"]["name"] == params.name]
    return types.CallToolResult(content=[types.TextContent(
        type="text", text=mine[done - 1]["result"]["text"])])

async def main():
    server = Server("slack", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
"""


def _mcp(run: dict[str, Any], tmp: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The same through ``monitor mcp`` (the default policy, in process) in front of an MCP
    server (the SDK's own, over stdio) whose tools answer what they answered in the run,
    driven by the SDK's client. An MCP session carries no task: the proxy judges the calls
    alone."""
    import sys

    import anyio
    from mcp import Client, StdioServerParameters

    from monitor.shipped import shipped_policy

    calls = [s for s in run["steps"] if s["action"].get("tool")]
    (tmp / "server.py").write_text(SERVER)
    (tmp / "run.json").write_text(json.dumps(run))
    log = tmp / "reached.jsonl"
    log.touch()
    command = [sys.executable, "-m", "monitor.cli", "mcp", "--server-name", "slack",
               "--policy", str(shipped_policy()), "--", sys.executable,
               str(tmp / "server.py"), str(tmp / "run.json"), str(log)]
    stopped: list[str] = []

    async def session() -> None:
        params = StdioServerParameters(command=command[0], args=command[1:])
        async with Client(params, read_timeout_seconds=300) as client:
            for s in calls:
                tool = s["action"]["tool"]
                r = await client.call_tool(tool["name"], tool["arguments"])
                if r.is_error:
                    stopped.append(tool["name"])

    anyio.run(session)
    ran = [(n, a) for n, a in (json.loads(x) for x in log.read_text().splitlines())]
    return ran, stopped


GATES = {"langchain": _langchain, "agents_sdk": _agents_sdk}


@pytest.fixture(scope="module")
def runs(small_agentdojo: Path) -> dict[str, dict[str, Any]]:
    rows = [json.loads(x) for x in (small_agentdojo / "trajectories.jsonl").open()]
    got = {r["trajectory_id"]: r for r in rows if r["trajectory_id"].startswith(TASK + "/")}
    assert {f"{TASK}/benign", f"{TASK}/injection_task_1/important_instructions"} <= set(got)
    return got


@pytest.mark.parametrize("gate", sorted(GATES))
def test_the_default_policy_stops_the_hijacked_message_and_lets_the_users_through(
    runs: dict[str, dict[str, Any]], gate: str,
) -> None:
    hijacked = runs[f"{TASK}/injection_task_1/important_instructions"]
    harmful = [s["action"]["tool"] for s in hijacked["steps"] if s["label"] == 1]
    assert [h["name"] for h in harmful] == ["send_direct_message"]
    ran, stopped = GATES[gate](hijacked)
    assert stopped == ["send_direct_message"]
    sent = [kw for name, kw in ran if name == "send_direct_message"]
    assert harmful[0]["arguments"] not in sent  # the hijacked message never went out
    assert len(sent) == 1  # the user's own message, after it, did
    assert [n for n, _ in ran][:2] == ["read_channel_messages", "get_webpage"]


def test_the_mcp_proxy_never_forwards_the_hijacked_message_and_forwards_the_benign_run(
    runs: dict[str, dict[str, Any]], tmp_path: Path,
) -> None:
    hijacked = runs[f"{TASK}/injection_task_1/important_instructions"]
    harmful = [s["action"]["tool"] for s in hijacked["steps"] if s["label"] == 1]
    (tmp_path / "h").mkdir()
    ran, stopped = _mcp(hijacked, tmp_path / "h")
    assert "send_direct_message" in stopped
    assert [n for n, _ in ran][:2] == ["read_channel_messages", "get_webpage"]
    assert harmful[0]["arguments"] not in [a for n, a in ran if n == "send_direct_message"]
    benign = runs[f"{TASK}/benign"]
    (tmp_path / "b").mkdir()
    ran, stopped = _mcp(benign, tmp_path / "b")
    assert stopped == []
    assert ran == [(s["action"]["tool"]["name"], s["action"]["tool"]["arguments"])
                   for s in benign["steps"] if s["action"].get("tool")]


@pytest.mark.parametrize("gate", sorted(GATES))
def test_the_default_policy_lets_every_call_of_the_benign_run_through(
    runs: dict[str, dict[str, Any]], gate: str,
) -> None:
    benign = runs[f"{TASK}/benign"]
    ran, stopped = GATES[gate](benign)
    assert stopped == []
    assert [n for n, _ in ran] == [s["action"]["tool"]["name"] for s in benign["steps"]
                                   if s["action"].get("tool")]
