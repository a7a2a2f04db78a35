"""Per-tool rules a team writes into its policy: tools it trusts, tools it never lets run,
tools it only watches, and what an inline caller does when the screener is down.

In the policy file (YAML or the calibrated JSON's ``config``)::

    tools:
      rules:
        - {match: "delete_*", action: deny}            # never runs: blocked with the reason
        - {match: "git_*", server: git, action: monitor}  # never blocked; scored and paged
        - {match: "get_*", action: allow}              # never blocked (a known false positive)
        - {match: "send_money", action: review}        # escalated: a human decides first
      on_screener_error: closed                        # or open: run the call when it fails

``match`` is a shell-style pattern (``*``, ``?``, ``[...]``) over the tool name, compared
case-insensitively; ``server`` (optional) is the MCP server the tool comes from. The first
rule that matches decides; a tool no rule matches is decided by the gates. ``review``
escalates the call whatever it scores: an inline caller that holds escalated calls (``monitor
mcp --hold-timeout``) waits for a human's verdict; others treat it as their escalations
(the Agents SDK and LangChain gates: their ``escalate`` setting). Every action is
still scored and recorded, so a rule never hides a step from the stream and the dashboards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

RuleAction = Literal["allow", "deny", "monitor", "review"]
ACTIONS: tuple[RuleAction, ...] = ("allow", "deny", "monitor", "review")


@dataclass(frozen=True)
class ToolRule:
    match: str
    action: RuleAction
    server: str | None = None

    def matches(self, tool: str, server: str | None = None) -> bool:
        if self.server is not None and (server or "").casefold() != self.server.casefold():
            return False
        return fnmatchcase(tool.casefold(), self.match.casefold())

    def describe(self) -> str:
        where = f" of server {self.server!r}" if self.server else ""
        return f"the policy's tool rule {{match: {self.match!r}{where}, action: {self.action}}}"


@dataclass(frozen=True)
class ToolRules:
    rules: tuple[ToolRule, ...] = ()
    on_screener_error: Literal["closed", "open"] = "closed"

    def rule_for(self, tool: str | None, server: str | None = None) -> ToolRule | None:
        """The first rule matching ``tool`` (of ``server``), None for none (or no tool)."""
        if not tool:
            return None
        return next((r for r in self.rules if r.matches(tool, server)), None)

    def __bool__(self) -> bool:
        return bool(self.rules) or self.on_screener_error != "closed"

    def to_dict(self) -> dict[str, Any]:
        return {"rules": [{"match": r.match, "action": r.action,
                           **({"server": r.server} if r.server is not None else {})}
                          for r in self.rules],
                "on_screener_error": self.on_screener_error}

    @classmethod
    def from_dict(cls, d: Any, fail: Any) -> ToolRules:
        """Validate the policy's ``tools`` section; ``fail(message)`` makes the one error
        (naming the file) that is raised."""
        if not isinstance(d, Mapping):
            raise fail("tools must be a mapping with 'rules' and 'on_screener_error'")
        unknown = set(d) - {"rules", "on_screener_error"}
        if unknown:
            raise fail(f"unknown key tools.{sorted(unknown)[0]}")
        on_error = d.get("on_screener_error", "closed")
        if on_error not in ("closed", "open"):
            raise fail(f"tools.on_screener_error must be 'closed' or 'open', got {on_error!r}")
        raw = d.get("rules") or []
        if not isinstance(raw, list):
            raise fail("tools.rules must be a list of {match, action[, server]}")
        rules = []
        for n, r in enumerate(raw):
            where = f"tools.rules[{n}]"
            if not isinstance(r, Mapping):
                raise fail(f"{where} must be a mapping {{match, action[, server]}}")
            bad = set(r) - {"match", "action", "server"}
            if bad:
                raise fail(f"unknown key {where}.{sorted(bad)[0]} (a rule has match, action "
                           "and server)")
            match, action, server = r.get("match"), r.get("action"), r.get("server")
            if not isinstance(match, str) or not match.strip():
                raise fail(f"{where}.match must be a tool-name pattern such as 'delete_*'")
            if action not in ACTIONS:
                raise fail(f"{where}.action must be one of {', '.join(ACTIONS)}, got "
                           f"{action!r}")
            if server is not None and (not isinstance(server, str) or not server.strip()):
                raise fail(f"{where}.server must be an MCP server name")
            rules.append(ToolRule(match.strip(), action, server))
        return cls(tuple(rules), on_error)
