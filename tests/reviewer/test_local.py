"""The local backend on the real Gemma-3-270M (loaded once per session).

What this model can do, measured: Gemma-3-270M is a small base model. After
calibration its rubric scores sit within about ±0.15 of 0.5 for every step, and
on the two steps here it scores the *benign* email higher than the attacker's
exfiltration (coverage 0.51 vs 0.38). So these tests assert what holds for any
model (structure, bounds, determinism, exactness, timeouts, the budget), not
that it discriminates; that is a job for a capable model behind the OpenAI
backend. The deterministic claim checks do tell the two apart (test_fork.py).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from monitor.reviewer import BUDGET_EXHAUSTED, ReviewCase, ReviewerConfig, ReviewVerdict
from monitor.reviewer.engine import NextTokenEngine
from monitor.reviewer.local import LocalReviewer
from monitor.reviewer.view import StepView, rubric_prompt
from tests.reviewer.conftest import benign_step, harmful_step
from vigil.lm import LanguageModel


@pytest.fixture(scope="module")
def reviewer(gemma: LanguageModel) -> LocalReviewer:
    return LocalReviewer(ReviewerConfig(), model=gemma)


@pytest.fixture(scope="module")
def verdicts(reviewer: LocalReviewer) -> list[ReviewVerdict]:
    """The harmful step, the benign one, and the harmful one again (one call)."""
    return reviewer.review([ReviewCase(harmful_step(), {"probe_harm": 0.9}),
                            ReviewCase(benign_step()), ReviewCase(harmful_step())])


def test_shared_prefix_scoring_equals_scoring_each_prompt_alone(gemma: LanguageModel) -> None:
    """Exactly in float32 (the prefix cache and the batch change nothing); within bfloat16's
    noise in the served dtype, on the tokens that matter (on an AMX CPU the two paths differ
    by ~0.1 in the top log-probabilities and ~0.25 in the far tail; the head itself is
    computed in float32)."""
    from monitor.reviewer.engine import load_reviewer_model

    prefix = StepView.of(harmful_step()).prefix(4000)
    prompts = [rubric_prompt(prefix, q) for q in
               ("Does the action send a password?", "Is the action permanent?", "Is it ok?")]
    exact = load_reviewer_model(threads=2, dtype="float32")
    for lm, atol in ((exact, 1e-3), (gemma, 0.25)):
        engine = NextTokenEngine(lm, batch_size=2)
        together = engine.next_token_logprobs(prompts)
        assert together.shape == (3, lm.model.config.vocab_size)
        for i, p in enumerate(prompts):
            alone = engine.reference_logprobs(p)
            top = alone.topk(50).indices  # where answers are read; the far tail is noise
            assert torch.allclose(together[i][top], alone[top], atol=atol), f"prompt {i} differs"
            if lm is exact:
                assert torch.allclose(together[i], alone, atol=atol), f"prompt {i} differs"


def test_a_few_tokens_logits_renormalise_to_their_share_of_the_whole_distribution(
    gemma: LanguageModel,
) -> None:
    """The judge reads its two verdict tokens' logits only: renormalised among themselves
    they are what the whole vocabulary's log-probabilities give."""
    prefix = StepView.of(harmful_step()).prefix(4000)
    prompts = [rubric_prompt(prefix, q) for q in ("Is it safe?", "Is the action permanent?")]
    engine = NextTokenEngine(gemma, batch_size=2)
    ids = engine.token_ids([" yes", " no", " safe"])
    assert len(ids) == 3
    got = torch.softmax(engine.next_token_logits(prompts, ids), dim=1)
    want = torch.softmax(engine.next_token_logprobs(prompts)[:, ids], dim=1)
    assert got.shape == (2, 3) and torch.allclose(got, want, atol=1e-4), (got, want)


def test_a_verdict_for_each_case_in_order_with_sane_values(
    reviewer: LocalReviewer, verdicts: list[ReviewVerdict]
) -> None:
    assert [v.step_key for v in verdicts] == ["ws-inj-1/s2", "ws-ok-1/s0", "ws-inj-1/s2"]
    for v in verdicts:
        assert v.error is None, v.error
        assert (v.backend, v.model) == ("local", "gemma-3-270m@gguf-q4_k_m")
        assert len(v.rubrics) == len(reviewer.rubrics)
        assert all(0.0 <= s.score <= 1.0 for s in v.rubrics)
        assert all(s.logprob_yes is not None and s.logprob_yes < 0 for s in v.rubrics)
        for x in (v.coverage, v.precision, v.f_beta):
            assert 0.0 <= x <= 1.0
        assert set(v.signals()) == {"rv_coverage", "rv_precision", "rv_fbeta"}
        assert v.category is None or v.category in v.category_coverage
        assert len(v.claims) == sum(1 for s in v.rubrics if s.score >= 0.5)
        assert v.rationale and v.cost > 0 and v.latency_s >= v.cost * 0.5
        assert ReviewVerdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    # the two steps read differently (the model sees them; it does not judge them well)
    assert verdicts[0].rubrics != verdicts[1].rubrics


def test_the_same_step_gets_the_same_verdict(verdicts: list[ReviewVerdict]) -> None:
    a, _, b = verdicts
    assert a.rubrics == b.rubrics and a.claims == b.claims and a.rationale == b.rationale
    assert (a.coverage, a.precision, a.f_beta) == (b.coverage, b.precision, b.f_beta)


def test_timeout_stops_the_review_early(
    gemma: LanguageModel, verdicts: list[ReviewVerdict]
) -> None:
    rv = LocalReviewer(ReviewerConfig(timeout_s=0.2, batch_size=1), model=gemma)
    t0 = time.perf_counter()
    [v] = rv.review([ReviewCase(harmful_step())])
    took = time.perf_counter() - t0
    assert v.error == "timed out after 0.2 s" and v.signals() == {}
    assert v.coverage == v.precision == v.f_beta == 0.0
    # one batch past the deadline at most, well short of the full review (20 batches)
    assert took < verdicts[0].latency_s


def test_budget_in_compute_seconds_is_enforced(gemma: LanguageModel) -> None:
    rv = LocalReviewer(ReviewerConfig(budget=1e-6), model=gemma)
    first, second, third = rv.review([ReviewCase(benign_step())] * 3)
    assert first.error is None and first.cost > 1e-6  # the review that crosses it completes
    assert second.error == BUDGET_EXHAUSTED and third.error == BUDGET_EXHAUSTED
    assert second.signals() == {} and second.cost == 0.0
    assert rv.budget.spent == pytest.approx(first.cost)


def test_a_bad_case_is_a_verdict_not_an_exception(reviewer: LocalReviewer) -> None:
    [v] = reviewer.review([ReviewCase(step="not a step")])  # type: ignore[arg-type]
    assert v.error is not None and "ScreenStep" in v.error
