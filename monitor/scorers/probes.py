"""L1: the activation probe's probability of harm (``probe_harm``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from monitor.screening import ScreenStep

if TYPE_CHECKING:
    from probes.bundle import ProbeScorer


class ProbeSignals:
    """L1: a linear probe on the language model's activations over the step (batched)."""

    name = "probes"
    signals = ("probe_harm",)

    def __init__(self, scorer: ProbeScorer) -> None:
        self.scorer = scorer

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        if not steps:
            return []
        p = self.scorer.score([st.to_probe() for st in steps])
        return [{"probe_harm": float(v)} for v in p]
