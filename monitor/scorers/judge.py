"""L1: a truncated judge's verdict (``judge_fast``): the L2 judge's question, asked cheaply.

A judge bundle trained with ``monitor reviewer train --layers N`` keeps the first N of
Gemma-3-270M's 18 decoder blocks (its final norm and frozen LM head read block N), so a
verdict costs about N/18 of the full judge's. It reads the step as the full judge does
(:func:`~monitor.reviewer.judge.judge_prompts`, the same evidence and view) and answers the
step question; its P(unsafe) is the signal. The full defaults (``monitor calibrate
--defaults``) train one (:data:`monitor.judge_recipe.FAST_JUDGE`, or ``monitor reviewer train
--fast``), cross-fit it like the other models and add it to L1
(:func:`monitor.defaults.with_fast_judge`), where the calibrated gate weighs it on
out-of-domain scores. Not in :func:`~monitor.tiers.default_policy_config` (``in_default =
False``): a policy names it together with its bundle, as ``tiers.L1.models.judge_fast``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep

if TYPE_CHECKING:
    from monitor.reviewer.judge import Judge


class FastJudgeSignals(TierScorer):
    """L1: P(unsafe) of a truncated judge on each step, batched."""

    tier = 1
    order = 105  # after the probe, before the (opt-in) likelihood
    name = "judge_fast"
    signals = ("judge_fast",)
    in_default = False  # named with its bundle (monitor.defaults.with_fast_judge)

    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> FastJudgeSignals:
        from monitor.reviewer.judge import Judge

        if "judge_fast" not in models:
            raise ValueError("the signal judge_fast needs a truncated judge bundle: name it as "
                             "data.models.judge_fast (monitor reviewer train --layers N)")
        return cls(Judge(models["judge_fast"], batch_size=16))

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        if not steps:
            return []
        return [{"judge_fast": float(p)} for p in self.judge.score_steps(steps, mode="step")]
