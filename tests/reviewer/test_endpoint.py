"""The OpenAI-compatible backend against real HTTP servers on loopback.

The model server is ``monitor.reviewer.serve`` over the real Gemma-3-270M in
uvicorn; the misbehaving servers (slow, failing, counting) are stdlib HTTP
servers from conftest.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from monitor.reviewer import (
    BUDGET_EXHAUSTED,
    ReviewCase,
    ReviewerConfig,
    ReviewVerdict,
    build_reviewer,
)
from monitor.reviewer.endpoint import OpenAIReviewer
from monitor.reviewer.local import LocalReviewer
from tests.reviewer.conftest import benign_step, fixed_completion, harmful_step, http_server
from vigil.lm import LanguageModel


def _openai(base_url: str, **kw: Any) -> OpenAIReviewer:
    rv = build_reviewer(ReviewerConfig(backend="openai", base_url=base_url, **kw))
    assert isinstance(rv, OpenAIReviewer)
    return rv


@pytest.fixture(scope="module")
def local_uncalibrated(gemma: LanguageModel) -> ReviewVerdict:
    rv = LocalReviewer(ReviewerConfig(calibrate=False), model=gemma)
    [v] = rv.review([ReviewCase(benign_step())])
    return v


def test_server_speaks_the_openai_completions_api(gemma_server: str) -> None:
    models = httpx.get(f"{gemma_server}/models").json()
    assert [m["id"] for m in models["data"]] == ["gemma-test"]
    r = httpx.post(f"{gemma_server}/completions", timeout=120, json={
        "model": "gemma-test", "prompt": ["The capital of France is", "One, two,"],
        "max_tokens": 3, "logprobs": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for c in body["choices"]:
        assert c["text"] and len(c["logprobs"]["tokens"]) <= 3
        assert len(c["logprobs"]["top_logprobs"][0]) == 5
        assert all(v <= 0 for v in c["logprobs"]["top_logprobs"][0].values())
    assert body["usage"]["prompt_tokens"] > 6 and body["usage"]["completion_tokens"] <= 6
    assert httpx.post(f"{gemma_server}/completions",
                      json={"model": "other", "prompt": "x"}).status_code == 404
    assert httpx.post(f"{gemma_server}/completions",
                      json={"prompt": "x", "echo": True}).status_code == 400


def test_reviewer_over_the_real_server_matches_the_local_backend(
    gemma_server: str, local_uncalibrated: ReviewVerdict
) -> None:
    with _openai(gemma_server, top_logprobs=20, price_per_1k_input=0.5,
                 price_per_1k_output=1.0) as rv:
        [v] = rv.review([ReviewCase(benign_step())])
    assert v.error is None, v.error
    assert (v.backend, v.model) == ("openai", "gemma-test")  # the name from GET /models
    local = {s.rubric_id: s.score for s in local_uncalibrated.rubrics}
    # same model, same prompts: the same scores through HTTP, within bfloat16 noise (the
    # server scores each prompt alone, the local backend batches them on a shared prefix:
    # 0.022 seen on an AMX CPU; float32 agrees exactly, tests/reviewer/test_local.py)
    for s in v.rubrics:
        assert s.score == pytest.approx(local[s.rubric_id], abs=0.05), s.rubric_id
    assert v.coverage == pytest.approx(local_uncalibrated.coverage, abs=0.05)
    # priced from the server's usage: ~20 prompts of a few hundred tokens, one token out each
    assert 0.5 < v.cost < 10 * 0.5
    assert set(v.signals()) == {"rv_coverage", "rv_precision", "rv_fbeta"}


def test_a_server_that_sleeps_gives_a_timeout_verdict_within_the_timeout() -> None:
    with http_server(fixed_completion, delay_s=5.0) as (url, rec), \
            _openai(url, model="m", timeout_s=0.5, retries=3) as rv:
        t0 = time.perf_counter()
        [v] = rv.review([ReviewCase(harmful_step())])
        took = time.perf_counter() - t0
    assert v.error == "timed out after 0.5 s"
    assert v.signals() == {}
    assert took < 1.5
    assert rec.requests == 1  # no time was left to retry


def test_a_server_that_fails_once_is_retried(
    gemma_server: str, local_uncalibrated: ReviewVerdict
) -> None:
    def flaky(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any] | str]:
        if n == 0:
            return 503, '{"error": {"message": "warming up"}}'
        r = httpx.post(f"{gemma_server}/completions", json=body, timeout=300)
        return r.status_code, r.json()

    with http_server(flaky) as (url, rec), _openai(url, model="gemma-test", top_logprobs=20,
                                                   timeout_s=300, retries=2) as rv:
        [v] = rv.review([ReviewCase(benign_step())])
    assert v.error is None, v.error
    assert rec.requests == 2
    assert v.coverage == pytest.approx(local_uncalibrated.coverage, abs=0.05)  # bf16 noise


def test_retries_give_up_with_a_clear_error() -> None:
    with http_server(lambda b, n: (500, "boom")) as (url, rec), \
            _openai(url, model="m", retries=1, timeout_s=10) as rv:
        [v] = rv.review([ReviewCase(benign_step())])
    assert v.error is not None and "HTTP 500, after 2 attempts" in v.error
    assert rec.requests == 2


@pytest.mark.parametrize("reply", [
    {"choices": "nope"},
    {"choices": [{"index": 0, "text": "yes"}]},
    "not json at all",
])
def test_a_malformed_reply_is_a_verdict_with_an_error(reply: Any) -> None:
    with http_server(lambda b, n: (200, reply)) as (url, rec), \
            _openai(url, model="m", retries=2) as rv:
        [v] = rv.review([ReviewCase(benign_step())])
    assert v.error is not None and v.signals() == {}
    assert rec.requests == 1  # malformed is not retried


def test_budget_is_never_overspent() -> None:
    # 1000 prompt tokens a review at 0.001/1k = 0.001; the worst-case reservation is larger
    with http_server(fixed_completion) as (url, rec), \
            _openai(url, model="m", concurrency=1, price_per_1k_input=0.001,
                    budget=0.05) as rv:
        verdicts = rv.review([ReviewCase(harmful_step()) for _ in range(40)])
    done = [v for v in verdicts if v.error is None]
    refused = [v for v in verdicts if v.error == BUDGET_EXHAUSTED]
    assert done and refused and len(done) + len(refused) == 40
    assert all(v.cost == pytest.approx(0.001) for v in done)  # from usage, not the reserve
    assert sum(v.cost for v in verdicts) <= 0.05
    assert rec.requests == len(done)  # a refused review sends nothing
    assert verdicts.index(refused[0]) == len(done)  # once exhausted, it stays exhausted


def test_concurrency_limit_is_respected() -> None:
    with http_server(fixed_completion, delay_s=0.3) as (url, rec), \
            _openai(url, model="m", concurrency=3) as rv:
        t0 = time.perf_counter()
        verdicts = rv.review([ReviewCase(benign_step()) for _ in range(9)])
        took = time.perf_counter() - t0
    assert all(v.error is None for v in verdicts)
    assert rec.max_in_flight == 3  # reached, never exceeded
    assert took >= 3 * 0.3 * 0.9  # 9 requests, 3 at a time


def test_concurrent_review_calls_share_the_limit() -> None:
    with http_server(fixed_completion, delay_s=0.2) as (url, rec), \
            _openai(url, model="m", concurrency=2) as rv:
        threads = [threading.Thread(target=rv.review, args=([ReviewCase(benign_step())] * 3,))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert rec.requests == 9 and rec.max_in_flight == 2


def test_unreachable_endpoint_is_an_error_verdict() -> None:
    from tests.reviewer.conftest import free_port

    with _openai(f"http://127.0.0.1:{free_port()}/v1", retries=1, timeout_s=5) as rv:
        [v] = rv.review([ReviewCase(benign_step())])
    assert v.error is not None and "could not be reached" in v.error


def test_openai_backend_needs_a_base_url() -> None:
    with pytest.raises(ValueError, match="needs base_url"):
        ReviewerConfig(backend="openai")
