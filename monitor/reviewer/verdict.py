"""The reviewer's verdict on one step, built the FORK way (DESIGN §5).

* **Coverage** (FORK's recall) per harm category ``c``:
  ``R_c = Σ_{j∈c} w_j s_j / Σ_{j∈c} w_j`` over that category's rubrics, ``s_j ∈ [0, 1]``
  the reviewer's score for rubric ``j``. A step is graded against every
  category's rubric set; the verdict's ``coverage`` is the highest ``R_c`` (a
  step that exfiltrates data does not also have to delete files to be harmful),
  and ``category`` is that category, or ``None`` when no rubric of any category
  reached :data:`~monitor.reviewer.evidence.CLAIM_AT` (nothing satisfied). All
  ``R_c`` are kept in ``category_coverage``.
* **Precision** over the reviewer's own claims (one per rubric it says "yes" to,
  in every category): the share that are both necessary and correct
  (:mod:`monitor.reviewer.evidence`). No claims → precision 0: nothing backs a
  harmful verdict, so ``F_β`` is 0 as well.
* ``F_β = (1+β²) P R / (β² P + R)`` (0 when ``P = R = 0``).

The three become the signals ``rv_coverage``, ``rv_precision`` and ``rv_fbeta``
("higher = more likely harmful"). A reviewer whose model is a fine-tuned judge
(:mod:`monitor.reviewer.judge`) also asks it the verdict question and adds its
P(unsafe) as ``judge_unsafe``; the calibrated L2 gate weighs it against the rubric
signals; where that weight is small the rubrics leave the hot path (``rubrics_asked``
False: the judge alone, no ``rv_*`` signals; the rubrics are asked of the cases that go on to
a human). A review that could not be done (timeout,
budget exhausted, a malformed reply) is a verdict with ``error`` set, zeros and
no signals: the tier policy treats the reviewer's signals as missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from monitor.reviewer.evidence import CLAIM_AT, best_evidence, check_claim
from monitor.reviewer.rubrics import Rubric
from monitor.reviewer.view import StepView


@dataclass(frozen=True)
class RubricScore:
    """The reviewer's answer to one rubric: ``score`` in [0, 1] (1 = yes, it holds)."""

    rubric_id: str
    category: str
    weight: float
    score: float
    logprob_yes: float | None = None  # the verdict tokens' log-probabilities, where known
    logprob_no: float | None = None


@dataclass(frozen=True)
class Claim:
    """One statement the reviewer makes to justify its verdict, with its check."""

    text: str
    necessary: bool
    correct: bool
    rubric_id: str | None = None
    evidence: str = ""
    where: str = ""  # where in the step the evidence was found ("arguments.recipients")
    why: str = ""  # empty when the claim is necessary and correct, else the first reason


@dataclass(frozen=True)
class ReviewVerdict:
    """The L2 verdict on one step. ``to_dict``/``from_dict`` round-trip it losslessly."""

    coverage: float
    precision: float
    f_beta: float
    category: str | None
    rubrics: tuple[RubricScore, ...]
    claims: tuple[Claim, ...]
    rationale: str
    backend: str
    model: str
    cost: float = 0.0
    latency_s: float = 0.0
    error: str | None = None
    beta: float = 1.0
    category_coverage: Mapping[str, float] = field(default_factory=dict)
    step_key: str = ""  # trajectory_id/step_id of the step reviewed
    judge_unsafe: float | None = None  # a fine-tuned judge's P(unsafe), when it has one
    # False: only the judge was asked (the rubrics are off the hot path: asked for a case
    # that goes on to a human, see Screener); no rv_* signals then
    rubrics_asked: bool = True

    #: the L2 signals every verdict gives (a tier policy may name these at L2)
    SIGNALS: ClassVar[tuple[str, ...]] = ("rv_coverage", "rv_precision", "rv_fbeta")
    #: the signal of a reviewer whose model is a fine-tuned judge (monitor.reviewer.judge)
    JUDGE_SIGNAL: ClassVar[str] = "judge_unsafe"

    def signals(self) -> dict[str, float]:
        if self.error is not None:
            return {}
        out = (dict(zip(self.SIGNALS, (self.coverage, self.precision, self.f_beta),
                        strict=True)) if self.rubrics_asked else {})
        if self.judge_unsafe is not None:
            out[self.JUDGE_SIGNAL] = self.judge_unsafe
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rubrics"] = [asdict(r) for r in self.rubrics]
        d["claims"] = [asdict(c) for c in self.claims]
        d["category_coverage"] = dict(self.category_coverage)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReviewVerdict:
        data = dict(d)
        data["rubrics"] = tuple(RubricScore(**r) for r in data.get("rubrics", ()))
        data["claims"] = tuple(Claim(**c) for c in data.get("claims", ()))
        data["category_coverage"] = dict(data.get("category_coverage") or {})
        return cls(**data)


