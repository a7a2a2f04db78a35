"""The reviewer protocol, its configuration, the cost budget, and the shared review loop.

Both backends ask the model the same thing: for every rubric, the shared step
block (:mod:`monitor.reviewer.view`) plus the rubric's question, and read the
log-probabilities of the verdict tokens that come next. A rubric's score is
``s = P(yes) / (P(yes) + P(no))`` = ``σ(log P(yes) − log P(no))``, where
``P(yes)`` sums `` yes``/`` Yes`` (and ``no`` alike).

**Calibration** (``calibrate``; default on for the local backend, off for
endpoints): a small base model answers "yes" to nearly everything (Gemma-3-270M
gives ~0.7 on every rubric of every step). With calibration the reviewer first
asks every rubric about a content-free step (all fields "N/A") and subtracts
that log-odds: ``s = σ(Δ − Δ_null)`` (contextual calibration, Zhao et al. 2021),
so a step the model finds no different from nothing scores 0.5. A capable
endpoint says a firm "no" to an empty step, and subtracting that would inflate
every score, hence off there.

The content-free answers are computed once: the local backend when it is
built (set-up, not charged), an endpoint before its first review (charged).

**Budget** (``budget``, in the backend's cost unit; ``None`` = unlimited):
enforced before each review. An endpoint review reserves its worst-case cost
first (every prompt byte a token, ``max_tokens`` out, at the configured
prices) and is refused with ``error="budget exhausted"`` when the reservation
does not fit; the reservation is replaced by the cost the server reports in
``usage`` (or kept, when it reports none). So concurrent reviews never spend
past the budget. The local backend's cost is seconds of model compute, only
known afterwards: a review starts while less than the budget has been spent,
so the review that crosses it completes and the next ones are refused. A review
that fails part-way (a local timeout) is charged what it used, but its verdict
reports ``cost`` 0.

**Timeouts** (``timeout_s``): a deadline for one case, retries and backoff
included, so a verdict (possibly ``error="timed out ..."``) is back within
about ``timeout_s``. **Retries** (``retries``, endpoints only: local failures
are deterministic): connection errors, read timeouts while time remains, HTTP
408/429/5xx, with doubling backoff from 0.2 s (``Retry-After`` honoured when it
fits the deadline). **Concurrency** (``concurrency``, endpoints): at most that
many requests in flight per reviewer; the local backend runs one review at a
time (one model, all cores).

A verdict never goes back to the monitored agent: the reviewer only reads the
step and returns the verdict to its caller (the pipeline), and its prompt does
not include the L0/L1 signals.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

from monitor.reviewer.engine import ReviewTimeout
from monitor.reviewer.judge import (
    EVIDENCE_LEVELS,
    SAFE,
    UNSAFE,
    is_judge_bundle,
    judge_prompts,
)
from monitor.reviewer.rubrics import Rubric, load_rubrics
from monitor.reviewer.verdict import ReviewVerdict, assemble_verdict, error_verdict
from monitor.reviewer.view import StepView, rubric_prompt
from monitor.screening import ScreenStep

YES = (" yes", " Yes", "yes", "Yes")
NO = (" no", " No", "no", "No")
Answers = tuple[tuple[str, ...], tuple[str, ...]]  # (positive words, negative words)
RUBRIC_ANSWERS: Answers = (YES, NO)
JUDGE_ANSWERS: Answers = ((UNSAFE,), (SAFE,))
BUDGET_EXHAUSTED = "budget exhausted"


class ReviewError(RuntimeError):
    """A review that could not be done (its message becomes the verdict's ``error``)."""


@dataclass(frozen=True)
class ReviewCase:
    """A flagged step to review, with the L0/L1 signals it carried (not shown to the model)."""

    step: ScreenStep
    signals: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Reviewer(Protocol):
    """L2: grades steps against rubrics. Same order out as in; never raises for one case."""

    name: str

    def review(self, cases: Sequence[ReviewCase], *, rubrics: bool = True
               ) -> list[ReviewVerdict]: ...

    def add_rubrics(self, cases: Sequence[ReviewCase], verdicts: Sequence[ReviewVerdict]
                    ) -> list[ReviewVerdict]: ...

    def judge_trajectories(self, last_steps: Sequence[ScreenStep]) -> list[float | None]: ...

    def judge_steps(self, steps: Sequence[ScreenStep]) -> list[float | None]: ...


@dataclass(frozen=True)
class ReviewerConfig:
    """How to build a reviewer (the policy file's ``tiers.L2.reviewer`` mapping)."""

    backend: Literal["local", "openai"] = "local"
    model_path: str | None = None  # local: HF folder (default: the converted Gemma-3-270M)
    base_url: str | None = None  # openai: e.g. http://127.0.0.1:8001/v1
    model: str | None = None  # openai: served model name (None: the first of GET /models)
    api_key_env: str = "VIGIL_REVIEWER_API_KEY"
    timeout_s: float = 30.0
    retries: int = 2
    concurrency: int = 4
    budget: float | None = None
    price_per_1k_input: float = 0.0
    price_per_1k_output: float = 0.0
    rubrics: str | None = None
    beta: float = 1.0
    max_context_chars: int = 4000
    calibrate: bool | None = None  # None: on for local, off for openai
    threads: int | None = None  # local: torch threads (None: torch's default)
    batch_size: int = 8  # local: rubric prompts per forward pass
    top_logprobs: int = 5  # openai: top-k log-probabilities asked for (vLLM allows <= 20)
    # the model is a fine-tuned judge (`monitor reviewer train`): also ask it the verdict
    # question, for the signal judge_unsafe. None: on when model_path is a judge bundle.
    judge: bool | None = None
    judge_max_chars: int | None = None  # the judge's prompt size (None: the bundle's, or 1200)
    # openai: the served judge's --evidence level (0, 1, 2; local: read from its bundle)
    judge_evidence: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.backend in ("local", "openai"), f"backend must be 'local' or 'openai', "
             f"not {self.backend!r}"),
            (self.timeout_s > 0, f"timeout_s must be > 0 (got {self.timeout_s})"),
            (self.retries >= 0, f"retries must be >= 0 (got {self.retries})"),
            (self.concurrency >= 1, f"concurrency must be >= 1 (got {self.concurrency})"),
            (self.budget is None or self.budget >= 0, f"budget must be >= 0 (got {self.budget})"),
            (self.price_per_1k_input >= 0 and self.price_per_1k_output >= 0,
             "token prices must be >= 0"),
            (self.beta > 0, f"beta must be > 0 (got {self.beta})"),
            (self.max_context_chars >= 200,
             f"max_context_chars must be >= 200 (got {self.max_context_chars})"),
            (self.batch_size >= 1, f"batch_size must be >= 1 (got {self.batch_size})"),
            (1 <= self.top_logprobs <= 20, f"top_logprobs must be 1..20 (got {self.top_logprobs})"),
            (self.backend != "openai" or bool(self.base_url),
             "the openai backend needs base_url (e.g. http://127.0.0.1:8001/v1)"),
            (self.judge_max_chars is None or self.judge_max_chars >= 200,
             f"judge_max_chars must be >= 200 (got {self.judge_max_chars})"),
            (self.judge_evidence in EVIDENCE_LEVELS,
             f"judge_evidence must be one of {list(EVIDENCE_LEVELS)} (got "
             f"{self.judge_evidence!r})"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"reviewer config: {msg}")

    @property
    def calibrated(self) -> bool:
        return self.backend == "local" if self.calibrate is None else self.calibrate

    @property
    def judged(self) -> bool:
        """Whether the reviewer also asks its model the judge's verdict question."""
        if self.judge is not None:
            return self.judge
        return self.backend == "local" and is_judge_bundle(self.model_path)


