"""Per-tool rules in the policy (monitor.tool_rules): validated in one sentence, matched by
pattern and MCP server, kept through a calibrated policy's JSON, and deciding a proposed call
the gates would decide otherwise, while the call is still scored."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from monitor.pipeline import load_screener
from monitor.tiers import CalibratedPolicy, PolicyError, policy_config_from_dict
from monitor.tool_rules import ToolRule, ToolRules
from streams.records import Action, Observation, Step, ToolCall, Trajectory

RULES = {"rules": [{"match": "delete_*", "action": "deny"},
                   {"match": "git_*", "server": "git", "action": "monitor"},
                   {"match": "Get_*", "action": "allow"}],
         "on_screener_error": "open"}


def test_rules_match_by_pattern_case_and_server() -> None:
    rules = policy_config_from_dict({"tools": RULES}).tools
    assert rules.rule_for("delete_file") == ToolRule("delete_*", "deny")
    assert rules.rule_for("DELETE_ALL") == ToolRule("delete_*", "deny")
    assert rules.rule_for("get_balance") == ToolRule("Get_*", "allow")
    assert rules.rule_for("git_commit", "git") == ToolRule("git_*", "monitor", "git")
    assert rules.rule_for("git_commit", "other") is None  # another server's git_*
    assert rules.rule_for("send_money") is None and rules.rule_for(None) is None
    assert rules.on_screener_error == "open"


@pytest.mark.parametrize("tools, says", [
    ({"rules": [{"match": "x", "action": "block"}]}, "tools.rules[0].action must be one of"),
    ({"rules": [{"action": "deny"}]}, "tools.rules[0].match must be a tool-name pattern"),
    ({"rules": [{"match": "x", "action": "deny", "tool": "y"}]}, "unknown key tools.rules[0].tool"),
    ({"rules": {"match": "x"}}, "tools.rules must be a list"),
    ({"on_screener_error": "maybe"}, "tools.on_screener_error must be 'closed' or 'open'"),
    ({"allow": ["x"]}, "unknown key tools.allow"),
    (["x"], "tools must be a mapping"),
])
def test_a_bad_rule_is_one_sentence_naming_it(tools: object, says: str) -> None:
    with pytest.raises(PolicyError) as e:
        policy_config_from_dict({"tools": tools}, source="policy.yaml")
    assert says in str(e.value) and str(e.value).startswith("policy.yaml: ")
    assert "\n" not in str(e.value)


def test_rules_travel_with_a_calibrated_policy_and_decide_its_proposals(
    tiny_policy: Path, tmp_path: Path
) -> None:
    plain = json.loads(tiny_policy.read_text())
    assert "tools" not in plain["config"]  # a policy without rules keeps its old form
    policy = CalibratedPolicy.load(tiny_policy)
    ruled = replace(policy, config=replace(policy.config,
                                           tools=ToolRules.from_dict(RULES, ValueError)))
    path = ruled.save(tmp_path / "ruled.json")
    again = CalibratedPolicy.load(path)
    assert again.config.tools == ruled.config.tools
    bare, screener = load_screener(tiny_policy, reviewer=False), load_screener(path,
                                                                              reviewer=False)
    step = Step(step_id="s0", index=0, observation=Observation(text="User: tidy my files"),
                action=Action(tool=ToolCall(name="list_files", arguments={})),
                result=Observation(text="a.txt b.txt"))
    traj = Trajectory(trajectory_id="t", task="Tidy my files.", steps=[step])
    calls = [Action(tool=ToolCall(name="delete_file", arguments={"path": "a.txt"})),
             Action(tool=ToolCall(name="get_file", arguments={"path": "a.txt"})),
             Action(tool=ToolCall(name="git_push", arguments={}, server="git")),
             Action(tool=ToolCall(name="rename_file", arguments={"path": "a.txt"}))]
    gated = bare.check_actions([(traj, a) for a in calls])
    got = screener.check_actions([(traj, a) for a in calls])
    assert [c.decision for c in got[:3]] == ["block", "allow", "allow"]
    assert "delete_*" in (got[0].rule or "") and "git" in (got[2].rule or "")
    # the gates' answer stands where no rule matches; every call is scored as before
    assert got[3].decision == gated[3].decision and got[3].rule is None
    for g, b in zip(got, gated, strict=True):
        assert (g.tier, g.score) == (b.tier, b.score)
