"""L1: task drift (``drift_task``): did the newest observation change what the agent will do?

The TaskTracker signal (Abdelnabi et al. 2024) of :mod:`probes.drift`: the probe model
reads the task and earlier context with and without the step's newest observation, and a
linear probe on the difference of its last-token states gives the probability that the
observation carries injected instructions. Not in the default policy (``in_default``); a
policy that names ``drift_task`` loads the bundle ``models.drift`` (default
``$VIGIL_HOME/models/drift``, built by ``monitor probes train-drift``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep

if TYPE_CHECKING:
    from probes.drift import DriftFeatures, DriftScorer, DriftTemplate
    from vigil.lm import LanguageModel


class DriftSignals(TierScorer):
    """L1: the task-drift probe on the probe model's states with and without the observation."""

    tier = 1
    name = "drift"
    signals = ("drift_task",)
    in_default = False

    def __init__(self, scorer: DriftScorer) -> None:
        self.scorer = scorer

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> DriftSignals:
        import vigil.paths
        from probes.drift import DriftScorer

        return cls(DriftScorer.load(Path(models.get("drift") or vigil.paths.bundle("drift"))))

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        p = self.scorer.score([st.to_probe() for st in steps])
        return [{"drift_task": float(v)} for v in p]


def drift_features(
    steps: Sequence[ScreenStep],
    lm: LanguageModel,
    *,
    layers: Sequence[int] | None = None,
    template: DriftTemplate | None = None,
    cache_dir: str | Path | None = None,
) -> DriftFeatures:
    """The raw per-layer deltas (with − without the newest observation) of ``steps``.

    For refitting the drift probe per fold (the transfer bench) without running the
    probe model again: ``.columns(layers)`` is the matrix a probe reads.
    """
    from probes.drift import DriftEncoder

    enc = DriftEncoder(lm, template, cache_dir=cache_dir)
    return enc.features([st.to_probe() for st in steps], layers)
