"""L1: the task-masked action likelihood (``lm_task_gain``).

How much more likely the local language model finds the step's action with the user's task
in the prompt than with the task masked (:mod:`probes.likelihood`), calibrated into the
probability that the step is harmful: higher = the task explains the action less. Out of the
default policy (``in_default = False``); a policy that names ``lm_task_gain`` loads the
bundle ``models["likelihood"]``, else :func:`vigil.paths.bundle` ``("likelihood")``.

:func:`screen_step_features` gives the raw features (``probes.likelihood.FEATURES``) of
screen steps, so a benchmark can refit the calibration per fold without rerunning the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import vigil.paths
from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep
from probes.likelihood import (
    GainCalibration,
    LikelihoodStats,
    LikelihoodStep,
    LikelihoodTemplate,
    likelihood_features,
    load_bundle,
    render_action,
)

if TYPE_CHECKING:
    from vigil.lm import LanguageModel

BUILD_COMMAND = "monitor probes train-likelihood"


def likelihood_step_of(
    st: ScreenStep, template: LikelihoodTemplate | None = None
) -> LikelihoodStep:
    """What the likelihood signal reads of a screen step (an earlier action as its text, as in
    training; its call rendered compactly where it has no text)."""
    template = template or LikelihoodTemplate()

    def call(a: Any) -> dict[str, Any] | None:
        return {"name": a.tool.name, "arguments": dict(a.tool.arguments)} if a.tool else None

    hist = tuple(
        (s.observation.text, s.action.text
         or render_action("", call(s.action), value_chars=template.value_chars).text)
        for s in st.history
    )
    return LikelihoodStep(
        task=st.task,
        observation=st.step.observation.text,
        action=st.step.action.text,
        tool=call(st.step.action),
        history=hist[-template.history :] if template.history else (),
    )


def screen_step_features(
    steps: Sequence[ScreenStep],
    lm: LanguageModel | None = None,
    *,
    template: LikelihoodTemplate | None = None,
    batch_size: int = 16,
    stats: LikelihoodStats | None = None,
) -> np.ndarray:
    """``(len(steps), len(FEATURES))`` raw features (gain mean, sum, ...); a NaN row for a
    step with no action. ``lm`` defaults to the local Gemma-3-270M."""
    from vigil.lm import load_language_model

    template = template or LikelihoodTemplate()
    lm = lm or load_language_model()
    return likelihood_features(lm, [likelihood_step_of(s, template) for s in steps],
                               template=template, batch_size=batch_size, stats=stats)


class LikelihoodSignals(TierScorer):
    """L1: ``lm_task_gain``, the calibrated task-masked likelihood gain of the action."""

    tier = 1
    name = "likelihood"
    signals = ("lm_task_gain",)
    order = 110
    in_default = False

    def __init__(
        self,
        bundle: Mapping[str, Any],
        template: LikelihoodTemplate,
        calibration: GainCalibration,
        *,
        lm: LanguageModel | None = None,
        model_path: str | Path | None = None,
        batch_size: int = 16,
    ) -> None:
        self.bundle = bundle
        self.template = template
        self.calibration = calibration
        self.lm = lm
        self.model_path = model_path
        self.batch_size = batch_size
        self.stats = LikelihoodStats()

    @classmethod
    def load(cls, models: Mapping[str, Path], **kwargs: Any) -> LikelihoodSignals:
        path = Path(models.get("likelihood") or vigil.paths.bundle("likelihood"))
        if not (path / "bundle.json").exists():
            raise FileNotFoundError(
                f"no likelihood bundle at {path} (no bundle.json); build it with "
                f"`{BUILD_COMMAND} --out {path}`"
            )
        bundle, template, calibration = load_bundle(path)
        return cls(bundle, template, calibration, **kwargs)

    def language_model(self) -> LanguageModel:
        """The bundle's language model, loaded on first need; a different one is an error."""
        if self.lm is None:
            from vigil.lm import load_language_model

            self.lm = load_language_model(self.model_path)
        if self.lm.model_hash != self.bundle["model_hash"]:
            raise ValueError(
                f"the likelihood bundle was built on {self.bundle['model_id']} "
                f"({self.bundle['model_hash']}), not {self.lm.model_id} ({self.lm.model_hash}); "
                f"rebuild it with `{BUILD_COMMAND}`"
            )
        return self.lm

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        if not steps:
            return []
        X = screen_step_features(steps, self.language_model(), template=self.template,
                                 batch_size=self.batch_size, stats=self.stats)
        p = self.calibration.predict_proba(X)
        return [{} if np.isnan(v) else {"lm_task_gain": float(v)} for v in p]
