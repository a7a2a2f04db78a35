"""Thresholds re-fitted to a user's own known-good traffic (``monitor calibrate --benign``).

A policy calibrated on the training corpora holds its budgets on traffic like them; a team's
own agents (other tools, longer runs) can push far more of their benign steps past a gate.
:func:`refit_thresholds` keeps every model and every gate's stacking weights and moves only
the thresholds, each to where it passes its budget of the user's benign steps (as
calibration sets them on ``val``): gate 0 on every step's L0 score, gate 1 on the steps the
new gate 0 passes, gate 2 on those the new gate 1 passes (after their review); the
thresholds for proposed actions and the block threshold the same way on the steps' signals
before execution; the trajectory threshold at the trajectory budget of the user's runs.
What changed is reported: each threshold before and after, and the share of the user's
steps and runs that each lets through.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from monitor.pipeline import Screener
from monitor.scorers.base import post_execution_signals
from monitor.screening import ScreenStep, screen_steps_of
from monitor.tiers import CalibratedPolicy, Gate, threshold_for
from monitor.trajectory import aggregate, budget_threshold
from streams.records import Trajectory

Log = Callable[[str], None]

# fewer benign steps than this leave the tightest budgets to a handful of scores
MIN_BENIGN_STEPS = 200


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def refit_thresholds(
    screener: Screener,
    trajectories: Sequence[Trajectory],
    *,
    source: str = "",
    log: Log = _stderr,
) -> tuple[CalibratedPolicy, dict[str, Any]]:
    """``screener``'s policy with its thresholds re-fitted to ``trajectories`` (known-good
    runs; a step labelled harmful is left out) and the report of what changed. Runs L0 on
    every step, L1 and the L2 reviewer (where the screener has one) on the steps the new
    gates pass."""
    policy = screener.policy
    steps: list[ScreenStep] = []
    owner: list[int] = []
    for n, t in enumerate(trajectories):
        for s in screen_steps_of(t):
            if s.step.label != 1:
                steps.append(s)
                owner.append(n)
    if len(steps) < MIN_BENIGN_STEPS:
        raise ValueError(f"{source or 'the file'}: {len(steps)} benign steps; re-fitting the "
                         f"thresholds needs at least {MIN_BENIGN_STEPS} (a 1 % budget of "
                         "fewer rests on one or two scores)")
    n_steps = len(steps)
    post = post_execution_signals()
    log(f"benign: scoring {n_steps} steps of {len(trajectories)} runs at L0")
    rows = screener.tier_signals(0, steps)
    through = 2 if screener.reviewer is not None else 1
    everyone = np.arange(n_steps)
    reach = {"new": everyone, "old": everyone}  # the steps reaching the gate being fitted
    reach_pre = everyone  # the same for proposals (signals before execution), new gates
    gates: list[Gate] = []
    block = policy.block_threshold
    for k, old in enumerate(policy.gates):
        todo = np.union1d(reach["new"], reach["old"])
        if k == 1 and len(todo):
            log(f"benign: L1 on the {len(todo)} steps the L0 gate passes (old or new)")
            for i, r in zip(todo, screener.tier_signals(1, [steps[i] for i in todo]),
                            strict=True):
                rows[i].update(r)
        if k == 2 and len(todo) and screener.reviewer is not None:
            log(f"benign: the L2 reviewer on the {len(todo)} steps the L1 gate passes "
                "(old or new)")
            got = screener.review_signals([steps[i] for i in todo], [rows[i] for i in todo])
            for i, v in zip(todo, got, strict=True):
                if v is not None:
                    rows[i].update(v.signals())
        p = old.probability([rows[i] for i in reach["new"]])
        thr = threshold_for(p, old.budget, n_steps)
        pre_thr = old.pre_threshold
        if k < 2 and old.pre_threshold is not None:
            p_pre = old.probability([{n: v for n, v in rows[i].items() if n not in post}
                                     for i in reach_pre])
            pre_thr = threshold_for(p_pre, old.budget, n_steps)
            if k == 1:
                block = threshold_for(p_pre, policy.config.block_budget, n_steps)
            reach_pre = reach_pre[p_pre >= pre_thr]
        gates.append(replace(old, threshold=thr, pre_threshold=pre_thr))
        reach = {"new": reach["new"][p >= thr],
                 "old": reach["old"][old.probability([rows[i] for i in reach["old"]])
                                     >= old.threshold]}
    refit = replace(policy, gates=(gates[0], gates[1], gates[2]), block_threshold=block)
    before = policy.decide_many(rows, through=through)
    after = refit.decide_many(rows, through=through)
    report: dict[str, Any] = {"steps": n_steps, "runs": len(trajectories), "gates": {},
                              "block_threshold_before": policy.block_threshold,
                              "block_threshold_after": block}
    for k, (old, new) in enumerate(zip(policy.gates, gates, strict=True)):
        report["gates"][f"L{k}->L{k + 1}"] = {
            "budget": old.budget, "threshold_before": old.threshold,
            "threshold_after": new.threshold,
            "share_passing_before": float(np.mean([d.tier > k for d in before])),
            "share_passing_after": float(np.mean([d.tier > k for d in after])),
        }
    # the trajectory threshold, on each run's final step scores under the new gates
    scores: dict[int, list[float]] = {}
    flags: dict[int, list[bool]] = {}
    old_scores: dict[int, list[float]] = {}
    old_flags: dict[int, list[bool]] = {}
    for n, d, o in zip(owner, after, before, strict=True):
        scores.setdefault(n, []).append(d.score)
        flags.setdefault(n, []).append(d.flagged)
        old_scores.setdefault(n, []).append(o.score)
        old_flags.setdefault(n, []).append(o.flagged)
    runs = sorted(scores)
    agg = policy.trajectory
    if agg is not None:
        run_scores = np.array([agg.score(scores[n]) for n in runs])
        paged = np.array([any(flags[n]) for n in runs])
        new_thr = budget_threshold(run_scores, paged, agg.budget)
        was = [aggregate(old_scores[n], old_flags[n], agg)[1] for n in runs]
        refit = replace(refit, trajectory=replace(agg, threshold=new_thr))
        now = [aggregate(scores[n], flags[n], refit.trajectory)[1] for n in runs]
        report["trajectory"] = {
            "budget": agg.budget, "threshold_before": agg.threshold,
            "threshold_after": new_thr,
            "share_flagged_before": float(np.mean(was)),
            "share_flagged_after": float(np.mean(now)),
        }
    digest = hashlib.sha256("\n".join(t.model_dump_json() for t in trajectories).encode())
    refit = replace(refit, metrics={**refit.metrics, "benign_refit": {
        "source": Path(source).name if source else "", "sha256": digest.hexdigest()[:16],
        **report}})
    return refit, report


def _share(p: np.ndarray, threshold: float, of: int) -> float:
    return float((p >= threshold).sum() / of) if of else 0.0


def describe(report: dict[str, Any]) -> list[str]:
    """The report as lines a person reads."""
    out = [f"re-fitted on {report['steps']} benign steps of {report['runs']} runs:"]
    for name, g in report["gates"].items():
        out.append(f"  gate {name} (budget {g['budget']:.1%}): threshold "
                   f"{g['threshold_before']:.4f} -> {g['threshold_after']:.4f}; passes "
                   f"{g['share_passing_before']:.1%} -> {g['share_passing_after']:.1%} of "
                   "these steps")
    out.append(f"  block threshold (proposed actions): {report['block_threshold_before']:.4f}"
               f" -> {report['block_threshold_after']:.4f}")
    if "trajectory" in report:
        t = report["trajectory"]
        out.append(f"  trajectory (budget {t['budget']:.1%}): threshold "
                   f"{t['threshold_before']:.4f} -> {t['threshold_after']:.4f}; flags "
                   f"{t['share_flagged_before']:.1%} -> {t['share_flagged_after']:.1%} of "
                   "these runs")
    return out
