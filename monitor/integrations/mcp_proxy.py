"""vigil in front of an MCP server (``monitor mcp -- SERVER_CMD ARGS...``).

The proxy is an MCP server on its own stdin/stdout (what the client's config launches) and
an MCP client of the real server, which it starts as a subprocess. It forwards the tool list
and every tool call, and screens each ``tools/call`` *before* forwarding it, as
``POST /v1/screen`` does (L0 and L1, :meth:`monitor.pipeline.Screener.check_action`, the
policy's tool rules included), against the session's earlier calls and their results:

* **block**: the call never reaches the server; the client gets a ``CallToolResult`` with
  ``isError: true`` and the reason, so the model sees why;
* **escalate** and **allow**: forwarded (holding an escalated call for a human is not built
  yet: it is forwarded and logged as escalated);
* ``monitor_only``: nothing is blocked; every decision is logged;
* the screener failing: the call is refused (``isError``), or forwarded with ``fail_open``.

What the tool returned becomes the observation the next call is judged against, so an
injection planted in a result counts against the action that follows it. With a broker
configured, every screened call (a blocked one with the refusal as its result) goes to the
deployment steps topic as a :class:`~streams.records.StepEvent`, so the async tiers, pages
and recall dashboards see MCP traffic. Tool
descriptions in ``tools/list`` are screened by the injection-marker rule (tool poisoning):
a poisoned tool is logged, and with ``hide_poisoned`` left out of the list.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from monitor.integrations.common import (
    MAX_RESULT_CHARS,
    MAX_STEPS,
    Screen,
    StepStream,
    next_step,
    tool_action,
)
from monitor.pipeline import ActionCheck
from streams.records import Action, Step, Trajectory

Log = Callable[[str], None]


def _stderr(msg: str) -> None:  # stdout is the MCP wire
    print(msg, file=sys.stderr, flush=True)


@dataclass
class McpSession:
    """One client session's calls so far, as the trajectory a new call is judged in."""

    server: str
    trajectory_id: str = field(default_factory=lambda: f"mcp-{uuid.uuid4().hex[:12]}")
    steps: list[Step] = field(default_factory=list)

    def trajectory(self) -> Trajectory:
        return Trajectory(trajectory_id=self.trajectory_id, source="deployment",
                          task="", steps=list(self.steps),
                          meta={"mcp_server": self.server})

    def action(self, name: str, arguments: dict[str, Any] | None) -> Action:
        # the server travels as an extra key of the call (tool rules match on it)
        return tool_action(name, arguments, server=self.server)

    def record(self, action: Action, result: str) -> Step:
        # ids keep counting past the cut
        step = next_step(self.steps[-1] if self.steps else None, "", action, result)
        self.steps.append(step)
        del self.steps[:-MAX_STEPS]  # the screeners read the last few; memory stays bounded
        return step


def result_text(result: Any) -> str:
    """The text a CallToolResult carries (its text blocks, else its structured content)."""
    parts = [getattr(c, "text", "") for c in (getattr(result, "content", None) or [])]
    text = "\n".join(p for p in parts if p)
    if not text and getattr(result, "structured_content", None) is not None:
        text = json.dumps(result.structured_content, default=str)
    return text[:MAX_RESULT_CHARS]


def refusal(reason: str) -> Any:
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(type="text", text=reason)],
                                is_error=True)


@dataclass
class Decision:
    forward: bool
    reason: str
    check: ActionCheck | None


def decide(screen: Screen, session: McpSession, action: Action,
           *, monitor_only: bool = False, fail_open: bool = False) -> Decision:
    """Whether the proposed ``action`` (a tool call) goes to the server, and why."""
    name = action.tool.name if action.tool else ""
    try:
        check = screen(session.trajectory(), action)
    except Exception as e:  # noqa: BLE001 - the flags say how a broken screener fails
        why = f"vigil could not screen this call ({type(e).__name__}: {str(e)[:200]})"
        if fail_open or monitor_only:
            return Decision(True, why + "; forwarded (fail-open)", None)
        return Decision(False, why + "; it was not run (fail-closed)", None)
    rule = f" ({check.rule})" if check.rule else ""
    if check.decision == "block" and not monitor_only:
        return Decision(False, f"vigil blocked this call to {name}: the safety screen scored "
                               f"it {check.score:.3f} at tier L{check.tier}{rule}; it was "
                               "not run", check)
    return Decision(True, f"{check.decision}{rule}", check)


def upstream_name(upstream: str | list[str]) -> str:
    """The server's name in tool rules and logs: its command's, or its URL's host."""
    if isinstance(upstream, str):
        from urllib.parse import urlsplit

        return urlsplit(upstream).hostname or upstream
    return upstream[0].rsplit("/", 1)[-1]


async def run_proxy(screen: Screen, upstream: str | list[str], *, server: str = "",
                    monitor_only: bool = False, fail_open: bool = False,
                    hide_poisoned: bool = False, stream: StepStream | None = None,
                    headers: dict[str, str] | None = None, log: Log = _stderr) -> None:
    """Serve the proxy on this process's stdin/stdout until the client goes away.
    ``upstream``: the real server, a command (with its arguments) started as a subprocess
    over stdio, or the URL of a server on streamable HTTP (``headers`` sent with each
    request, e.g. its ``Authorization``). ``stream``: each screened call's step goes to it,
    blocked ones too."""
    import anyio
    import mcp_types as types
    from mcp import Client, StdioServerParameters
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from monitor.scorers.rules import injection_marker

    name = server or upstream_name(upstream)
    session = McpSession(server=name)
    async with AsyncExitStack() as stack:
        target: Any
        if isinstance(upstream, str):
            from mcp.client.streamable_http import (
                create_mcp_http_client,
                streamable_http_client,
            )

            http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            target = streamable_http_client(upstream, http_client=http)
        else:
            target = StdioServerParameters(command=upstream[0], args=upstream[1:])
        upstream_ = await stack.enter_async_context(Client(target))

        async def list_tools(ctx: Any, params: Any) -> Any:
            got = await upstream_.list_tools()
            keep = []
            for tool in got.tools:
                if injection_marker(f"{tool.description or ''} {tool.title or ''}"):
                    log(f"vigil: tool {tool.name!r} of {name} has instruction-like text in "
                        "its description (tool poisoning?)"
                        + ("; hidden" if hide_poisoned else ""))
                    if hide_poisoned:
                        continue
                keep.append(tool)
            return types.ListToolsResult(tools=keep)

        async def call_tool(ctx: Any, params: Any) -> Any:
            action = session.action(params.name, params.arguments)
            d = await anyio.to_thread.run_sync(
                lambda: decide(screen, session, action, monitor_only=monitor_only,
                               fail_open=fail_open))
            log(f"vigil: {params.name}: {d.reason}")
            if not d.forward:
                out = refusal(d.reason)
            else:
                out = await upstream_.call_tool(params.name, params.arguments)
            before = session.trajectory()
            text = result_text(out)
            session.record(action, text)
            if stream is not None:
                await anyio.to_thread.run_sync(lambda: stream.publish(
                    before, action, text, d.check, forwarded=d.forward,
                    meta={"mcp_server": session.server}))
            return out

        proxy = Server("vigil", on_list_tools=list_tools, on_call_tool=call_tool)
        async with stdio_server() as (read, write):
            await proxy.run(read, write, proxy.create_initialization_options())
