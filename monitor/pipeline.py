"""The screening pipeline: :class:`Screener` (the tiers and the policy that joins them) and
:func:`load_screener`, which wires one from a calibrated policy file.

    screener = load_screener()                 # the calibrated default policy and its models
    verdicts = screener.screen(steps)   # L0 on all, L1 on what L0 escalates, L2 on what L1 does

The stream worker, ``monitor screen`` and ``POST /v1/screen`` all go through a
:class:`Screener`, so the tiers and thresholds are the same everywhere. The scorers of each
tier are :mod:`monitor.scorers`; the L2 reviewer is :mod:`monitor.reviewer`; fitting a
policy's gates is :mod:`monitor.calibrate`; building the default policy on first use is
:mod:`monitor.defaults`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from monitor.screening import Scorer, ScreenStep
from monitor.tiers import CalibratedPolicy, PolicyConfig, PolicyError, TierDecision
from streams.records import Action, Observation, Step, Trajectory

if TYPE_CHECKING:
    from monitor.adaptive import LiveGates
    from monitor.reviewer import Reviewer, ReviewVerdict

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
    rule: str | None = None  # the policy's tool rule that decided, if one did


@dataclass
class Screener:
    """The tiers and the policy that joins them."""

    policy: CalibratedPolicy
    l0: Sequence[Scorer]
    l1: Sequence[Scorer] = ()
    reviewer: Reviewer | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per tier
    # live thresholds that hold each gate's budget on this stream (`monitor screen --adapt`)
    live: LiveGates | None = None

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

    @property
    def rubrics_on_path(self) -> bool:
        """Whether the L2 gate weighs the rubric signals (``rv_*``), so every review asks
        the rubrics; else (a policy whose L2 stacks the judge alone, see
        :func:`monitor.calibrate.calibrate`) a review asks the judge only and the rubrics
        are asked of the steps the L2 gate sends on to a human (:meth:`page_rubrics`)."""
        if self.policy is None:  # calibrating: every signal
            return True
        from monitor.reviewer.verdict import ReviewVerdict

        return bool(set(self.policy.config.tiers[2].signals) & set(ReviewVerdict.SIGNALS))

    def review_signals(
        self, steps: Sequence[ScreenStep], prior: Sequence[Mapping[str, float]]
    ) -> list[ReviewVerdict | None]:
        if self.reviewer is None or not steps:
            return [None for _ in steps]
        from monitor.reviewer import ReviewCase

        t0 = time.perf_counter()
        out = list(
            self.reviewer.review(
                [ReviewCase(step=s, signals=dict(p)) for s, p in zip(steps, prior, strict=True)],
                rubrics=self.rubrics_on_path,
            )
        )
        self.timings["L2"] = self.timings.get("L2", 0.0) + time.perf_counter() - t0
        return list(out)

    def page_rubrics(self, steps: Sequence[ScreenStep], decisions: Sequence[TierDecision],
                     rows: Sequence[Mapping[str, float]],
                     reviews: list[ReviewVerdict | None]) -> None:
        """Ask the rubrics (in place) of the reviewed steps the L2 gate sends to a human
        whose review asked the judge alone: their case pages show the rubric coverage and
        claims. Off the hot path: a few steps in a thousand reach L3."""
        if self.reviewer is None:
            return
        todo = [i for i, (d, v) in enumerate(zip(decisions, reviews, strict=True))
                if d.tier >= 3 and v is not None and not v.rubrics_asked]
        if not todo:
            return
        from monitor.reviewer import ReviewCase

        t0 = time.perf_counter()
        got = self.reviewer.add_rubrics(
            [ReviewCase(step=steps[i], signals=dict(rows[i])) for i in todo],
            [reviews[i] for i in todo])  # type: ignore[misc]  # not None: see todo
        for i, v in zip(todo, got, strict=True):
            reviews[i] = v
        self.timings["L2"] = self.timings.get("L2", 0.0) + time.perf_counter() - t0

    def screen(
        self, steps: Sequence[ScreenStep], *, through: int = 2, proposal: bool = False
    ) -> list[StepVerdict]:
        """L0 on every step, then each tier on the steps the one before escalates.

        ``through``: the last tier to run (0, 1 or 2). A step that passes the
        gate after ``through`` is reported one tier up (``monitor screen`` runs
        through L2, so tier 3 means "would have paged a human"). ``proposal``: the steps
        are proposed actions, judged by the gates' thresholds for proposals.
        """
        live = None if proposal else self.live
        thresholds = None if live is None else live.thresholds()
        rows = self.tier_signals(0, steps)
        decisions = self.policy.decide_many(rows, through=0, proposal=proposal,
                                            thresholds=thresholds)
        return self._climb(steps, rows, decisions, 1, through, proposal, thresholds)

    def _thresholds_past(self, gates: int) -> list[float]:
        """The gates' thresholds (live with ``--adapt``, else calibrated) for steps the first
        ``gates`` gates passed already in an earlier stage: those are 0, not decided again."""
        thresholds = list(self.live.thresholds() if self.live is not None else
                          (g.threshold_for(False) for g in self.policy.gates))
        thresholds[:gates] = [0.0] * gates
        return thresholds

    def screen_escalated(self, steps: Sequence[ScreenStep], l0: Sequence[Mapping[str, float]],
                         *, through: int = 1) -> list[StepVerdict]:
        """Tiers 1 to ``through`` for steps an L0 stage has already escalated (the L1 stage of
        the stream): ``l0`` is each step's L0 signals. Gate 0 is not decided again (the L0
        stage's live threshold may differ from this stage's); the live gates here sketch
        the gates from 1 on."""
        if not 1 <= through <= 2:
            raise ValueError(f"through must be 1 or 2, got {through}")
        thresholds = self._thresholds_past(1)
        rows = [dict(r) for r in l0]
        decisions = self.policy.decide_many(rows, through=0, thresholds=thresholds)
        return self._climb(steps, rows, decisions, 1, through, False, thresholds, first_gate=1)

    def _climb(
        self,
        steps: Sequence[ScreenStep],
        rows: list[dict[str, float]],
        decisions: list[TierDecision],
        start: int,
        through: int,
        proposal: bool,
        thresholds: Sequence[float] | None,
        first_gate: int = 0,
    ) -> list[StepVerdict]:
        """Tiers ``start`` to ``through`` on the steps the tier before escalates."""
        reviews: list[ReviewVerdict | None] = [None for _ in steps]
        for tier in range(start, through + 1):
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
            decisions = self.policy.decide_many(rows, through=tier, proposal=proposal,
                                                thresholds=thresholds)
        if through >= 2:
            self.page_rubrics(steps, decisions, rows, reviews)
        live = None if proposal else self.live
        if live is not None:
            from dashboards.canary import is_canary

            live.observe(decisions, [("canary" if s.step.label == 1 else "replay")
                                     if is_canary(s.meta) else "real" for s in steps],
                         first=first_gate)
        return [
            self._verdict(s, d, r, v) for s, d, r, v in zip(steps, decisions, rows, reviews,
                                                             strict=True)
        ]

    def review(
        self, steps: Sequence[ScreenStep], prior: Sequence[Mapping[str, float]]
    ) -> list[StepVerdict]:
        """The L2 stage alone (the escalations consumer): ``prior`` = L0 + L1 signals. Gates
        0 and 1 are not decided again: the stages before escalated these steps, perhaps with
        live thresholds (``--adapt``) below the calibrated ones; only gate 2 decides here."""
        reviews = self.review_signals(steps, prior)
        rows = [dict(p) for p in prior]
        for row, v in zip(rows, reviews, strict=True):
            if v is not None:
                row.update(v.signals())
        thresholds = self._thresholds_past(2)
        decisions = self.policy.decide_many(rows, through=2, thresholds=thresholds)
        self.page_rubrics(steps, decisions, rows, reviews)
        return [
            self._verdict(s, d, r, v) for s, d, r, v in zip(steps, decisions, rows, reviews,
                                                             strict=True)
        ]

    def check_action(self, trajectory: Trajectory, action: Action) -> ActionCheck:
        """Allow, escalate or block a proposed action before it runs (L0 + L1).

        The proposed step has no result yet, so the world model judges the
        *predicted* next state (``wm_harm_pre``). Block: the L0+L1 probability
        reaches the policy's block threshold; escalate: the step would reach
        L2 (a reviewer); allow: otherwise. A tool rule of the policy
        (:mod:`monitor.tool_rules`) matching the call decides instead: deny blocks, review
        escalates, allow and monitor allow (the step is scored either way).
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
        verdicts = self.screen(steps, through=1, proposal=True)
        latency = time.perf_counter() - t0
        rules = self.policy.config.tools
        out = []
        for (_, action), v in zip(proposals, verdicts, strict=True):
            decision: Decision = "allow"
            if self.policy.block(v.signals) and v.tier >= 1:
                decision = "block"
            elif v.tier >= 2:
                decision = "escalate"
            tool = action.tool
            rule = rules.rule_for(tool.name if tool else None,
                                  getattr(tool, "server", None) if tool else None)
            if rule is not None:  # scored all the same: the step is recorded as it is
                decision = ("block" if rule.action == "deny" else
                            "escalate" if rule.action == "review" else "allow")
            out.append(ActionCheck(decision, v.tier, v.score, v.signals, latency,
                                   rule.describe() if rule is not None else None))
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