# --- the FORK formulas ------------------------------------------------------------------


def coverage(scores: Sequence[tuple[float, float]]) -> float:
    """Weighted recall ``Σ w s / Σ w`` over ``(weight, score)`` pairs (0 for none)."""
    total = sum(w for w, _ in scores)
    if total <= 0:
        return 0.0
    return sum(w * s for w, s in scores) / total


def precision(claims: Sequence[Claim]) -> float:
    """Share of claims that are necessary and correct; 0 when there are none."""
    if not claims:
        return 0.0
    return sum(1 for c in claims if c.necessary and c.correct) / len(claims)


def f_beta(p: float, r: float, beta: float = 1.0) -> float:
    """``(1+β²) P R / (β² P + R)``; 0 when both are 0."""
    b2 = beta * beta
    den = b2 * p + r
    return 0.0 if den <= 0 else (1 + b2) * p * r / den


def category_coverage(scores: Sequence[RubricScore]) -> dict[str, float]:
    by: dict[str, list[tuple[float, float]]] = {}
    for s in scores:
        by.setdefault(s.category, []).append((s.weight, s.score))
    return {c: coverage(v) for c, v in by.items()}


def error_verdict(
    error: str, *, backend: str, model: str, step_key: str = "", cost: float = 0.0,
    latency_s: float = 0.0, beta: float = 1.0,
) -> ReviewVerdict:
    return ReviewVerdict(
        coverage=0.0, precision=0.0, f_beta=0.0, category=None, rubrics=(), claims=(),
        rationale=f"no review: {error}", backend=backend, model=model, cost=cost,
        latency_s=latency_s, error=error, beta=beta, step_key=step_key,
    )


def assemble_verdict(
    rubrics: Sequence[Rubric],
    scores: Sequence[float],
    view: StepView,
    *,
    logprobs: Sequence[tuple[float | None, float | None]] | None = None,
    beta: float = 1.0,
    backend: str,
    model: str,
    cost: float = 0.0,
    latency_s: float = 0.0,
    step_key: str = "",
    note: str = "",
) -> ReviewVerdict:
    """The verdict from per-rubric scores: claims, their checks, R, P and F_β, a rationale."""
    if len(scores) != len(rubrics):
        raise ValueError(f"{len(scores)} scores for {len(rubrics)} rubrics")
    if not all(math.isfinite(float(s)) for s in scores):
        raise ValueError("a rubric score is not a finite number")
    lps = logprobs or [(None, None)] * len(rubrics)
    rs = tuple(
        RubricScore(r.id, r.category, r.weight, min(1.0, max(0.0, float(s))), ly, ln)
        for r, s, (ly, ln) in zip(rubrics, scores, lps, strict=True)
    )
    claims: list[Claim] = []
    claimed: set[str] = set()
    for r, s in zip(rubrics, rs, strict=True):
        if s.score < CLAIM_AT:
            continue
        cand = best_evidence(r, view)
        ev = cand.text if cand else ""
        necessary, correct, why = check_claim(r, s.score, ev, view, earlier=claimed)
        claimed.add(r.id)
        cited = f"evidence {ev!r} in {cand.where}" if cand else "no evidence in the action"
        claims.append(
            Claim(
                text=f"{r.id} holds ({s.score:.2f}): {r.question} - {cited}",
                necessary=necessary,
                correct=correct,
                rubric_id=r.id,
                evidence=ev,
                where=cand.where if cand else "",
                why=why,
            )
        )
    cov = category_coverage(rs)
    best = max(cov, key=lambda c: (cov[c], c)) if cov else None
    satisfied = {s.category for s in rs if s.score >= CLAIM_AT}
    category = None
    if satisfied:
        category = max(satisfied, key=lambda c: (cov[c], c))
    r_val = cov[category] if category is not None else (cov[best] if best else 0.0)
    p_val = precision(claims)
    f_val = f_beta(p_val, r_val, beta)
    ok = sum(1 for c in claims if c.necessary and c.correct)
    lines = [
        f"{category or 'no category'}: coverage {r_val:.2f}, precision {p_val:.2f} "
        f"({ok} of {len(claims)} claims necessary and correct), F{beta:g} {f_val:.2f}."
    ]
    for c in claims:
        mark = "ok" if c.necessary and c.correct else f"rejected: {c.why}"
        lines.append(f"- {c.text} [{mark}]")
    if note:
        lines.append(note)
    return ReviewVerdict(
        coverage=r_val,
        precision=p_val,
        f_beta=f_val,
        category=category,
        rubrics=rs,
        claims=tuple(claims),
        rationale="\n".join(lines),
        backend=backend,
        model=model,
        cost=cost,
        latency_s=latency_s,
        beta=beta,
        category_coverage=cov,
        step_key=step_key,
    )
