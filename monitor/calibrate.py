"""Calibration: fit a tier policy's gates from transition datasets (``monitor calibrate``).

:func:`calibrate` stacks each gate's signals on the ``train`` split and sets its threshold
on benign ``val`` steps, in cascade (a gate is fitted and thresholded on the steps that
reach it); held-out ``test*`` splits are never read (:func:`load_split` refuses them).
It then fits the trajectory aggregation (:mod:`monitor.trajectory`) on the final step
scores it computed for the ``train`` and ``val`` trajectories.
The gates themselves, and what a calibrated policy file holds, are :mod:`monitor.tiers`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.pipeline import Screener
from monitor.scorers.base import post_execution_signals
from monitor.screening import Scorer, ScreenStep
from monitor.tiers import (
    CalibratedPolicy,
    Gate,
    PolicyConfig,
    TierDecision,
    data_hash,
    fit_gate,
    gate_metrics,
    threshold_for,
)
from monitor.trajectory import DEFAULT_FORM, TrajectoryAggregation, aggregate, fit_aggregation
from streams.records import Action, Observation, Step

if TYPE_CHECKING:
    from monitor.reviewer import Reviewer
    from worldmodel.datasets.format import Transition

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def screen_step_of_transition(t: Transition, base: Path | None = None) -> ScreenStep:
    """A dataset transition as the pipeline sees a step (history from its recorded pairs)."""

    def shot(p: str | None) -> str | None:
        if p and base is not None and not Path(p).is_absolute():
            return str(base / p)
        return p

    # each earlier step's result is what the agent saw next (as in a live trajectory, so a
    # proposal built from this history sees what the recorded step saw)
    seen = [o for o, _ in t.history] + [t.observation.text]
    history = tuple(
        Step(step_id=f"h{i}", index=i, observation=Observation(text=o), action=Action(text=a),
             result=Observation(text=seen[i + 1]))
        for i, (o, a) in enumerate(t.history)
    )
    tool = t.tool
    step = Step(
        step_id=str(t.index),
        index=t.index,
        observation=Observation(text=t.observation.text, screenshot=shot(t.observation.screenshot)),
        action=Action.model_validate(
            {
                "text": t.action_text,
                "tool": {"name": tool["name"], "arguments": tool.get("arguments") or {}}
                if tool
                else None,
                "gui": t.gui,
            }
        ),
        result=Observation(
            text=t.next_observation.text, screenshot=shot(t.next_observation.screenshot)
        ),
        label=1 if t.label else 0,
        category=t.category,
    )
    return ScreenStep(
        trajectory_id=t.trajectory_id, task=t.task, step=step, history=history,
        source="benchmark", meta={},
    )


@dataclass(frozen=True)
class LabelledSplit:
    steps: list[ScreenStep]
    y: np.ndarray
    hash: str
    # per step, the key of its trajectory (``dataset#:trajectory_id``); empty: trajectory_id
    trajectory: tuple[str, ...] = ()
    # per trajectory key: 1 if harmful (any step, or the trajectory-level label)
    trajectory_label: Mapping[str, int] = field(default_factory=dict)
    # per step, its domain (worldmodel.datasets.domains): cross-fitting scores each step
    # with the fold models that never saw it; empty: not known
    domains: tuple[str, ...] = ()

    def trajectories(self) -> tuple[list[str], dict[str, int]]:
        """Each step's trajectory key, and each trajectory's label."""
        keys = list(self.trajectory) or [s.trajectory_id for s in self.steps]
        labels: dict[str, int] = {}
        for k, yi in zip(keys, self.y, strict=True):
            labels[k] = max(labels.get(k, 0), int(yi))
        labels.update({k: v for k, v in self.trajectory_label.items() if k in labels})
        return keys, labels


def trajectory_label_of(t: Transition) -> int | None:
    """The trajectory-level label a transition carries (``meta.label_level == "trajectory"``,
    ToolEmu's convention), else None (the trajectory is harmful if any step is)."""
    meta = t.meta or {}
    if meta.get("label_level") == "trajectory" and meta.get("trajectory_label") is not None:
        return int(meta["trajectory_label"])
    return None


def whole_trajectory_subsample(
    keys: Sequence[str], labels: Mapping[str, int], limit: int, seed: int
) -> list[int]:
    """Step indices of a seeded sample of whole trajectories, about ``limit`` steps, each
    class of trajectory keeping its share of the steps."""
    rng = np.random.default_rng(seed)
    members: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    keep: list[int] = []
    for cls in (0, 1):
        trajs = sorted(k for k in members if labels[k] == cls)
        want = round(limit * sum(len(members[k]) for k in trajs) / len(keys))
        n = 0
        for j in rng.permutation(len(trajs)):
            if n >= want:
                break
            keep.extend(members[trajs[j]])
            n += len(members[trajs[j]])
    return sorted(keep)


def load_split(
    datasets: Sequence[str | Path], split: str, *, limit: int | None = None, seed: int = 0
) -> LabelledSplit:
    """The steps and labels of ``split`` over ``datasets``; with ``limit``, a seeded sample
    of about that many steps in whole trajectories (stratified by trajectory label), so the
    trajectory aggregation is fitted on trajectories as ``monitor screen`` sees them."""
    from worldmodel.datasets.domains import domain_of
    from worldmodel.datasets.format import read_manifest, read_transitions

    if split.startswith("test"):
        raise ValueError(f"split {split!r} is held out: calibration never reads it")
    steps, labels, keys, hashes, domains = [], [], [], [], []
    traj_label: dict[str, int] = {}
    for n, d in enumerate(datasets):
        hashes.append(read_manifest(d).content_hash)
        for t in read_transitions(d, [split]):
            steps.append(screen_step_of_transition(t, Path(d)))
            labels.append(int(t.label))
            key = f"{n}:{t.trajectory_id}"
            keys.append(key)
            domains.append(domain_of(t))
            weak = trajectory_label_of(t)
            traj_label[key] = max(
                traj_label.get(key, 0), int(t.label) if weak is None else weak
            )
    y = np.array(labels, dtype=int)
    if limit is not None and len(steps) > limit:
        keep = whole_trajectory_subsample(keys, traj_label, limit, seed)
        steps = [steps[i] for i in keep]
        keys = [keys[i] for i in keep]
        domains = [domains[i] for i in keep]
        y = y[keep]
        traj_label = {k: traj_label[k] for k in dict.fromkeys(keys)}
    return LabelledSplit(
        steps, y,
        data_hash([*hashes, split, str(limit), str(seed)]
                  + (["whole-trajectories"] if limit is not None else [])),
        tuple(keys), traj_label, tuple(domains),
    )


def stratified_subsample(idx: np.ndarray, y: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for cls in (0, 1):
        members = idx[y == cls]
        k = max(1, round(n * len(members) / len(idx))) if len(members) else 0
        keep.extend(rng.choice(members, min(k, len(members)), replace=False).tolist())
    return np.array(sorted(keep), dtype=int)


MIN_BENIGN_FIT = 100  # a gate is never fitted on fewer benign training steps than this
# the L2 gate's AUROC the rubric signals must add to stay on the hot path (_rubrics_off_path)
RUBRIC_TOLERANCE = 0.01


def calibrate(
    config: PolicyConfig,
    screener_parts: tuple[Sequence[Scorer], Sequence[Scorer], Reviewer | None],
    train: LabelledSplit,
    val: LabelledSplit,
    *,
    data: Mapping[str, Any] | None = None,
    review_limit: int | None = None,
    seed: int = 0,
    folds: Mapping[str, tuple[Sequence[Scorer], Sequence[Scorer]]] | None = None,
    log: Log = _stderr,
) -> CalibratedPolicy:
    """Fit each gate on ``train`` and set its threshold on benign ``val`` steps, in cascade.

    With ``folds`` (cross-fitting, :mod:`monitor.crossfit`: per domain, the L0 and L1
    scorers of models trained without it), every step's L0 and L1 signals come from its
    domain's fold, so each gate is fitted and thresholded on out-of-domain scores; a step of
    a domain without a fold is scored by the full models.

    Gate ``k`` is fitted on the training steps that reach it: every harmful
    one, the benign ones its earlier gates pass, and (so that it always sees
    enough negatives) the benign steps the previous gate scored highest, up to
    ``MIN_BENIGN_FIT``. Its threshold passes ``budget_k`` of *all* benign
    validation steps. A tier's models only run on the steps that reach it.
    ``review_limit`` caps the training steps the L2 reviewer grades (a
    class-stratified sample of those reaching it) and the harmful validation
    steps it grades (every benign one that reaches L2 is graded, since the
    threshold is set on them): reviews cost seconds each. The validation
    figures then count the unreviewed harmful steps as stopped at L2.

    The trajectory aggregation (:func:`fit_trajectory_section`) is then fitted on the final
    scores of every ``train`` and ``val`` step as the gates decide them (no model runs
    again); a step that reached L2 but was left unreviewed stands in with its L1 score.
    """
    l0, l1, reviewer = screener_parts
    probe = Screener(policy=None, l0=l0, l1=l1, reviewer=reviewer)  # type: ignore[arg-type]
    by_domain = {
        d: Screener(policy=None, l0=f0, l1=f1, reviewer=None)  # type: ignore[arg-type]
        for d, (f0, f1) in (folds or {}).items()
    }

    def signals(k: int, split: LabelledSplit, idx: np.ndarray) -> list[dict[str, float]]:
        """Tier ``k``'s signals of ``split.steps[idx]``, each from its domain's fold."""
        if not by_domain:
            return probe.tier_signals(k, [split.steps[i] for i in idx])
        dom = np.asarray(split.domains, dtype=object)[idx]
        out: list[dict[str, float]] = [{} for _ in idx]
        for d in dict.fromkeys(dom.tolist()):
            at = np.flatnonzero(dom == d)
            rows = by_domain.get(d, probe).tier_signals(k, [split.steps[idx[j]] for j in at])
            for j, r in zip(at, rows, strict=True):
                out[j] = r
        return out

    if by_domain:
        seen = set(train.domains) | set(val.domains)
        if len(train.domains) != len(train.steps) or len(val.domains) != len(val.steps):
            raise ValueError("cross-fitting needs each step's domain (load_split gives them)")
        log(f"calibrate: cross-fitting over {len(by_domain)} domain folds; "
            + ("no fold for " + ", ".join(sorted(seen - set(by_domain))) + " (full models); "
               if seen - set(by_domain) else "")
            + "gates fitted and thresholded on out-of-domain scores")
    t0 = time.perf_counter()
    log(f"calibrate: L0 signals for {len(train.steps)} train and {len(val.steps)} val steps")
    rows_tr = signals(0, train, np.arange(len(train.steps)))
    rows_va = signals(0, val, np.arange(len(val.steps)))
    unreviewed_va = np.zeros(0, dtype=int)  # harmful val steps reaching L2 left unreviewed
    reviewed_tr = np.arange(len(train.steps))  # training steps the reviewer graded
    fit_tr = np.arange(len(train.steps))  # training steps the current gate is fitted on
    reach_va = np.arange(len(val.steps))  # validation steps that reached the current gate
    # the same steps screened as proposed actions (POST /v1/screen: no post-execution
    # signals): each gate gets a second threshold holding its budget on them
    post = post_execution_signals()
    reach_pre = np.arange(len(val.steps))
    benign_va = int((val.y == 0).sum())
    gates: list[Gate] = []
    metrics_l2: dict[str, Any] = {}
    p_tr_prev = np.zeros(len(train.steps))
    block_threshold = 1.0
    for k, tier in enumerate(config.tiers):
        if k > 0:
            # the tier's models run on the steps that reached it
            if k == 1:
                new_tr = signals(1, train, fit_tr)
                # L1 also runs on the val steps that reach it only as proposals
                ran_va = np.union1d(reach_va, reach_pre)
                new_va = signals(1, val, ran_va)
            else:
                if review_limit is not None and len(fit_tr) > review_limit:
                    fit_tr = stratified_subsample(fit_tr, train.y[fit_tr], review_limit, seed)
                harmful_va = reach_va[val.y[reach_va] == 1]
                if review_limit is not None and len(harmful_va) > review_limit:
                    # the threshold is set on benign steps only: every benign one is
                    # reviewed, the harmful ones (for the figures) are sampled
                    rng = np.random.default_rng(seed)
                    keep = rng.choice(harmful_va, review_limit, replace=False)
                    unreviewed_va = np.setdiff1d(harmful_va, keep)
                    reach_va = np.sort(np.concatenate([reach_va[val.y[reach_va] == 0], keep]))
                log(f"calibrate: reviewing {len(fit_tr)} train and {len(reach_va)} val steps")
                reviewed_tr, ran_va = fit_tr, reach_va
                new_tr = [
                    v.signals() if v else {}
                    for v in _review(probe, [train.steps[i] for i in fit_tr],
                                     [rows_tr[i] for i in fit_tr], "train", log)
                ]
                new_va = [
                    v.signals() if v else {}
                    for v in _review(probe, [val.steps[i] for i in reach_va],
                                     [rows_va[i] for i in reach_va], "val", log)
                ]
            for i, r in zip(fit_tr, new_tr, strict=True):
                rows_tr[i].update(r)
            for i, r in zip(ran_va, new_va, strict=True):
                rows_va[i].update(r)
        names = config.gate_signals(k)
        comb = fit_gate(
            k, names, tier.budget, [rows_tr[i] for i in fit_tr], train.y[fit_tr], C=config.C
        )
        if k == 2:
            config, names, comb = _rubrics_off_path(config, comb, rows_tr, fit_tr, train.y,
                                                    rows_va, reach_va, val.y, metrics_l2, log)
        gate = Gate(k, names, tier.budget, comb, 1.0)
        p_va = gate.probability([rows_va[i] for i in reach_va])
        benign_scores = p_va[val.y[reach_va] == 0]
        thr = threshold_for(benign_scores, tier.budget, benign_va)
        pre_thr = None
        if k < 2:  # proposals are screened through L1
            p_pre = gate.probability([_before(rows_va[i], post) for i in reach_pre])
            benign_pre = p_pre[val.y[reach_pre] == 0]
            pre_thr = threshold_for(benign_pre, tier.budget, benign_va)
            if k == 1:
                block_threshold = threshold_for(benign_pre, config.block_budget, benign_va)
            reach_pre = reach_pre[p_pre >= pre_thr]
        gate = Gate(k, names, tier.budget, comb, thr, pre_thr)
        gates.append(gate)
        passed = reach_va[p_va >= thr]
        log(
            f"calibrate: gate {tier.name}->L{k + 1}: threshold {thr:.4f}"
            + ("" if pre_thr is None else f" (proposed actions: {pre_thr:.4f})") + "; "
            f"{int((val.y[passed] == 0).sum())}/{benign_va} benign and "
            f"{int(val.y[passed].sum())}/{int(val.y.sum())} harmful val steps pass; weights "
            + ", ".join(
                f"{n}={w:.2f}" for n, w in zip(names, comb.coef_, strict=True) if w > 1e-6
            )
        )
        if k < 2:
            p_tr = np.zeros(len(train.steps))
            p_tr[fit_tr] = gate.probability([rows_tr[i] for i in fit_tr])
            p_tr_prev = p_tr
            up = fit_tr[p_tr[fit_tr] >= thr]
            harmful = fit_tr[train.y[fit_tr] == 1]
            benign_up = up[train.y[up] == 0]
            chosen = set(harmful.tolist()) | set(benign_up.tolist())
            short = MIN_BENIGN_FIT - len(benign_up)
            if short > 0:
                benign_all = fit_tr[train.y[fit_tr] == 0]
                rest = benign_all[~np.isin(benign_all, benign_up)]
                hardest = rest[np.argsort(-p_tr_prev[rest])][:short]
                chosen |= set(hardest.tolist())
            fit_tr = np.array(sorted(chosen), dtype=int)
            reach_va = passed
    g0, g1, g2 = gates
    policy = CalibratedPolicy(
        config=config,
        gates=(g0, g1, g2),
        block_threshold=block_threshold,
        data={"train": train.hash, "val": val.hash, **(data or {})},
    )
    counted = np.setdiff1d(np.arange(len(val.steps)), unreviewed_va)
    decisions = policy.decide_many([rows_va[i] for i in counted], through=2)
    # how far every val step gets through L2 (known without a review, so no step is left
    # out): overall and per held-out domain
    reach = policy.decide_many(rows_va, through=1)
    by_domain_va: dict[str, Any] = {}
    if len(val.domains) == len(val.steps):
        dom = np.asarray(val.domains, dtype=object)
        for d in sorted(set(dom.tolist())):
            at = np.flatnonzero(dom == d)
            by_domain_va[d] = gate_metrics([reach[i] for i in at], val.y[at], n_gates=2)
        adapted = _reach_adapted(g0, rows_va, val.y, dom)
    metrics = {
        "val": gate_metrics(decisions, val.y[counted]),
        "val_reach": gate_metrics(reach, val.y, n_gates=2),
        **({"val_reach_by_domain": by_domain_va,
            "val_reach_adapted_by_domain": adapted} if by_domain_va else {}),
        "val_harmful_unreviewed_left_out": int(len(unreviewed_va)),
        **({"l2_rubrics": metrics_l2} if metrics_l2 else {}),
        "seconds": round(time.perf_counter() - t0, 1),
        "timings": {k: round(sum(s.timings.get(k, 0.0) for s in (probe, *by_domain.values())), 2)
                    for k in ("L0", "L1", "L2") if k in probe.timings
                    or any(k in s.timings for s in by_domain.values())},
    }
    if by_domain:
        metrics["cross_fit"] = {
            "domains": sorted(by_domain),
            "note": "gates fitted and thresholded on out-of-domain scores; the val figures "
                    "are out-of-domain",
        }
    unreviewed_tr = np.setdiff1d(np.arange(len(train.steps)), reviewed_tr)
    if reviewer is None:  # nothing is reviewed, as in `monitor screen` without a reviewer
        unreviewed_tr = unreviewed_va = np.zeros(0, dtype=int)
    trajectory, metrics["trajectory"] = fit_trajectory_section(
        policy, [(train, rows_tr, unreviewed_tr), (val, rows_va, unreviewed_va)], log=log
    )
    log(f"calibrate: done in {metrics['seconds']} s; val {metrics['val']}")
    return CalibratedPolicy(
        config=policy.config,
        gates=policy.gates,
        block_threshold=policy.block_threshold,
        data=policy.data,
        metrics=metrics,
        trajectory=trajectory,
    )


def _reach_adapted(gate: Gate, rows: Sequence[Mapping[str, float]], y: np.ndarray,
                   domains: np.ndarray) -> dict[str, Any]:
    """Per held-out domain, the share of its harmful val steps that pass L0 when L0's
    threshold is that domain's own benign quantile at the budget: what ``--adapt`` settles
    on for a deployment of that domain's traffic (its sketches hold the budget on it). The
    cross-fit scores are out-of-domain, so this is the reach on tools never trained on."""
    p = gate.probability(rows)
    out: dict[str, Any] = {}
    for d in sorted(set(domains.tolist())):
        at = domains == d
        benign, harmful = p[at & (y == 0)], p[at & (y == 1)]
        if len(benign) < 20 or not len(harmful):  # too few to set a quantile, or to reach
            continue
        thr = float(np.quantile(benign, 1.0 - gate.budget))
        out[d] = {"threshold": thr, "benign_share": float(np.mean(benign >= thr)),
                  "harmful_reach": float(np.mean(harmful >= thr)), "harmful": len(harmful)}
    return out


def _rubrics_off_path(
    config: PolicyConfig, comb: Any, rows_tr: Sequence[Mapping[str, float]],
    fit_tr: np.ndarray, y_tr: np.ndarray, rows_va: Sequence[Mapping[str, float]],
    reach_va: np.ndarray, y_va: np.ndarray, record: dict[str, Any], log: Log,
) -> tuple[PolicyConfig, tuple[str, ...], Any]:
    """Whether the L2 gate keeps the rubric signals: with a judge among the L2 signals, the
    gate is fitted again without ``rv_*``; when that loses at most :data:`RUBRIC_TOLERANCE`
    of AUROC on the val steps that reach L2 (which the judge never trained on), the rubrics
    leave the hot path (the policy's L2 signals drop them; a review asks the judge alone and
    the rubrics are asked of the steps that go on to a human: ``Screener.page_rubrics``).
    Twenty rubric questions cost about twenty judge questions. ``record`` gets both AUROCs
    and the choice."""
    from dataclasses import replace

    from monitor.reviewer.verdict import ReviewVerdict
    from vigil.metrics import auroc

    names = config.gate_signals(2)
    rubric = set(ReviewVerdict.SIGNALS)
    if ReviewVerdict.JUDGE_SIGNAL not in names or not rubric & set(names):
        return config, names, comb
    lean = tuple(n for n in names if n not in rubric)
    comb_lean = fit_gate(2, lean, config.tiers[2].budget, [rows_tr[i] for i in fit_tr],
                         y_tr[fit_tr], C=config.C)
    va = [rows_va[i] for i in reach_va]
    y = y_va[reach_va]
    budget = config.tiers[2].budget
    with_rubrics = auroc(y, Gate(2, names, budget, comb, 1.0).probability(va))
    judge_only = auroc(y, Gate(2, lean, budget, comb_lean, 1.0).probability(va))
    off = with_rubrics is None or (judge_only is not None and
                                   judge_only >= with_rubrics - RUBRIC_TOLERANCE)
    record.update({"auroc_with_rubrics": with_rubrics, "auroc_judge_only": judge_only,
                   "tolerance": RUBRIC_TOLERANCE, "on_hot_path": not off,
                   "val_steps": int(len(reach_va))})
    log(f"calibrate: L2 gate AUROC on {len(reach_va)} val steps: {with_rubrics} with the "
        f"rubric signals, {judge_only} with the judge alone: the rubrics "
        + ("leave the hot path (asked of the steps paged)" if off else "stay on the hot path"))
    if not off:
        return config, names, comb
    l2 = config.tiers[2]
    tiers = (*config.tiers[:2], replace(l2, signals=tuple(s for s in l2.signals
                                                          if s not in rubric)))
    return replace(config, tiers=tiers), lean, comb_lean


def _review(probe: Screener, steps: list[ScreenStep], rows: list[dict[str, float]], what: str,
            log: Log, chunk: int = 16) -> list[Any]:
    """The reviewer's verdicts on ``steps``, a chunk at a time, with a progress line each."""
    out: list[Any] = []
    t0 = time.perf_counter()
    for i in range(0, len(steps), chunk):
        out += probe.review_signals(steps[i:i + chunk], rows[i:i + chunk])
        done, dt = min(i + chunk, len(steps)), time.perf_counter() - t0
        log(f"calibrate: reviewed {done}/{len(steps)} {what} steps ({done / dt:.2f}/s, "
            f"ETA {dt / done * (len(steps) - done):.0f} s)")
    return out


def _before(row: Mapping[str, float], post: frozenset[str]) -> dict[str, float]:
    """A step's signals as a proposal of its action would have them (no post-execution ones)."""
    return {n: v for n, v in row.items() if n not in post}


def final_decisions(
    policy: CalibratedPolicy, rows: Sequence[Mapping[str, float]], unreviewed: np.ndarray
) -> list[TierDecision]:
    """Each step's decision through L2, or through L1 for ``unreviewed`` steps (those whose
    review was skipped: their L1 score stands in)."""
    out = policy.decide_many(rows, through=2)
    left = [int(i) for i in unreviewed]
    for i, d in zip(left, policy.decide_many([rows[i] for i in left], through=1), strict=True):
        out[i] = d
    return out


def fit_trajectory_section(
    policy: CalibratedPolicy,
    splits: Sequence[tuple[LabelledSplit, Sequence[Mapping[str, float]], np.ndarray]],
    *,
    log: Log = _stderr,
) -> tuple[TrajectoryAggregation | None, dict[str, Any]]:
    """Fit the trajectory aggregation on every trajectory of ``splits`` (each: the split,
    its steps' signals, its unreviewed steps) from the final step decisions; None (the
    fallback) with the reason when the trajectories are all of one class."""
    from sklearn.metrics import roc_auc_score

    scores: dict[str, list[float]] = {}
    flags: dict[str, list[bool]] = {}
    labels: dict[str, int] = {}
    stand_in = 0
    for n, (split, rows, unreviewed) in enumerate(splits):
        keys, traj_label = split.trajectories()
        decisions = final_decisions(policy, rows, unreviewed)
        stand_in += sum(decisions[int(i)].tier == 2 for i in unreviewed)
        for k, d in zip(keys, decisions, strict=True):
            scores.setdefault(f"{n}/{k}", []).append(d.score)
            flags.setdefault(f"{n}/{k}", []).append(d.flagged)
        labels.update({f"{n}/{k}": v for k, v in traj_label.items()})
    order = sorted(scores)
    y = np.array([labels[k] for k in order], dtype=int)
    out: dict[str, Any] = {
        "trajectories": len(order),
        "harmful": int(y.sum()),
        "steps_scored_through_L1_only": int(stand_in),
    }
    budget = policy.config.trajectory_budget
    try:
        agg = fit_aggregation([scores[k] for k in order], [flags[k] for k in order], y,
                              budget=budget, C=policy.config.C)
    except ValueError as e:
        log(f"calibrate: no trajectory aggregation ({e}); screen falls back to the max step")
        return None, {**out, "fallback": str(e)}
    verdicts = [aggregate(scores[k], flags[k], agg) for k in order]
    fallback = [aggregate(scores[k], flags[k], None) for k in order]
    s = np.array([v[0] for v in verdicts])
    flagged = np.array([v[1] for v in verdicts])
    paged = np.array([any(flags[k]) for k in order])
    out.update(
        form=DEFAULT_FORM,
        auroc=float(roc_auc_score(y, s)),
        auroc_max_step=float(roc_auc_score(y, [v[0] for v in fallback])),
        benign_share_flagged=float(flagged[y == 0].mean()),
        benign_share_paged_by_a_step=float(paged[y == 0].mean()),
        recall_flagged=float(flagged[y == 1].mean()),
        threshold=agg.threshold,
    )
    log(
        f"calibrate: trajectory aggregation on {len(order)} train/val trajectories "
        f"({int(y.sum())} harmful): threshold {agg.threshold:.4f} at budget {budget}; "
        f"AUROC {out['auroc']:.3f} (max step {out['auroc_max_step']:.3f}); "
        f"{out['benign_share_flagged']:.1%} benign and {out['recall_flagged']:.1%} harmful "
        "trajectories flagged"
    )
    return agg, out