# --- loading ----------------------------------------------------------------------------


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
    import vigil.paths
    from monitor.scorers import scorers_of

    chosen = {**{k: config.model(k) for k in ("worldmodel", "probes")}, **(models or {})}
    bundles = {
        "worldmodel": Path(chosen.get("worldmodel") or vigil.paths.worldmodel_bundle()),
        "probes": Path(chosen.get("probes") or vigil.paths.probes_bundle()),
    }
    bundles = {k: p.expanduser() for k, p in bundles.items()}
    for name, folder in {**config.models(), **(models or {})}.items():  # other scorers' bundles
        if name not in bundles:
            bundles[name] = Path(folder or vigil.paths.bundle(name)).expanduser()

    def used(tier: int) -> list[Scorer]:
        wanted = set(config.tiers[tier].signals)
        return [cls.load(bundles) for cls in scorers_of(tier) if wanted & set(cls.signals)]

    l0, l1 = used(0), used(1)
    return l0, l1, _reviewer(config) if reviewer else None


def _reviewer(config: PolicyConfig) -> Reviewer | None:
    """The L2 reviewer ``config`` names (None when L2 has no signals)."""
    if not config.tiers[2].signals:
        return None
    from monitor.reviewer import ReviewerConfig, build_reviewer

    return build_reviewer(ReviewerConfig(**dict(config.reviewer)))


