"""Trajectory verdicts of `monitor screen`: the calibrated aggregation of step scores
(monitor.trajectory), on the tiny real policy and the small real AgentDojo build."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from monitor.cli.main import main
from monitor.trajectory import TrajectoryAggregation, aggregate, fit_aggregation


def _rows(small_agentdojo: Path, splits: tuple[str, ...]) -> list[dict]:
    rows = [json.loads(line) for line in (small_agentdojo / "trajectories.jsonl").open()]
    return [r for r in rows if r["meta"]["split"] in splits]


def _screen(rows: list[dict], policy: Path, tmp: Path) -> list[dict]:
    src, dst = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["screen", str(src), "--out", str(dst), "--policy", str(policy)]) == 0
    lines = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [x["trajectory_id"] for x in lines] == [r["trajectory_id"] for r in rows]
    return lines


def _logit(v: float) -> float:
    v = min(max(v, 1e-4), 1 - 1e-4)
    return math.log(v / (1 - v))


def _documented_legacy_score(step_scores: list[float], section: dict) -> float:
    """The legacy form of monitor.trajectory, written out again: features of the clipped step
    scores, standardised, through the logistic regression."""
    s = np.clip(np.array(step_scores, dtype=float), 1e-4, 1 - 1e-4)
    top = np.sort(s)[::-1]
    noisy_or = np.clip(1 - np.prod(1 - s), 1e-4, 1 - 1e-4)
    f = np.array([_logit(top[0]), _logit(noisy_or), _logit(top[:2].mean()), math.log(len(s))])
    z = (f - np.array(section["mean"])) / np.array(section["scale"])
    return 1 / (1 + math.exp(-(z @ np.array(section["coef"]) + section["intercept"])))


def _documented_tail(score: float, null: dict) -> float:
    """The share of benign steps scoring at least ``score``, as monitor.trajectory documents
    it: from the null's quantiles of benign logits (a tie counts from its first place), at
    least 1/(n+1), an exponential tail past the highest."""
    q = np.array(null["logit_quantiles"])
    floor = 1 / (null["steps"] + 1)
    x = _logit(score)
    if x > q[-1]:
        upper = q[q >= q[int(0.95 * (len(q) - 1))]]
        tau = max(float(np.mean(q[-1] - upper)), 0.25)
        return floor * math.exp(-(x - q[-1]) / tau)
    u, first = np.unique(q, return_index=True)
    cdf = float(np.interp(x, u, first / (len(q) - 1)))
    return (1 - cdf) * (1 - floor) + floor


def _documented_score(step_scores: list[float], section: dict) -> float:
    """The length-aware form: the highest step's tail probability corrected for the run's
    length (P(the highest of n benign steps is as rare)), the second highest's likewise
    (P(two of n are)), as -log, standardised, through the logistic regression."""
    from scipy.stats import binom

    s = sorted(step_scores, reverse=True)
    n = len(s)
    p1 = _documented_tail(s[0], section["null"])
    f = [-math.log(1 - (1 - p1) ** n)]
    if section["features"] == ["null_max", "null_top2"]:
        f.append(-math.log(binom.sf(1, n, _documented_tail(s[1], section["null"])))
                 if n > 1 else 0.0)
    z = (np.array(f) - np.array(section["mean"])) / np.array(section["scale"])
    return 1 / (1 + math.exp(-(z @ np.array(section["coef"]) + section["intercept"])))


@pytest.fixture(scope="module")
def calibration_screened(
    small_agentdojo: Path, tiny_policy: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict], list[dict]]:
    """The train and val trajectories the tiny policy was calibrated on, screened with it."""
    rows = _rows(small_agentdojo, ("train", "val"))
    return rows, _screen(rows, tiny_policy, tmp_path_factory.mktemp("screen-cal"))


def test_screen_trajectory_scores_follow_the_documented_aggregation(
    tiny_policy: Path, calibration_screened: tuple[list[dict], list[dict]]
) -> None:
    section = json.loads(tiny_policy.read_text())["trajectory"]
    assert section["features"] == ["null_max", "null_top2"]
    assert section["budget"] == 0.05 and min(section["coef"]) >= 0
    _, lines = calibration_screened
    not_the_max = 0
    for line in lines:
        steps = [s["score"] for s in line["steps"]]
        expected = _documented_score(steps, section)
        assert line["score"] == pytest.approx(expected, abs=2e-6), line["trajectory_id"]
        paged = any(s["flagged"] for s in line["steps"])
        assert line["flagged"] == (paged or line["score"] >= section["threshold"])
        assert line["tier"] == max(s["tier"] for s in line["steps"])
        not_the_max += abs(line["score"] - max(steps)) > 1e-3
    assert not_the_max > len(lines) // 2  # the aggregation, not the highest step, scores


def test_a_policy_without_a_trajectory_section_falls_back_to_the_highest_step(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path
) -> None:
    old = json.loads(tiny_policy.read_text())
    del old["trajectory"]  # as in a policy file calibrated before trajectory verdicts
    policy = tmp_path / "old-policy.json"
    policy.write_text(json.dumps(old))
    rows = _rows(small_agentdojo, ("val",))
    lines = _screen(rows, policy, tmp_path)
    for line in lines:
        assert line["score"] == max(s["score"] for s in line["steps"])
        assert line["flagged"] == any(s["flagged"] for s in line["steps"])


def test_the_fitted_aggregation_ranks_harmful_calibration_trajectories_above_benign(
    calibration_screened: tuple[list[dict], list[dict]],
) -> None:
    rows, lines = calibration_screened
    y = [r["label"] for r in rows]
    assert 0 < sum(y) < len(y)
    auroc = roc_auc_score(y, [x["score"] for x in lines])
    assert auroc >= 0.8, auroc


def _benign_flagged(rows: list[dict], lines: list[dict]) -> tuple[int, int, int]:
    """(benign trajectories, those a step flagged, those flagged)."""
    benign = [x for r, x in zip(rows, lines, strict=True) if r["label"] == 0]
    paged = sum(any(s["flagged"] for s in x["steps"]) for x in benign)
    return len(benign), paged, sum(x["flagged"] for x in benign)


def test_flagged_respects_the_trajectory_budget_on_benign_calibration_trajectories(
    small_agentdojo: Path, narrow_policy: Path, tmp_path: Path
) -> None:
    budget = json.loads(narrow_policy.read_text())["trajectory"]["budget"]
    assert budget == 0.25
    rows = _rows(small_agentdojo, ("train", "val"))
    lines = _screen(rows, narrow_policy, tmp_path)
    n, paged, flagged = _benign_flagged(rows, lines)
    allowed = math.floor(budget * n)
    assert paged < allowed  # the score has a share of the budget to spend
    assert paged < flagged <= allowed  # it spends it, and no more


def test_a_paged_step_flags_its_trajectory_even_past_the_budget(
    tiny_policy: Path, calibration_screened: tuple[list[dict], list[dict]]
) -> None:
    """The tiny policy pages a human on many benign steps: every such trajectory is flagged,
    and its score flags no other benign one."""
    budget = json.loads(tiny_policy.read_text())["trajectory"]["budget"]
    n, paged, flagged = _benign_flagged(*calibration_screened)
    assert paged > math.floor(budget * n)
    assert flagged == paged


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5])
def test_the_threshold_spends_the_budget_on_real_step_scores(
    budget: float, calibration_screened: tuple[list[dict], list[dict]]
) -> None:
    """Fitted again on the screened step scores, no step flagged: at most the budget's share
    of benign trajectories reach the threshold, and the next benign score down would pass
    more (the threshold is the lowest that keeps the budget)."""
    rows, lines = calibration_screened
    y = np.array([r["label"] for r in rows])
    scores = [[s["score"] for s in x["steps"]] for x in lines]
    none = [[False] * len(s) for s in scores]
    agg = fit_aggregation(scores, none, y, budget=budget)
    verdicts = [aggregate(s, f, agg) for s, f in zip(scores, none, strict=True)]
    benign = [v for v, yi in zip(verdicts, y, strict=True) if yi == 0]
    allowed = math.floor(budget * len(benign))
    assert 0 < sum(v[1] for v in benign) <= allowed
    below = [v[0] for v in benign if not v[1]]
    assert sum(v[0] >= max(below) for v in benign) > allowed


@functools.cache
def _synthetic_aggregation() -> TrajectoryAggregation:
    rng = np.random.default_rng(0)
    train = [list(rng.beta(1 + 3 * h, 4 - 3 * h, size=rng.integers(1, 8))) for h in (0, 1) * 40]
    return fit_aggregation(train, [[False] * len(t) for t in train], np.array([0, 1] * 40))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=12),
    st.integers(0, 11),
    st.floats(0, 1),
)
def test_raising_a_step_score_never_lowers_the_trajectory_score(
    scores: list[float], which: int, bump: float
) -> None:
    agg = _synthetic_aggregation()
    i = which % len(scores)
    higher = [*scores[:i], max(scores[i], bump), *scores[i + 1 :]]
    flags = [False] * len(scores)
    assert aggregate(higher, flags, agg)[0] >= aggregate(scores, flags, agg)[0]


def test_a_legacy_section_still_scores_as_it_was_fitted(
    calibration_screened: tuple[list[dict], list[dict]],
) -> None:
    """A policy calibrated before the length-aware form (its section names the four legacy
    features) scores runs as it did."""
    rows, lines = calibration_screened
    scores = [[s["score"] for s in x["steps"]] for x in lines]
    agg = fit_aggregation(scores, [[False] * len(s) for s in scores],
                          np.array([r["label"] for r in rows]), form="legacy")
    section = agg.to_dict()
    again = TrajectoryAggregation.from_dict(json.loads(json.dumps(section)))
    for s in scores:
        assert again.score(s) == pytest.approx(_documented_legacy_score(s, section), abs=2e-6)


def test_a_long_benign_run_of_repeated_steps_is_not_flagged_where_its_first_steps_are_not(
    tiny_policy: Path, calibration_screened: tuple[list[dict], list[dict]]
) -> None:
    """Each benign calibration run its score does not flag, its steps repeated up to 16
    times (a run of 16x the steps, none new): still not flagged, and scored no higher. The
    legacy form, fitted on the same runs, flags some of them (what the length-aware form
    is for)."""
    policy = json.loads(tiny_policy.read_text())
    agg = TrajectoryAggregation.from_dict(policy["trajectory"])
    rows, lines = calibration_screened
    quiet = [[s["score"] for s in x["steps"]] for r, x in zip(rows, lines, strict=True)
             if r["label"] == 0 and not x["flagged"]]
    assert len(quiet) >= 5
    for s in quiet:
        for k in (2, 4, 16):
            score, flagged = aggregate(s * k, [False] * len(s) * k, agg)
            assert not flagged and score <= agg.score(s)
    scores = [[s["score"] for s in x["steps"]] for x in lines]
    legacy = fit_aggregation(scores, [[False] * len(s) for s in scores],
                             np.array([r["label"] for r in rows]), form="legacy")
    assert any(aggregate(s * 16, [False] * len(s) * 16, legacy)[1] for s in quiet)
