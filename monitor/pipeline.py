"""One function wires the screening pipeline: :func:`load_screener`.

    screener = load_screener()                 # the calibrated default policy and its models
    verdicts = screener.screen(steps)   # L0 on all, L1 on what L0 escalates, L2 on what L1 does

The stream worker, ``monitor screen`` and ``POST /v1/screen`` all go through a
:class:`Screener`, so the tiers and thresholds are the same everywhere. The
scorers of each tier are small adapters over the model bundles
(:class:`WorldModelSignals`, :class:`RuleSignals`, :class:`ProbeSignals`); the
L2 reviewer is :mod:`monitor.reviewer`.

:func:`calibrate` fits the policy's gates (``monitor.tiers``) from transition
datasets: the gates are stacked on the ``train`` split and their thresholds set
on benign ``val`` steps; held-out ``test*`` splits are never read.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from monitor.screening import Scorer, ScreenStep
from monitor.tiers import (
    CalibratedPolicy,
    Gate,
    PolicyConfig,
    TierDecision,
    _threshold_for,
    data_hash,
    fit_gate,
    gate_metrics,
)
from streams.records import Action, Observation, Step, Trajectory

if TYPE_CHECKING:
    from monitor.reviewer import Reviewer, ReviewVerdict
    from probes.bundle import ProbeScorer
    from worldmodel.data import Transition
    from worldmodel.score import WorldModelScorer

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- scorers ---------------------------------------------------------------------------


class WorldModelSignals:
    """L0: the world model's surprise and harm (``wm_*``), batched."""

    name = "worldmodel"
    signals = ("wm_harm_pre", "wm_harm_post", "wm_surprise", "wm_relational_harm", "wm_injection")

    def __init__(self, scorer: WorldModelScorer) -> None:
        self.scorer = scorer

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        return [s.signals() for s in self.scorer.score([st.to_worldmodel() for st in steps])]


_DESTRUCTIVE = re.compile(
    r"\b(delete|remove|drop|truncate|wipe|erase|destroy|purge|rm\s+-rf|format|kill|"
    r"revoke|disable|cancel|overwrite|reset)\w*",
    re.IGNORECASE,
)
_ADDRESS = re.compile(
    r"[\w.+-]+@[\w-]+\.[\w.-]+|https?://[^\s\"'<>]+|\b[A-Z]{2}\d{2}[A-Z0-9]{10,30}\b"
)
_INJECTION = re.compile(
    r"ignore (all |the )?(previous|prior|above) instructions|before you (can )?solve the task|"
    r"<information>|new instructions?:|system prompt|do not tell the user|instead, you must",
    re.IGNORECASE,
)


class RuleSignals:
    """L0: cheap rules over the step's text, tool-agnostic (0 or 1 each).

    * ``rule_destructive``: the action deletes, drops, wipes, revokes ... something;
    * ``rule_new_recipient``: the action's arguments name an e-mail address, URL or
      IBAN-like account that appears neither in the task nor in anything the agent
      read before acting (where data or money would go to someone new);
    * ``rule_injection_marker``: what the agent read carries instruction-like text
      addressed to it (the usual markers of prompt injection).
    """

    name = "rules"
    signals = ("rule_destructive", "rule_new_recipient", "rule_injection_marker")

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        out = []
        for st in steps:
            a = st.step.action
            call = f"{a.tool.name} {a.tool.arguments}" if a.tool else a.text
            args = str(a.tool.arguments) if a.tool else a.text
            known = " ".join(
                [st.task, st.step.observation.text, *(h.observation.text for h in st.history),
                 *((h.result.text if h.result else "") for h in st.history)]
            ).lower()
            new = [x for x in _ADDRESS.findall(args) if x.lower().rstrip(".,") not in known]
            read = " ".join([st.step.observation.text, *(h.result.text for h in st.history
                                                         if h.result)])
            out.append(
                {
                    "rule_destructive": float(bool(_DESTRUCTIVE.search(call))),
                    "rule_new_recipient": float(bool(new)),
                    "rule_injection_marker": float(bool(_INJECTION.search(read))),
                }
            )
        return out


