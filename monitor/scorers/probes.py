"""L1: the activation probe's probability of harm (``probe_harm``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep

if TYPE_CHECKING:
    from probes.bundle import ProbeScorer


class ProbeSignals(TierScorer):
    """L1: a linear probe on the language model's activations over the step (batched)."""

    tier = 1
    name = "probes"
    signals = ("probe_harm",)

    def __init__(self, scorer: ProbeScorer) -> None:
        self.scorer = scorer

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> ProbeSignals:
        from probes.bundle import ProbeScorer

        return cls(ProbeScorer.load(models["probes"]))

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        if not steps:
            return []
        p = self.scorer.score([st.to_probe() for st in steps])
        return [{"probe_harm": float(v)} for v in p]
