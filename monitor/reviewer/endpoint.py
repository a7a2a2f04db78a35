"""The OpenAI-compatible backend: any server with ``POST /v1/completions`` and ``logprobs``.

Why ``/completions`` with log-probabilities and not ``/chat/completions`` with a
JSON answer: the verdict is then the same measurement on every backend (the
probability of the verdict tokens, no parsing of free text the model may get
wrong), it works with base and instruction-tuned models alike, vLLM, SGLang and
``monitor.reviewer.serve`` all implement it, and one request carries every
rubric of a step (``prompt`` is a list; the servers share the common prefix).
The claims and the rationale are built from the scores and checked
deterministically (:mod:`monitor.reviewer.evidence`), as for the local backend.

One request per review::

    POST {base_url}/completions
    {"model": M, "prompt": [p_1, ..., p_n], "max_tokens": 1, "temperature": 0,
     "logprobs": top_logprobs}

and from the reply ``choices[i].logprobs.top_logprobs[0]`` (``{token: logprob}``,
or a list of ``{"token", "logprob"}``) the yes/no tokens (any case, any
surrounding spaces). A verdict token missing from the top-k is bounded by the
smallest top-k log-probability; a rubric with neither scores 0.5. A reply that
is not this shape is a verdict with ``error`` (no retry: the server would say it
again). Cost: ``usage.prompt_tokens`` and ``completion_tokens`` at the
configured prices per 1k tokens (USD, or whatever unit the prices are in).
An API key, if any, is read from the environment variable ``api_key_env`` and
sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from monitor.reviewer.base import (
    BUDGET_EXHAUSTED,
    RUBRIC_ANSWERS,
    Answers,
    ReviewCase,
    ReviewerConfig,
    ReviewError,
    RubricReviewer,
    Scored,
)
from monitor.reviewer.engine import ReviewTimeout
from monitor.reviewer.rubrics import Rubric
from monitor.reviewer.verdict import ReviewVerdict

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
BACKOFF_S = 0.2


def _logsumexp(values: Sequence[float]) -> float | None:
    if not values:
        return None
    m = max(values)
    return m + math.log(sum(math.exp(v - m) for v in values))


def _top_logprobs(choice: Any) -> dict[str, float]:
    lp = choice.get("logprobs") if isinstance(choice, Mapping) else None
    top = lp.get("top_logprobs") if isinstance(lp, Mapping) else None
    if not isinstance(top, list) or not top:
        raise ReviewError("the endpoint's reply has no logprobs.top_logprobs for a prompt")
    first = top[0]
    out: dict[str, float] = {}
    if isinstance(first, Mapping):
        items = list(first.items())
    elif isinstance(first, list):
        items = [(t.get("token"), t.get("logprob")) for t in first if isinstance(t, Mapping)]
    else:
        items = []
    for tok, val in items:
        if isinstance(tok, str) and isinstance(val, int | float) and math.isfinite(val):
            out[tok] = float(val)
    if not out:
        raise ReviewError("the endpoint's reply has an empty or malformed top_logprobs entry")
    return out


def verdict_logprobs(
    top: Mapping[str, float], answers: Answers = RUBRIC_ANSWERS
) -> tuple[float | None, float | None]:
    """``(log P(positive), log P(negative))`` of the ``answers`` words (any case, any
    surrounding spaces) from a top-k map; a missing one is bounded by the k-th."""
    pos_words, neg_words = ({w.strip().lower() for w in words} for words in answers)
    yes = [v for t, v in top.items() if t.strip().lower() in pos_words]
    no = [v for t, v in top.items() if t.strip().lower() in neg_words]
    if not yes and not no:
        return None, None
    floor = min(top.values())
    ly, ln = _logsumexp(yes), _logsumexp(no)
    return (ly if ly is not None else floor), (ln if ln is not None else floor)


def parse_completions(
    body: Any, n: int, answers: Answers = RUBRIC_ANSWERS
) -> tuple[list[tuple[float | None, float | None]], int | None, int | None]:
    """Verdict log-probabilities for ``n`` prompts, and the usage token counts."""
    if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list):
        raise ReviewError("the endpoint's reply is not a completions object (no 'choices' list)")
    choices = body["choices"]
    if len(choices) != n:
        raise ReviewError(f"the endpoint answered {len(choices)} choices for {n} prompts")
    ordered: list[Any] = [None] * n
    for pos, c in enumerate(choices):
        idx = c.get("index", pos) if isinstance(c, Mapping) else pos
        if not isinstance(idx, int) or not 0 <= idx < n or ordered[idx] is not None:
            raise ReviewError(f"the endpoint's reply has a bad or repeated choice index {idx!r}")
        ordered[idx] = c
    pairs = [verdict_logprobs(_top_logprobs(c), answers) for c in ordered]
    raw_usage = body.get("usage")
    usage: Mapping[str, Any] = raw_usage if isinstance(raw_usage, Mapping) else {}
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return pairs, (pt if isinstance(pt, int) else None), (ct if isinstance(ct, int) else None)


class OpenAIReviewer(RubricReviewer):
    """Scores rubrics through an OpenAI-compatible ``/completions`` endpoint."""

    backend = "openai"

    def __init__(self, config: ReviewerConfig, rubrics: Sequence[Rubric] | None = None) -> None:
        super().__init__(config, rubrics)
        assert config.base_url is not None  # checked by ReviewerConfig
        self.base_url = config.base_url.rstrip("/")
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            headers=headers,
            limits=httpx.Limits(max_connections=config.concurrency,
                                max_keepalive_connections=config.concurrency),
        )
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="vigil-reviewer")
        self._gate = threading.BoundedSemaphore(config.concurrency)
        self._model: str | None = config.model
        self._model_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> OpenAIReviewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def review(self, cases: Sequence[ReviewCase], *, rubrics: bool = True
               ) -> list[ReviewVerdict]:
        """Reviews ``cases`` at most ``concurrency`` at a time, in order; ``rubrics=False``
        with a judge: its question alone, the cases' prompts in batched requests."""
        if not rubrics and self.judged:
            return super().review(cases, rubrics=False)
        return list(self._pool.map(self.review_one, cases))

    @property
    def model_name(self) -> str:
        return self.model_for(time.monotonic() + self.config.timeout_s)

    def model_for(self, deadline: float) -> str:
        with self._model_lock:
            if self._model is None:
                body = self._request("GET", "/models", None, deadline)
                data = body.get("data") if isinstance(body, Mapping) else None
                if not isinstance(data, list) or not data or not isinstance(data[0], Mapping):
                    raise ReviewError(f"{self.base_url}/models lists no model; set 'model'")
                self._model = str(data[0].get("id"))
            return self._model

    def _worst_case_cost(self, prompts: Sequence[str]) -> float:
        tokens_in = sum(len(p.encode()) + 4 for p in prompts)  # a token is at least one byte
        tokens_out = len(prompts)  # max_tokens = 1
        return (tokens_in * self.config.price_per_1k_input
                + tokens_out * self.config.price_per_1k_output) / 1000

    def _score(self, prompts: Sequence[str], deadline: float,
               answers: Answers = RUBRIC_ANSWERS) -> Scored:
        reserve = self._worst_case_cost(prompts)
        if not self.budget.reserve(reserve):
            raise ReviewError(BUDGET_EXHAUSTED)
        payload = {
            "model": self.model_for(deadline),
            "prompt": list(prompts),
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": self.config.top_logprobs,
        }
        try:
            body = self._request("POST", "/completions", payload, deadline)
            pairs, pt, ct = parse_completions(body, len(prompts), answers)
        except BaseException:
            self.budget.settle(reserve, 0.0)
            raise
        if pt is None or ct is None:
            cost = reserve  # the server did not say: charge the worst case
        else:
            c = self.config
            cost = (pt * c.price_per_1k_input + ct * c.price_per_1k_output) / 1000
        return Scored(pairs, cost=cost, reserved=reserve)

    def _request(self, method: str, path: str, payload: Any, deadline: float) -> Any:
        url = f"{self.base_url}{path}"
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReviewTimeout(f"{url}: no answer before the deadline")
            retry_after: float | None = None
            try:
                with self._gate:
                    resp = self._client.request(method, url, json=payload,
                                                timeout=httpx.Timeout(left))
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError:
                        raise ReviewError(f"{url} answered 200 with a non-JSON body") from None
                if resp.status_code not in RETRY_STATUS:
                    raise ReviewError(
                        f"{url} answered HTTP {resp.status_code}: {resp.text[:200].strip()}"
                    )
                failure = f"{url} answered HTTP {resp.status_code}"
                ra = resp.headers.get("retry-after")
                if ra is not None:
                    try:
                        retry_after = float(ra)
                    except ValueError:
                        retry_after = None
            except httpx.TimeoutException:
                if deadline - time.monotonic() <= 0:
                    raise ReviewTimeout(f"{url}: no answer before the deadline") from None
                failure = f"{url} timed out"
            except httpx.TransportError as e:
                failure = f"{url} could not be reached ({type(e).__name__}: {e})"
            if attempt >= self.config.retries:
                raise ReviewError(f"{failure}, after {attempt + 1} attempts")
            wait = BACKOFF_S * (2**attempt)
            if retry_after is not None:
                wait = max(wait, retry_after)
            if time.monotonic() + wait >= deadline:
                raise ReviewTimeout(f"{failure}; no time left to retry")
            time.sleep(wait)
            attempt += 1