def _calibrated(policy: str | Path | None) -> CalibratedPolicy:
    import vigil.paths

    path = Path(policy).expanduser() if policy else vigil.paths.policy()
    if not path.exists():
        raise PolicyError(
            f"{path}: no calibrated policy; run `monitor calibrate` (or `monitor screen` "
            "once without --policy to build the defaults)"
        )
    return CalibratedPolicy.load(path)


def load_screener(
    policy: str | Path | None = None,
    *,
    reviewer: bool = True,
    log: Log = _stderr,
) -> Screener:
    """The screener of a calibrated policy (default: ``$VIGIL_HOME/models/policy.json``).

    ``reviewer=False`` leaves L2 out (the stream's L0/L1 stage does not need it). To build
    the default policy when it does not exist yet, pass the path
    :func:`monitor.defaults.ensure_policy` returns.
    """
    cal = _calibrated(policy)
    l0, l1, rv = build_parts(cal.config, models=cal.data.get("models"), reviewer=reviewer, log=log)
    return Screener(cal, l0, l1, rv)


def load_review_screener(policy: str | Path | None = None) -> Screener:
    """The review stage's screener: the policy and the L2 reviewer, no L0/L1 models."""
    cal = _calibrated(policy)
    return Screener(cal, l0=(), l1=(), reviewer=_reviewer(cal.config))
