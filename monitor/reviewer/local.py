"""The local backend: a transformers causal LM in this process (default Gemma-3-270M).

Each review is one call of :class:`~monitor.reviewer.engine.NextTokenEngine`:
the step block once, then the rubric questions in batches of ``batch_size``
over its cached keys and values. The calibration step (see
:mod:`monitor.reviewer.base`) runs once when the reviewer is built, like loading
the model, and is not charged to the budget. Cost is **seconds of model compute** (the
wall time of that call), so ``budget`` is a compute-time allowance. Reviews
run one at a time (``concurrency`` does not apply: one model uses all cores);
``timeout_s`` is checked between batches; ``retries`` do not apply.

How good is it? Gemma-3-270M is a small *base* model: asked a rubric question
it leans "yes" whatever the step, and after calibration its scores for a
clearly harmful step and a benign one differ by a few hundredths (see
``tests/reviewer/test_local.py`` and ``bench/results/reviewer.json``). It makes
the pipeline run offline end to end; for grading that means something, point
the reviewer at a capable model (``backend: openai`` with vLLM or SGLang, or
``model_path`` to a larger local instruction-tuned model).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from monitor.reviewer.base import (
    BUDGET_EXHAUSTED,
    JUDGE_ANSWERS,
    NULL_VIEW,
    RUBRIC_ANSWERS,
    Answers,
    ReviewerConfig,
    ReviewError,
    RubricReviewer,
    Scored,
)
from monitor.reviewer.engine import NextTokenEngine, ReviewTimeout, load_reviewer_model
from monitor.reviewer.judge import Judge, is_judge_bundle
from monitor.reviewer.rubrics import Rubric
from monitor.reviewer.view import rubric_prompt
from vigil.lm import LanguageModel

# content-free log-odds per (model, prompts): reviewers over one model compute them once
_NULL_CACHE: dict[tuple[str, str, str, tuple[str, ...]], list[float]] = {}
_NULL_LOCK = threading.Lock()


class LocalReviewer(RubricReviewer):
    """Scores rubrics by verdict-token log-probabilities from a local model."""

    backend = "local"

    def __init__(
        self,
        config: ReviewerConfig,
        rubrics: Sequence[Rubric] | None = None,
        *,
        model: LanguageModel | None = None,
    ) -> None:
        super().__init__(config, rubrics)
        if model is None and is_judge_bundle(config.model_path):
            judge = Judge(str(config.model_path), threads=config.threads)
            model = judge.lm
            self.judge_max_chars = config.judge_max_chars or judge.max_chars
            self.judge_evidence = judge.evidence
            self.judge_encoder = judge.encoder
        lm = model or load_reviewer_model(config.model_path, threads=config.threads)
        self.engine = NextTokenEngine(lm, batch_size=config.batch_size)
        self._answer_ids: dict[Answers, tuple[list[int], list[int]]] = {}
        for answers in (RUBRIC_ANSWERS, *((JUDGE_ANSWERS,) if self.judged else ())):
            pos, neg = (self.engine.token_ids(words) for words in answers)
            if not pos or not neg:
                raise ValueError(f"{lm.path}: the tokenizer has no single token for "
                                 f"{answers[0][0]!r} or {answers[1][0]!r}")
            self._answer_ids[answers] = (pos, neg)
        if config.calibrated:  # set-up, like loading the model: not charged to the budget
            prefix = NULL_VIEW.prefix(config.max_context_chars)
            prompts = [rubric_prompt(prefix, r.question) for r in self.rubrics]
            key = (lm.path, lm.model_id, lm.model_hash, tuple(prompts))
            with _NULL_LOCK:
                if key not in _NULL_CACHE:
                    _NULL_CACHE[key] = [ly - ln for ly, ln in self._logprobs(prompts)]
                self._null = list(_NULL_CACHE[key])

    @property
    def model_name(self) -> str:
        return self.engine.model_id

    def _logprobs(
        self, prompts: Sequence[str], deadline: float | None = None,
        answers: Answers = RUBRIC_ANSWERS,
    ) -> list[tuple[float, float]]:
        import torch

        pos, neg = self._answer_ids[answers]
        lp = self.engine.next_token_logprobs(prompts, deadline=deadline)
        ly = torch.logsumexp(lp[:, pos], dim=1).tolist()
        ln = torch.logsumexp(lp[:, neg], dim=1).tolist()
        return list(zip(ly, ln, strict=True))

    def _score(self, prompts: Sequence[str], deadline: float,
               answers: Answers = RUBRIC_ANSWERS) -> Scored:
        if not self.budget.reserve(0.0):
            raise ReviewError(BUDGET_EXHAUSTED)
        t0 = time.perf_counter()
        try:
            if time.monotonic() > deadline:
                raise ReviewTimeout("the review ran past its deadline")
            pairs = self._logprobs(prompts, deadline, answers)
        except BaseException:
            self.budget.settle(0.0, time.perf_counter() - t0)
            raise
        cost = time.perf_counter() - t0
        return Scored(list(pairs), cost=cost)
