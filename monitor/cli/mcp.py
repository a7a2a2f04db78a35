"""`monitor mcp`: vigil in front of an MCP server (:mod:`monitor.integrations.mcp_proxy`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from monitor.cli.common import CliError

EXAMPLES = """examples:
  monitor mcp -- python -m mcp_server_git --repository ~/repo
  monitor mcp --monitor-only -- npx -y @modelcontextprotocol/server-filesystem ~/work
  monitor mcp --service http://127.0.0.1:8000 -- uvx mcp-server-time
  monitor mcp --service http://127.0.0.1:8000 --hold-timeout 300 -- uvx mcp-server-time
  monitor mcp --upstream https://mcp.example.com/mcp --header 'Authorization: Bearer ...'

In an MCP client's config, put `monitor mcp [options] --` before the server's command."""


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
    token = args.token or os.environ.get("VIGIL_TOKEN")
    hold = None
    if args.hold_timeout is not None:
        if not args.hold_timeout > 0:
            raise CliError(f"--hold-timeout {args.hold_timeout:g}: expected seconds > 0")
        if not args.service or not token:
            raise CliError("--hold-timeout pages a reviewer on the paging service: give its "
                           "--service URL and a producer token (--token or $VIGIL_TOKEN)")
        from monitor.integrations.mcp_proxy import Hold

        hold = Hold(args.service, token, args.hold_timeout)
    from monitor.integrations.common import StepStream, screen_from

    screen = screen_from(args.service, token, args.policy)
    stream = StepStream.from_env()  # a broker: the steps go to the stream
    where = f"; steps to {stream.topic}" if stream is not None else ""
    print(f"vigil: screening the tool calls of {args.upstream or ' '.join(command)}"
          + (" (monitor only)" if args.monitor_only else "") + where, file=sys.stderr)
    try:
        anyio.run(lambda: run_proxy(screen, upstream, server=args.server_name or "",
                                    monitor_only=args.monitor_only, fail_open=args.fail_open,
                                    hide_poisoned=args.hide_poisoned, stream=stream,
                                    headers=headers, hold=hold))
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
                   help="forward a call the screener failed on, or one held past "
                   "--hold-timeout (default: refuse it)")
    p.add_argument("--hold-timeout", type=float, metavar="SECONDS",
                   help="hold an escalated call while a page on --service asks a human: a "
                   "verdict 'not harmful' forwards it; 'harmful', a page resolved without "
                   "one, or no answer in SECONDS refuses it (default: escalated calls are "
                   "forwarded and logged)")
    p.add_argument("--hide-poisoned", action="store_true",
                   help="leave tools whose descriptions carry instruction-like text out of "
                   "tools/list")
    p.add_argument("server_command", nargs=argparse.REMAINDER,
                   help="-- then the MCP server's command and arguments")
    p.set_defaults(fn=cmd_mcp)