class ProbeSignals:
    """L1: the activation probe's probability of harm (``probe_harm``)."""

    name = "probes"
    signals = ("probe_harm",)

    def __init__(self, scorer: ProbeScorer) -> None:
        self.scorer = scorer

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        if not steps:
            return []
        p = self.scorer.score([st.to_probe() for st in steps])
        return [{"probe_harm": float(v)} for v in p]


class MetaSignals:
    """Signals a record carries itself (``meta.signals``, e.g. RL-health ``rl_*`` flags)."""

    name = "meta"

    def __init__(self, prefixes: Sequence[str] = ("rl_",)) -> None:
        self.prefixes = tuple(prefixes)

    @property
    def signals(self) -> tuple[str, ...]:
        return ()

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        out = []
        for st in steps:
            got = st.meta.get("signals") if isinstance(st.meta, Mapping) else None
            row: dict[str, float] = {}
            if isinstance(got, Mapping):
                for k, v in got.items():
                    if str(k).startswith(self.prefixes) and isinstance(v, int | float):
                        row[str(k)] = float(v)
            out.append(row)
        return out


# --- the screener ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepVerdict:
    """What the pipeline decided about one step (the ``steps`` entries of ``monitor screen``)."""

    trajectory_id: str
    step_id: str
    tier: int  # highest tier reached, 0-3
    score: float  # probability of harm from the deepest gate evaluated
    flagged: bool
    signals: Mapping[str, float]
    gate_scores: tuple[float, ...] = ()
    review: ReviewVerdict | None = None

    def to_json(self) -> dict[str, Any]:
        """The DESIGN §2.1 ``steps`` entry of ``monitor screen``."""
        return {
            "step_id": self.step_id,
            "score": round(self.score, 6),
            "flagged": self.flagged,
            "tier": self.tier,
            "signals": {k: round(float(v), 6) for k, v in sorted(self.signals.items())},
        }


Decision = Literal["allow", "escalate", "block"]


@dataclass(frozen=True)
class ActionCheck:
    """The pre-execution answer for a proposed action (``POST /v1/screen``)."""

    decision: Decision
    tier: int
    score: float
    signals: Mapping[str, float]
    latency_s: float = 0.0


