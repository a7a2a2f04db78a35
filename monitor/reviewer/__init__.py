"""The L2 LLM reviewer: grades a flagged step against weighted safety rubrics (FORK).

    from monitor.reviewer import ReviewerConfig, ReviewCase, build_reviewer

    reviewer = build_reviewer(ReviewerConfig())                    # local Gemma-3-270M
    reviewer = build_reviewer(ReviewerConfig(backend="openai",     # vLLM, SGLang, serve.py
                                             base_url="http://127.0.0.1:8001/v1"))
    [verdict] = reviewer.review([ReviewCase(step=screen_step)])
    verdict.signals()   # {"rv_coverage", "rv_precision", "rv_fbeta"}; {} when verdict.error
    verdict.to_dict()   # the paging payload's ``rubric`` field

Modules: ``rubrics`` (the YAML rubric set), ``view`` (the prompt), ``engine``
(batched next-token log-probabilities with a shared prefix), ``evidence`` (claims
and their deterministic checks), ``verdict`` (the FORK formulas and the verdict
record), ``base`` (config, budget, timeouts, the review loop), ``local`` and
``endpoint`` (the backends), ``serve`` (an OpenAI-compatible server over a local
model: :func:`serve_openai`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.reviewer.base import (
    BUDGET_EXHAUSTED,
    ReviewCase,
    Reviewer,
    ReviewerConfig,
    ReviewError,
    RubricReviewer,
)
from monitor.reviewer.evidence import CLAIM_AT, check_claim
from monitor.reviewer.rubrics import Evidence, Rubric, RubricError, load_rubrics
from monitor.reviewer.verdict import (
    Claim,
    ReviewVerdict,
    RubricScore,
    coverage,
    f_beta,
    precision,
)

if TYPE_CHECKING:
    from vigil.lm import LanguageModel

__all__ = [
    "BUDGET_EXHAUSTED",
    "CLAIM_AT",
    "Claim",
    "Evidence",
    "ReviewCase",
    "ReviewError",
    "ReviewVerdict",
    "Reviewer",
    "ReviewerConfig",
    "Rubric",
    "RubricError",
    "RubricReviewer",
    "RubricScore",
    "build_reviewer",
    "check_claim",
    "coverage",
    "f_beta",
    "load_rubrics",
    "precision",
    "serve_openai",
]


def build_reviewer(config: ReviewerConfig, *, model: LanguageModel | None = None) -> Reviewer:
    """The reviewer ``config`` names (``model``: an already loaded local model to use)."""
    if config.backend == "local":
        from monitor.reviewer.local import LocalReviewer

        return LocalReviewer(config, model=model)
    from monitor.reviewer.endpoint import OpenAIReviewer

    return OpenAIReviewer(config)


def serve_openai(
    model_path: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    model_name: str | None = None,
    threads: int | None = None,
) -> None:
    """Serve a local HF model as an OpenAI-compatible API (see :mod:`monitor.reviewer.serve`)."""
    from monitor.reviewer.serve import serve_openai as _serve

    _serve(model_path, host, port, model_name=model_name, threads=threads)
