"""L0: the world model's surprise and harm (``wm_*``), batched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep

if TYPE_CHECKING:
    from worldmodel.score import WorldModelScorer


class WorldModelSignals(TierScorer):
    """L0: the world model's surprise and harm, before the action runs and after.

    * ``wm_harm_pre``: harm read from the *predicted* next latent (before the action runs);
    * ``wm_harm_post``: harm read from the observed result (once it is known);
    * ``wm_surprise``: the prediction error of the next observation, calibrated;
    * ``wm_relational_harm``, ``wm_injection``: the relational harm head and the
      injection head over the step's text.
    """

    tier = 0
    order = 0
    name = "worldmodel"
    signals = ("wm_harm_pre", "wm_harm_post", "wm_surprise", "wm_relational_harm", "wm_injection")
    post_signals = ("wm_harm_post", "wm_surprise", "wm_injection")  # read the observed result

    def __init__(self, scorer: WorldModelScorer) -> None:
        self.scorer = scorer

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> WorldModelSignals:
        from worldmodel.score import WorldModelScorer

        return cls(WorldModelScorer.load(models["worldmodel"]))

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        return [s.signals() for s in self.scorer.score([st.to_worldmodel() for st in steps])]