class Budget:
    """A thread-safe spend counter with reservations; ``limit=None`` never refuses."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.spent = 0.0
        self.reserved = 0.0
        self._lock = threading.Lock()

    def reserve(self, amount: float) -> bool:
        with self._lock:
            if self.limit is not None and (
                self.spent >= self.limit or self.spent + self.reserved + amount > self.limit
            ):
                return False
            self.reserved += amount
            return True

    def settle(self, reserved: float, actual: float) -> None:
        with self._lock:
            self.reserved -= reserved
            self.spent += actual

    @property
    def remaining(self) -> float | None:
        return None if self.limit is None else max(0.0, self.limit - self.spent)


@dataclass(frozen=True)
class Scored:
    """What a backend returns for one batch of rubric prompts."""

    logprobs: list[tuple[float | None, float | None]]  # (log P(yes), log P(no)) a prompt
    cost: float
    reserved: float = 0.0  # the budget reservation this call used (settled by the caller)


def verdict_score(lp_yes: float | None, lp_no: float | None, null: float = 0.0) -> float:
    """``σ(log P(yes) − log P(no) − null)``; 0.5 when neither token is known."""
    if lp_yes is None or lp_no is None:
        return 0.5
    d = lp_yes - lp_no - null
    return 1.0 / (1.0 + math.exp(-d)) if d > -700 else 0.0


NULL_VIEW = StepView(
    task="N/A", read="N/A", action="N/A", tool=None, arguments=(), result="N/A", history=(),
    observation="N/A",
)


class RubricReviewer:
    """The review loop both backends share; a backend implements :meth:`_score`."""

    backend: str = ""

    def __init__(self, config: ReviewerConfig, rubrics: Sequence[Rubric] | None = None) -> None:
        self.config = config
        self.rubrics = list(rubrics) if rubrics is not None else load_rubrics(config.rubrics)
        self.budget = Budget(config.budget)
        self.name = f"reviewer-{config.backend}"
        self._null: list[float] | None = None
        self._null_lock = threading.Lock()
        self.judge_max_chars = config.judge_max_chars or 1200
        self.judge_evidence = config.judge_evidence
        self.judge_encoder = "minilm"  # a local judge bundle's own (LocalReviewer)
        self.judged = config.judged  # once: it may look for a bundle on disk

    # -- for backends -----------------------------------------------------------------
    @property
    def model_name(self) -> str:
        raise NotImplementedError

    def model_for(self, deadline: float) -> str:
        """The model's name, looked up (if need be) before ``deadline``."""
        return self.model_name

    def _score(self, prompts: Sequence[str], deadline: float,
               answers: Answers = RUBRIC_ANSWERS) -> Scored:
        """(log P(positive), log P(negative)) of the ``answers`` words as the next token
        of each of ``prompts`` (budget reserved inside)."""
        raise NotImplementedError

    def _judge(self, step: ScreenStep, deadline: float, mode: str = "step"
               ) -> tuple[float, float]:
        """The judge's P(unsafe) for ``step`` (its ``mode`` question) and what asking cost."""
        got = self._score(self._judge_prompts([step], mode),
                          deadline, JUDGE_ANSWERS)
        self.budget.settle(got.reserved, got.cost)
        [(lu, ls)] = got.logprobs
        if lu is None or ls is None:
            raise ReviewError("the judge's answer has neither verdict token in its top "
                              "log-probabilities: is the model a judge?")
        return verdict_score(lu, ls), got.cost

    def _judge_prompts(self, steps: Sequence[ScreenStep], mode: str) -> list[str]:
        return judge_prompts(steps, mode=mode, max_chars=self.judge_max_chars,
                             evidence_level=int(self.judge_evidence),
                             encoder=self.judge_encoder)

    def _judge_many(self, steps: Sequence[ScreenStep], mode: str = "step"
                    ) -> list[tuple[float | None, float]]:
        """:meth:`_judge` for many steps, their prompts scored together (a batch the length
        of the engine's, each batch with one case's timeout): (P(unsafe), cost) each; None
        where the batch timed out or the answer had no verdict token."""
        out: list[tuple[float | None, float]] = []
        step = max(1, 2 * self.config.batch_size)
        for start in range(0, len(steps), step):
            chunk = steps[start : start + step]
            try:
                got = self._score(self._judge_prompts(chunk, mode),
                                  time.monotonic() + self.config.timeout_s,
                                  JUDGE_ANSWERS)
            except (ReviewTimeout, ReviewError):
                out.extend((None, 0.0) for _ in chunk)
                continue
            self.budget.settle(got.reserved, got.cost)
            each = got.cost / len(chunk)
            out.extend((verdict_score(lu, ls) if lu is not None and ls is not None else None,
                        each) for lu, ls in got.logprobs)
        return out

    # -- the loop -----------------------------------------------------------------------
    def review(self, cases: Sequence[ReviewCase], *, rubrics: bool = True
               ) -> list[ReviewVerdict]:
        """A verdict for each case; a judge's question is asked of all of them together
        after the rubrics (a judge that fails on a case leaves ``judge_unsafe`` unknown).
        ``rubrics=False`` (a judge only): the judge's question alone, ``rubrics_asked``
        False; :meth:`add_rubrics` asks the rubrics later, of the cases that need them."""
        if not rubrics and self.judged:
            verdicts = [self._judge_only(c) for c in cases]
        else:
            verdicts = [self.review_one(c, judge=False) for c in cases]
        if not self.judged:
            return verdicts
        todo = [i for i, v in enumerate(verdicts) if v.error is None]
        got = self._judge_many([cases[i].step for i in todo])
        for i, (p, cost) in zip(todo, got, strict=True):
            v = verdicts[i]
            note = "" if p is None else f"\nThe fine-tuned judge gives P(unsafe) = {p:.3f}."
            verdicts[i] = replace(v, judge_unsafe=p, cost=v.cost + cost,
                                  rationale=v.rationale + note)
        return verdicts

    def _judge_only(self, case: ReviewCase) -> ReviewVerdict:
        """The verdict :meth:`review` fills with the judge's answer alone."""
        key = str(getattr(getattr(case, "step", None), "key", ""))
        return ReviewVerdict(
            coverage=0.0, precision=0.0, f_beta=0.0, category=None, rubrics=(), claims=(),
            rationale="The rubrics were not asked on the hot path (the judge alone).",
            backend=self.backend, model=self.config.model or "", step_key=key,
            beta=self.config.beta, rubrics_asked=False)

    def add_rubrics(self, cases: Sequence[ReviewCase], verdicts: Sequence[ReviewVerdict]
                    ) -> list[ReviewVerdict]:
        """``verdicts`` (from ``review(cases, rubrics=False)``) with the rubrics asked now,
        keeping the judge's answer: for a case that goes on to a human, whose page shows
        the rubric coverage and the claims. A verdict that has its rubrics, or whose
        rubric review fails, is returned as it is (the failure in its rationale)."""
        out = list(verdicts)
        for i, (c, v) in enumerate(zip(cases, verdicts, strict=True)):
            if v.rubrics_asked or v.error is not None:
                continue
            got = self.review_one(c, judge=False)
            if got.error is not None:
                out[i] = replace(v, rationale=f"{v.rationale}\nRubrics: {got.error}.")
                continue
            note = ("" if v.judge_unsafe is None else
                    f"\nThe fine-tuned judge gives P(unsafe) = {v.judge_unsafe:.3f}.")
            out[i] = replace(got, judge_unsafe=v.judge_unsafe, cost=v.cost + got.cost,
                             latency_s=v.latency_s + got.latency_s,
                             rationale=got.rationale + note)
        return out

    def judge_steps(self, steps: Sequence[ScreenStep]) -> list[float | None]:
        """The judge's P(unsafe) for each step's action (its step question, asked of all
        together); None for each when the model is not a judge, and where a review failed."""
        if not self.judged:
            return [None for _ in steps]
        return [p for p, _ in self._judge_many(steps, "step")]

    def judge_trajectories(self, last_steps: Sequence[ScreenStep]) -> list[float | None]:
        """The judge's P(unsafe) that some action of each trajectory was unsafe, from its
        last step (the judge's trajectory question, asked of all together); None for each
        when the model is not a judge, and for one whose review failed (timeout, budget, a
        malformed reply)."""
        if not self.judged:
            return [None for _ in last_steps]
        return [p for p, _ in self._judge_many(last_steps, "trajectory")]

    def _null_logodds(self, deadline: float) -> list[float]:
        if not self.config.calibrated:
            return [0.0] * len(self.rubrics)
        with self._null_lock:
            if self._null is None:
                prefix = NULL_VIEW.prefix(self.config.max_context_chars)
                got = self._score([rubric_prompt(prefix, r.question) for r in self.rubrics],
                                  deadline)
                self.budget.settle(got.reserved, got.cost)
                self._null = [
                    (ly - ln) if ly is not None and ln is not None else 0.0
                    for ly, ln in got.logprobs
                ]
            return self._null

    def review_one(self, case: ReviewCase, *, judge: bool = True) -> ReviewVerdict:
        """One verdict; every failure becomes ``error`` (this never raises). ``judge=False``:
        the rubrics only (:meth:`review` asks the judge of a whole batch at once)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.config.timeout_s
        key = str(getattr(getattr(case, "step", None), "key", ""))
        model = self.config.model or ""

        def fail(msg: str, cost: float = 0.0) -> ReviewVerdict:
            return error_verdict(
                msg, backend=self.backend, model=model, step_key=key, cost=cost,
                latency_s=time.perf_counter() - t0, beta=self.config.beta,
            )

        cost = 0.0
        try:
            model = self.model_for(deadline)
            if not isinstance(case.step, ScreenStep):
                got_type = type(case.step).__name__
                raise ReviewError(f"a review case needs a ScreenStep, got {got_type}")
            null = self._null_logodds(deadline)
            view = StepView.of(case.step)
            prefix = view.prefix(self.config.max_context_chars)
            got = self._score([rubric_prompt(prefix, r.question) for r in self.rubrics], deadline)
            self.budget.settle(got.reserved, got.cost)
            cost = got.cost
            if len(got.logprobs) != len(self.rubrics):
                raise ReviewError(
                    f"the backend answered {len(got.logprobs)} of {len(self.rubrics)} rubrics"
                )
            scores = [verdict_score(ly, ln, n) for (ly, ln), n in zip(got.logprobs, null,
                                                                        strict=True)]
            notes = []
            if self.config.calibrated:
                notes.append("Scores are calibrated against a content-free step "
                             "(0.5 = no different).")
            judged = None
            if self.judged and judge:
                judged, spent = self._judge(case.step, deadline)
                cost += spent
                notes.append(f"The fine-tuned judge gives P(unsafe) = {judged:.3f}.")
            verdict = assemble_verdict(
                self.rubrics, scores, view, logprobs=got.logprobs, beta=self.config.beta,
                backend=self.backend, model=model, cost=cost,
                latency_s=time.perf_counter() - t0, step_key=key, note="\n".join(notes),
            )
            return replace(verdict, judge_unsafe=judged)
        except ReviewTimeout:
            msg = f"timed out after {self.config.timeout_s:g} s"
        except ReviewError as e:
            msg = str(e)
        except Exception as e:  # never raise for one bad case
            msg = f"{type(e).__name__}: {e}"
        return fail(msg, cost)
