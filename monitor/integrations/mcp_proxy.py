"""vigil in front of an MCP server (``monitor mcp -- SERVER_CMD ARGS...``).

The proxy is an MCP server on its own stdin/stdout (what the client's config launches) and
an MCP client of the real server, which it starts as a subprocess. It forwards the tool list
and every tool call, and screens each ``tools/call`` *before* forwarding it, as
``POST /v1/screen`` does (L0 and L1, :meth:`monitor.pipeline.Screener.check_action`, the
policy's tool rules included), against the session's earlier calls and their results:

* **block**: the call never reaches the server; the client gets a ``CallToolResult`` with
  ``isError: true`` and the reason, so the model sees why;
* **escalate**: with ``hold`` (``--hold-timeout``), the call waits while a page on the
  paging service asks a human (:func:`hold_for_review`): approved (a verdict "not harmful")
  → forwarded; rejected, or no answer in time → refused, or forwarded with ``fail_open``;
  without ``hold``, forwarded and logged as escalated;
* **allow**: forwarded;
* ``monitor_only``: nothing is blocked or held; every decision is logged;
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


@dataclass(frozen=True)
class Hold:
    """Where an escalated call waits for a human: the paging service at ``url`` (a producer
    ``token``), for at most ``timeout_s``, asking every ``poll_s``."""

    url: str
    token: str
    timeout_s: float
    poll_s: float = 1.0


def hold_for_review(hold: Hold, session: McpSession, action: Action, check: ActionCheck, *,
                    fail_open: bool = False, log: Log = _stderr) -> Decision:
    """Page a human about the escalated ``action`` (a case of its own, with the session's
    calls so far and the proposed one) and wait for the answer: ``GET /api/v1/events/KEY``
    on the paging service until a verdict comes in or ``hold.timeout_s`` passes."""
    import time
    from urllib.parse import quote

    import httpx

    from monitor.service.schemas import CaseDetails, EventCreate, EventPayload, TierScore
    from monitor.stream.paging import PagingClient

    name = action.tool.name if action.tool else ""
    proposed = next_step(session.steps[-1] if session.steps else None, "", action, "")
    traj = session.trajectory().model_copy(update={"steps": [*session.steps, proposed]})
    key = f"{session.trajectory_id}/{proposed.step_id}/hold-{uuid.uuid4().hex[:8]}"
    rule = f" ({check.rule})" if check.rule else ""
    unheld = "forwarded (fail-open)" if fail_open else "it was not run"
    try:
        PagingClient(hold.url, hold.token).trigger(EventCreate(
            event_action="trigger", dedup_key=key,
            payload=EventPayload(
                summary=f"MCP call {session.server}.{name} held for a reviewer (harm "
                        f"{check.score:.2f}, L{check.tier}{rule})"[:1024],
                source=f"mcp:{session.server}"[:255], severity="critical", group=key,
                custom_details=CaseDetails(
                    trajectory=traj, trajectory_id=traj.trajectory_id,
                    step_id=proposed.step_id,
                    scores=[TierScore(tier=min(check.tier, 3), score=min(max(check.score, 0.0),
                                      1.0), signals=dict(check.signals))]))))
    except Exception as e:  # noqa: BLE001 - the page could not be opened: nobody can answer
        return Decision(fail_open, f"vigil escalated this call to {name}{rule} but could not "
                        f"page a reviewer ({str(e)[:200]}); {unheld}", check)
    log(f"vigil: {name}: escalated{rule}; held up to {hold.timeout_s:g} s for a reviewer "
        f"(page {key})")
    url = f"{hold.url.rstrip('/')}/api/v1/events/{quote(key, safe='/')}"
    headers = {"Authorization": f"Bearer {hold.token}"}
    deadline = time.monotonic() + hold.timeout_s
    while True:
        try:
            r = httpx.get(url, headers=headers, timeout=10.0)
            got = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            got = {}  # the service is briefly away: keep asking until the deadline
        if got.get("decision") == "approved":
            return Decision(True, f"escalate{rule}; approved by {got.get('reviewer')}", check)
        if got.get("decision") == "rejected":
            note = f": {got['note']}" if got.get("note") else ""
            who = got.get("reviewer") or "a reviewer (page resolved without approval)"
            return Decision(False, f"vigil held this call to {name} for review and {who} "
                                   f"rejected it{note}; it was not run", check)
        if time.monotonic() >= deadline:
            return Decision(fail_open, f"vigil held this call to {name} for review{rule}; no "
                            f"reviewer answered within {hold.timeout_s:g} s; {unheld}", check)
        time.sleep(max(0.0, min(hold.poll_s, deadline - time.monotonic())))


def upstream_name(upstream: str | list[str]) -> str:
    """The server's name in tool rules and logs: its command's, or its URL's host."""
    if isinstance(upstream, str):
        from urllib.parse import urlsplit

        return urlsplit(upstream).hostname or upstream
    return upstream[0].rsplit("/", 1)[-1]


async def run_proxy(screen: Screen, upstream: str | list[str], *, server: str = "",
                    monitor_only: bool = False, fail_open: bool = False,
                    hide_poisoned: bool = False, stream: StepStream | None = None,
                    headers: dict[str, str] | None = None, hold: Hold | None = None,
                    log: Log = _stderr) -> None:
    """Serve the proxy on this process's stdin/stdout until the client goes away.
    ``upstream``: the real server, a command (with its arguments) started as a subprocess
    over stdio, or the URL of a server on streamable HTTP (``headers`` sent with each
    request, e.g. its ``Authorization``). ``stream``: each screened call's step goes to it,
    blocked ones too. ``hold``: escalated calls wait for a human's verdict there."""
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
            check = d.check
            if (hold is not None and not monitor_only and check is not None
                    and check.decision == "escalate"):
                d = await anyio.to_thread.run_sync(
                    lambda: hold_for_review(hold, session, action, check, fail_open=fail_open,
                                            log=log))
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
