"""`monitor hook claude-code`: a Claude Code PreToolUse hook
(:mod:`monitor.integrations.claude_code`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from monitor.cli.common import CliError


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
    from monitor.integrations.common import screen_from

    screen = screen_from(args.service, args.token or os.environ.get("VIGIL_TOKEN"), args.policy)
    print(json.dumps(answer(payload, screen, approve=args.approve, fail_open=args.fail_open)))
    return 0


def add_parser(sub: Any) -> None:
    h = sub.add_parser("hook", help="answer an agent harness's tool hook (Claude Code)")
    hs = h.add_subparsers(dest="harness", metavar="HARNESS", required=True)
    c = hs.add_parser(
        "claude-code",
        help="a PreToolUse hook: the payload on stdin, the decision on stdout",
        description="Screens the tool call of a Claude Code PreToolUse payload in the "
        "session so far (its transcript) and answers deny (blocked), ask (escalated) or "
        "nothing (allowed: Claude Code's own permissions apply). Loading the models takes "
        "seconds per call: point --service at a running paging service for speed (or use "
        "its POST /v1/hooks/claude-code as an http hook).",
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
