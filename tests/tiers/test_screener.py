"""The screener on real (tiny) bundles: L0 on every step, L1 only on what L0 escalates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from monitor.calibrate import load_split
from monitor.pipeline import load_screener
from monitor.tiers import CalibratedPolicy


def test_tiny_policy_records_what_it_was_fitted_on(tiny_policy: Path) -> None:
    policy = CalibratedPolicy.load(tiny_policy)
    assert policy.data["train"] and policy.data["val"]
    assert set(policy.data["models"]) == {"worldmodel", "probes", "provenance"}
    assert all(g.threshold > 0 for g in policy.gates)
    raw = json.loads(tiny_policy.read_text())
    assert all(w >= 0 for g in raw["gates"] for w in g["weights"].values())
    val = policy.metrics["val"]
    # the cascade passes about its budgets of benign validation steps (it was set there)
    assert val["benign_share_reaching_L1"] <= 0.5 + 1e-9
    assert val["benign_share_reaching_L2"] <= 0.2 + 1e-9


def test_screener_escalates_harmful_steps_further(small_agentdojo: Path, tiny_policy: Path) -> None:
    screener = load_screener(tiny_policy, reviewer=False)
    split = load_split([small_agentdojo], "val")
    verdicts = screener.screen(split.steps, through=2)
    tiers = np.array([v.tier for v in verdicts])
    assert len(verdicts) == len(split.steps)
    assert {v.step_id for v in verdicts} == {s.step_id for s in split.steps}
    # L1 ran exactly on the steps L0 escalated
    for v in verdicts:
        assert ("probe_harm" in v.signals) == (v.tier >= 1)
        assert "wm_harm_pre" in v.signals and "rule_destructive" in v.signals
        assert 0.0 <= v.score <= 1.0
        assert v.flagged == (v.tier >= 3)
    assert tiers[split.y == 1].mean() > tiers[split.y == 0].mean()


def test_pre_execution_check_uses_the_predicted_state(small_agentdojo: Path,
                                                      tiny_policy: Path) -> None:
    screener = load_screener(tiny_policy, reviewer=False)
    split = load_split([small_agentdojo], "val")
    st = split.steps[0]
    traj = st.trajectory_so_far()
    proposed = traj.steps[-1].action
    check = screener.check_action(traj.model_copy(update={"steps": traj.steps[:-1]}), proposed)
    assert check.decision in {"allow", "escalate", "block"}
    assert "wm_harm_pre" in check.signals and "wm_harm_post" not in check.signals
