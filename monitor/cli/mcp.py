"""`monitor mcp`: vigil in front of an MCP server (:mod:`monitor.integrations.mcp_proxy`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from monitor.cli.common import CliError

EXAMPLES = """examples:
  monitor mcp -- python -m mcp_server_git --repository ~/repo
  monitor mcp --monitor-only -- npx -y @modelcontextprotocol/server-filesystem ~/work
  monitor mcp --service http://127.0.0.1:8000 -- uvx mcp-server-time
  monitor mcp --upstream https://mcp.example.com/mcp --header 'Authorization: Bearer ...'

In an MCP client's config, put `monitor mcp [options] --` before the server's command."""


def _service_screen(url: str, token: str | None) -> Any:
    """A screen function that asks a running paging service (``POST /v1/screen``)."""
    import urllib.request

    from monitor.pipeline import ActionCheck

    def screen(trajectory: Any, action: Any) -> ActionCheck:
        body = json.dumps({"trajectory": trajectory.model_dump(mode="json"),
                           "action": action.model_dump(mode="json")}).encode()
        req = urllib.request.Request(f"{url.rstrip('/')}/v1/screen", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=30) as r:
            got = json.loads(r.read())
        return ActionCheck(got["decision"], int(got["tier"]), float(got["score"]),
                           got.get("signals") or {}, float(got["latency_ms"]) / 1000,
                           got.get("rule"))

    return screen


def cmd_mcp(args: argparse.Namespace) -> int:
    import anyio

    from monitor.integrations.mcp_proxy import run_proxy

    command = [c for c in args.server_command if c != "--"]
    if command and args.upstream:
        raise CliError("give the MCP server either as --upstream URL or as a command after "
                       "--, not both")
    if not command and not args.upstream:
        raise CliError("name the MCP server: its command after --, e.g. `monitor mcp -- "
                       "python -m mcp_server_git --repository .`, or its streamable HTTP "
                       "URL, e.g. `monitor mcp --upstream http://127.0.0.1:8000/mcp`")
    if args.upstream and not args.upstream.startswith(("http://", "https://")):
        raise CliError(f"--upstream {args.upstream!r}: expected an http:// or https:// URL")
    headers = {}
    for h in args.header or []:
        key, sep, value = h.partition(":")
        if not sep or not key.strip():
            raise CliError(f"--header {h!r}: expected 'Name: value'")
        headers[key.strip()] = value.strip()
    upstream: str | list[str] = args.upstream or command
    if args.service:
        screen = _service_screen(args.service, args.token or os.environ.get("VIGIL_TOKEN"))
    else:
        from monitor.defaults import ensure_policy
        from monitor.pipeline import load_screener

        screener = load_screener(ensure_policy(args.policy), reviewer=False)
        screen = screener.check_action
    from monitor.integrations.common import StepStream

    stream = StepStream.from_env()  # a broker: the steps go to the stream
    where = f"; steps to {stream.topic}" if stream is not None else ""
    print(f"vigil: screening the tool calls of {args.upstream or ' '.join(command)}"
          + (" (monitor only)" if args.monitor_only else "") + where, file=sys.stderr)
    try:
        anyio.run(lambda: run_proxy(screen, upstream, server=args.server_name or "",
                                    monitor_only=args.monitor_only, fail_open=args.fail_open,
                                    hide_poisoned=args.hide_poisoned, stream=stream,
                                    headers=headers))
    finally:
        if stream is not None:
            stream.close()
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "mcp",
        help="run an MCP server behind vigil: every tool call screened before it is forwarded",
        description="A stdio MCP server that starts the real one (or connects to it over "
        "streamable HTTP with --upstream) and forwards to it; each "
        "tools/call is screened first (L0 and L1, the policy's tool rules): a blocked call "
        "never reaches the server and the client gets isError with the reason.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", help="calibrated policy (default: as monitor screen picks it)")
    p.add_argument("--service", metavar="URL",
                   help="ask a running paging service's POST /v1/screen instead of loading "
                   "the models here (token: --token or $VIGIL_TOKEN)")
    p.add_argument("--token", help="the service's producer token")
    p.add_argument("--upstream", metavar="URL",
                   help="the MCP server's streamable HTTP endpoint (e.g. "
                   "http://127.0.0.1:8000/mcp), instead of a command after --")
    p.add_argument("--header", action="append", metavar="'NAME: VALUE'",
                   help="an HTTP header for --upstream (repeatable), e.g. 'Authorization: "
                   "Bearer ...'")
    p.add_argument("--server-name", help="the MCP server's name in tool rules (default: its "
                   "command's name, or --upstream's host)")
    p.add_argument("--monitor-only", action="store_true",
                   help="never block: screen, log and forward every call")
    p.add_argument("--fail-open", action="store_true",
                   help="forward a call the screener failed on (default: refuse it)")
    p.add_argument("--hide-poisoned", action="store_true",
                   help="leave tools whose descriptions carry instruction-like text out of "
                   "tools/list")
    p.add_argument("server_command", nargs=argparse.REMAINDER,
                   help="-- then the MCP server's command and arguments")
    p.set_defaults(fn=cmd_mcp)


def cmd_hook(args: argparse.Namespace) -> int:
    """``monitor hook claude-code``: one PreToolUse payload on stdin, the answer on stdout."""
    from monitor.integrations.claude_code import answer

    raw = sys.stdin.read()
    try:
        payload = json.loads(raw)
    except ValueError as e:
        raise CliError(f"the hook payload on stdin is not JSON ({e})") from None
    if not isinstance(payload, dict):
        raise CliError("the hook payload on stdin must be a JSON object")
    if args.service:
        screen = _service_screen(args.service, args.token or os.environ.get("VIGIL_TOKEN"))
    else:
        from monitor.defaults import ensure_policy
        from monitor.pipeline import load_screener

        screen = load_screener(ensure_policy(args.policy), reviewer=False).check_action
    print(json.dumps(answer(payload, screen, approve=args.approve, fail_open=args.fail_open)))
    return 0


def add_hook_parser(sub: Any) -> None:
    h = sub.add_parser("hook", help="answer an agent harness's tool hook (Claude Code)")
    hs = h.add_subparsers(dest="harness", metavar="HARNESS", required=True)
    c = hs.add_parser(
        "claude-code",
        help="a PreToolUse hook: the payload on stdin, the decision on stdout",
        description="Screens the tool call of a Claude Code PreToolUse payload in the "
        "session so far (its transcript) and answers deny (blocked), ask (escalated) or "
        "nothing (allowed: Claude Code's own permissions apply). Loading the models takes "
        "seconds per call: point --service at a running paging service for speed.",
        epilog='settings.json: {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": '
        '[{"type": "command", "command": "monitor hook claude-code --service '
        'http://127.0.0.1:8000"}]}]}}')
    c.add_argument("--policy", help="calibrated policy (default: as monitor screen picks it)")
    c.add_argument("--service", metavar="URL", help="ask a running paging service's "
                   "POST /v1/screen (token: --token or $VIGIL_TOKEN)")
    c.add_argument("--token", help="the service's producer token")
    c.add_argument("--approve", action="store_true",
                   help="answer allow for allowed calls (skipping Claude Code's own prompts)")
    c.add_argument("--fail-open", action="store_true",
                   help="when screening fails, answer nothing (default: ask the user)")
    c.set_defaults(fn=cmd_hook)


def cmd_ingest_otlp(args: argparse.Namespace) -> int:
    """``monitor ingest otlp FILE``: OpenTelemetry GenAI traces as trajectories."""
    from pathlib import Path

    from monitor.integrations.otlp import read_otlp_file, trajectories_from_otlp

    src = Path(args.file)
    if not src.exists():
        raise CliError(f"{src}: no such file")
    runs = trajectories_from_otlp(read_otlp_file(src),
                                  warn=lambda m: print(f"{src}: {m}", file=sys.stderr))
    text = "".join(t.model_dump_json() + "\n" for t in runs)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    print(f"{src}: {len(runs)} traces with tool calls, "
          f"{sum(len(t.steps) for t in runs)} steps" + (f"; wrote {args.out}" if args.out
                                                        else ""), file=sys.stderr)
    return 0


def add_ingest_parser(sub: Any) -> None:
    i = sub.add_parser("ingest", help="turn other systems' records into trajectories")
    isub = i.add_subparsers(dest="format", metavar="FORMAT", required=True)
    o = isub.add_parser(
        "otlp", help="OpenTelemetry GenAI traces (OTLP JSON) as trajectories",
        description="One trajectory per trace: its execute_tool spans (GenAI semantic "
        "conventions) or OpenInference TOOL spans, in start order, as steps; the task from "
        "the first chat / invoke_agent (or LLM / AGENT) span's input messages. `monitor "
        "screen` reads such a file directly.")
    o.add_argument("file", help="OTLP JSON: one ExportTraceServiceRequest per line, or one")
    o.add_argument("--out", help="trajectories JSON Lines (default: standard output)")
    o.set_defaults(fn=cmd_ingest_otlp)