@dataclass
class Screener:
    """The tiers and the policy that joins them."""

    policy: CalibratedPolicy
    l0: Sequence[Scorer]
    l1: Sequence[Scorer] = ()
    reviewer: Reviewer | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per tier

    def tier_signals(self, tier: int, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        """Run tier ``tier``'s scorers (0 or 1) on ``steps``."""
        scorers = self.l0 if tier == 0 else self.l1
        rows: list[dict[str, float]] = [{} for _ in steps]
        if not steps:
            return rows
        t0 = time.perf_counter()
        for scorer in scorers:
            for row, got in zip(rows, scorer.score_steps(steps), strict=True):
                row.update(got)
        self.timings[f"L{tier}"] = self.timings.get(f"L{tier}", 0.0) + time.perf_counter() - t0
        return rows

    def review_signals(
        self, steps: Sequence[ScreenStep], prior: Sequence[Mapping[str, float]]
    ) -> list[ReviewVerdict | None]:
        if self.reviewer is None or not steps:
            return [None for _ in steps]
        from monitor.reviewer import ReviewCase

        t0 = time.perf_counter()
        out = list(
            self.reviewer.review(
                [ReviewCase(step=s, signals=dict(p)) for s, p in zip(steps, prior, strict=True)]
            )
        )
        self.timings["L2"] = self.timings.get("L2", 0.0) + time.perf_counter() - t0
        return list(out)

    def screen(self, steps: Sequence[ScreenStep], *, through: int = 2) -> list[StepVerdict]:
        """L0 on every step, then each tier on the steps the one before escalates.

        ``through``: the last tier to run (0, 1 or 2). A step that passes the
        gate after ``through`` is reported one tier up (``monitor screen`` runs
        through L2, so tier 3 means "would have paged a human").
        """
        rows = self.tier_signals(0, steps)
        reviews: list[ReviewVerdict | None] = [None for _ in steps]
        decisions = self.policy.decide_many(rows, through=0)
        for tier in (1, 2):
            if tier > through:
                break
            up = [i for i, d in enumerate(decisions) if d.tier >= tier]
            if up:
                sub = [steps[i] for i in up]
                if tier == 1:
                    got = self.tier_signals(1, sub)
                    for i, g in zip(up, got, strict=True):
                        rows[i].update(g)
                else:
                    verdicts = self.review_signals(sub, [rows[i] for i in up])
                    for i, v in zip(up, verdicts, strict=True):
                        reviews[i] = v
                        if v is not None:
                            rows[i].update(v.signals())
            decisions = self.policy.decide_many(rows, through=tier)
        return [
            self._verdict(s, d, r, v) for s, d, r, v in zip(steps, decisions, rows, reviews,
                                                             strict=True)
        ]

    def review(
        self, steps: Sequence[ScreenStep], prior: Sequence[Mapping[str, float]]
    ) -> list[StepVerdict]:
        """The L2 stage alone (the escalations consumer): ``prior`` = L0 + L1 signals."""
        reviews = self.review_signals(steps, prior)
        rows = [dict(p) for p in prior]
        for row, v in zip(rows, reviews, strict=True):
            if v is not None:
                row.update(v.signals())
        decisions = self.policy.decide_many(rows, through=2)
        return [
            self._verdict(s, d, r, v) for s, d, r, v in zip(steps, decisions, rows, reviews,
                                                             strict=True)
        ]

    def check_action(self, trajectory: Trajectory, action: Action) -> ActionCheck:
        """Allow, escalate or block a proposed action before it runs (L0 + L1).

        The proposed step has no result yet, so the world model judges the
        *predicted* next state (``wm_harm_pre``). Block: the L0+L1 probability
        reaches the policy's block threshold; escalate: the step would reach
        L2 (a reviewer); allow: otherwise.
        """
        return self.check_actions([(trajectory, action)])[0]

    def check_actions(
        self, proposals: Sequence[tuple[Trajectory, Action]]
    ) -> list[ActionCheck]:
        """:meth:`check_action` for many proposals at once (one batched call per tier);
        ``latency_s`` is the whole batch's time."""
        t0 = time.perf_counter()
        steps = []
        for trajectory, action in proposals:
            step = Step(
                step_id=f"proposed-{len(trajectory.steps)}",
                index=len(trajectory.steps),
                observation=_last_result(trajectory),
                action=action,
            )
            steps.append(
                ScreenStep(
                    trajectory_id=trajectory.trajectory_id,
                    task=trajectory.task,
                    step=step,
                    history=tuple(trajectory.steps[-4:]),
                    source=trajectory.source,
                    meta=trajectory.meta,
                )
            )
        verdicts = self.screen(steps, through=1)
        latency = time.perf_counter() - t0
        out = []
        for v in verdicts:
            decision: Decision = "allow"
            if self.policy.block(v.signals) and v.tier >= 1:
                decision = "block"
            elif v.tier >= 2:
                decision = "escalate"
            out.append(ActionCheck(decision, v.tier, v.score, v.signals, latency))
        return out

    def _verdict(
        self,
        s: ScreenStep,
        d: TierDecision,
        row: Mapping[str, float],
        review: ReviewVerdict | None,
    ) -> StepVerdict:
        return StepVerdict(
            trajectory_id=s.trajectory_id,
            step_id=s.step_id,
            tier=d.tier,
            score=d.score,
            flagged=d.flagged,
            signals=dict(row),
            gate_scores=d.gate_scores,
            review=review,
        )


def _last_result(trajectory: Trajectory) -> Observation:
    """What the agent sees before its next action: the previous step's result."""
    if trajectory.steps:
        last = trajectory.steps[-1]
        return last.result or last.observation
    return Observation(text=trajectory.task)


# --- calibration -------------------------------------------------------------------------


def screen_step_of_transition(t: Transition, base: Path | None = None) -> ScreenStep:
    """A dataset transition as the pipeline sees a step (history from its recorded pairs)."""

    def shot(p: str | None) -> str | None:
        if p and base is not None and not Path(p).is_absolute():
            return str(base / p)
        return p

    history = tuple(
        Step(step_id=f"h{i}", index=i, observation=Observation(text=o), action=Action(text=a))
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


def load_split(
    datasets: Sequence[str | Path], split: str, *, limit: int | None = None, seed: int = 0
) -> LabelledSplit:
    """The steps and labels of ``split`` over ``datasets`` (a seeded, stratified subsample)."""
    from worldmodel.data import read_manifest, read_transitions

    if split.startswith("test"):
        raise ValueError(f"split {split!r} is held out: calibration never reads it")
    steps, labels, hashes = [], [], []
    for d in datasets:
        hashes.append(read_manifest(d).content_hash)
        for t in read_transitions(d, [split]):
            steps.append(screen_step_of_transition(t, Path(d)))
            labels.append(int(t.label))
    y = np.array(labels, dtype=int)
    if limit is not None and len(steps) > limit:
        rng = np.random.default_rng(seed)
        keep: list[int] = []
        for cls in (0, 1):
            idx = np.flatnonzero(y == cls)
            n = round(limit * len(idx) / len(y))
            keep.extend(rng.choice(idx, min(n, len(idx)), replace=False).tolist())
        keep.sort()
        steps = [steps[i] for i in keep]
        y = y[keep]
    return LabelledSplit(steps, y, data_hash([*hashes, split, str(limit), str(seed)]))


def _stratified(idx: np.ndarray, y: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for cls in (0, 1):
        members = idx[y == cls]
        k = max(1, round(n * len(members) / len(idx))) if len(members) else 0
        keep.extend(rng.choice(members, min(k, len(members)), replace=False).tolist())
    return np.array(sorted(keep), dtype=int)


MIN_BENIGN_FIT = 100  # a gate is never fitted on fewer benign training steps than this


def calibrate(
    config: PolicyConfig,
    screener_parts: tuple[Sequence[Scorer], Sequence[Scorer], Reviewer | None],
    train: LabelledSplit,
    val: LabelledSplit,
    *,
    data: Mapping[str, Any] | None = None,
    review_limit: int | None = None,
    seed: int = 0,
    log: Log = _stderr,
) -> CalibratedPolicy:
    """Fit each gate on ``train`` and set its threshold on benign ``val`` steps, in cascade.

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
    """
    l0, l1, reviewer = screener_parts
    probe = Screener(policy=None, l0=l0, l1=l1, reviewer=reviewer)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    log(f"calibrate: L0 signals for {len(train.steps)} train and {len(val.steps)} val steps")
    rows_tr = probe.tier_signals(0, train.steps)
    rows_va = probe.tier_signals(0, val.steps)
    unreviewed_va = np.zeros(0, dtype=int)  # harmful val steps reaching L2 left unreviewed
    fit_tr = np.arange(len(train.steps))  # training steps the current gate is fitted on
    reach_va = np.arange(len(val.steps))  # validation steps that reached the current gate
    benign_va = int((val.y == 0).sum())
    gates: list[Gate] = []
    p_tr_prev = np.zeros(len(train.steps))
    block_threshold = 1.0
    for k, tier in enumerate(config.tiers):
        if k > 0:
            # the tier's models run on the steps that reached it
            if k == 1:
                new_tr = probe.tier_signals(1, [train.steps[i] for i in fit_tr])
                new_va = probe.tier_signals(1, [val.steps[i] for i in reach_va])
            else:
                if review_limit is not None and len(fit_tr) > review_limit:
                    fit_tr = _stratified(fit_tr, train.y[fit_tr], review_limit, seed)
                harmful_va = reach_va[val.y[reach_va] == 1]
                if review_limit is not None and len(harmful_va) > review_limit:
                    # the threshold is set on benign steps only: every benign one is
                    # reviewed, the harmful ones (for the figures) are sampled
                    rng = np.random.default_rng(seed)
                    keep = rng.choice(harmful_va, review_limit, replace=False)
                    unreviewed_va = np.setdiff1d(harmful_va, keep)
                    reach_va = np.sort(np.concatenate([reach_va[val.y[reach_va] == 0], keep]))
                log(f"calibrate: reviewing {len(fit_tr)} train and {len(reach_va)} val steps")
                new_tr = [
                    v.signals() if v else {}
                    for v in probe.review_signals(
                        [train.steps[i] for i in fit_tr], [rows_tr[i] for i in fit_tr]
                    )
                ]
                new_va = [
                    v.signals() if v else {}
                    for v in probe.review_signals(
                        [val.steps[i] for i in reach_va], [rows_va[i] for i in reach_va]
                    )
                ]
            for i, r in zip(fit_tr, new_tr, strict=True):
                rows_tr[i].update(r)
            for i, r in zip(reach_va, new_va, strict=True):
                rows_va[i].update(r)
        names = config.gate_signals(k)
        comb = fit_gate(
            k, names, tier.budget, [rows_tr[i] for i in fit_tr], train.y[fit_tr], C=config.C
        )
        gate = Gate(k, names, tier.budget, comb, 1.0)
        p_va = gate.probability([rows_va[i] for i in reach_va])
        benign_scores = p_va[val.y[reach_va] == 0]
        thr = _threshold_for(benign_scores, tier.budget, benign_va)
        gate = Gate(k, names, tier.budget, comb, thr)
        gates.append(gate)
        if k == 1:
            block_threshold = _threshold_for(benign_scores, config.block_budget, benign_va)
        passed = reach_va[p_va >= thr]
        log(
            f"calibrate: gate {tier.name}->L{k + 1}: threshold {thr:.4f}; "
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
    metrics = {
        "val": gate_metrics(decisions, val.y[counted]),
        "val_harmful_unreviewed_left_out": int(len(unreviewed_va)),
        "seconds": round(time.perf_counter() - t0, 1),
        "timings": {k: round(v, 2) for k, v in probe.timings.items()},
    }
    log(f"calibrate: done in {metrics['seconds']} s; val {metrics['val']}")
    return CalibratedPolicy(
        config=policy.config,
        gates=policy.gates,
        block_threshold=policy.block_threshold,
        data=policy.data,
        metrics=metrics,
    )


# --- loading ----------------------------------------------------------------------------


def default_policy_path() -> Path:
    from streams.config import vigil_home

    return vigil_home() / "models" / "policy.json"


def build_parts(
    config: PolicyConfig,
    *,
    models: Mapping[str, str | None] | None = None,
    reviewer: bool = True,
    log: Log = _stderr,
) -> tuple[list[Scorer], list[Scorer], Reviewer | None]:
    """The scorers of L0 and L1 and the L2 reviewer that ``config`` names.

    ``models`` overrides the bundle folders (``worldmodel``, ``probes``);
    an unset one is the default under ``$VIGIL_HOME/models``.
    """
    from monitor.worldmodel_cli import default_bundle
    from probes.bundle import ProbeScorer
    from streams.config import vigil_home
    from worldmodel.score import WorldModelScorer

    chosen = {**{k: config.model(k) for k in ("worldmodel", "probes")}, **(models or {})}
    wm_path = Path(chosen.get("worldmodel") or default_bundle()).expanduser()
    l0: list[Scorer] = [
        WorldModelSignals(WorldModelScorer.load(wm_path)),
        RuleSignals(),
        MetaSignals(),
    ]
    l1: list[Scorer] = []
    probes_path = Path(chosen.get("probes") or vigil_home() / "models" / "probes").expanduser()
    if config.tiers[1].signals:
        l1.append(ProbeSignals(ProbeScorer.load(probes_path)))
    rv = None
    if reviewer and config.tiers[2].signals:
        from monitor.reviewer import ReviewerConfig, build_reviewer

        rv = build_reviewer(ReviewerConfig(**dict(config.reviewer)))
    return l0, l1, rv


def load_screener(
    policy: str | Path | None = None,
    *,
    reviewer: bool = True,
    prepare: bool = True,
    log: Log = _stderr,
) -> Screener:
    """The screener of a calibrated policy (default: ``$VIGIL_HOME/models/policy.json``).

    When the default policy does not exist yet and ``prepare`` is set, the
    default datasets and models are built, trained and calibrated first (with
    progress; minutes, once). ``reviewer=False`` leaves L2 out (the stream's
    L0/L1 stage does not need it).
    """
    from monitor.tiers import PolicyError

    path = Path(policy).expanduser() if policy else default_policy_path()
    if not path.exists():
        if policy is not None or not prepare:
            raise PolicyError(
                f"{path}: no calibrated policy; run `monitor calibrate` (or `monitor screen` "
                "once without --policy to build the defaults)"
            )
        from monitor.defaults import prepare_defaults

        prepare_defaults(log=log)
    cal = CalibratedPolicy.load(path)
    l0, l1, rv = build_parts(cal.config, models=cal.data.get("models"), reviewer=reviewer, log=log)
    return Screener(cal, l0, l1, rv)
