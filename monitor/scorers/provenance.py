"""L0: argument provenance (``prov_*``): where the values an action uses came from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import vigil.paths
from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep

if TYPE_CHECKING:
    from worldmodel.provenance import ProvenanceHarm


class ProvenanceSignals(TierScorer):
    """L0: each value in the action's arguments traced to the task, to what the agent read
    (and how instruction-like that passage is), or to nowhere; tool-agnostic, no model.

    * ``prov_untraced``: the share of the action's values found neither in the task nor in
      anything the agent read (0 when it uses none);
    * ``prov_instructed``: the most instruction-like passage (addressed to the agent:
      imperatives, "you", "please", "before you", "do not tell" ...) that supplied a value
      the task does not have;
    * ``prov_harm``: the provenance bundle's logistic regression over the features of
      ``worldmodel.provenance`` (fitted on AgentDojo by leave-one-suite-out). Without a
      bundle (``monitor worldmodel train-provenance`` writes one) it is left out and the
      other two are still produced.

    In the default policy: the defaults fit its bundle (``monitor.defaults``).
    """

    tier = 0
    order = 30
    name = "provenance"
    signals = ("prov_harm", "prov_untraced", "prov_instructed")

    def __init__(self, model: ProvenanceHarm | None = None) -> None:
        self.model = model

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> ProvenanceSignals:
        """The bundle named ``provenance`` (default ``vigil.paths.bundle("provenance")``);
        with none there, the scorer runs without ``prov_harm``."""
        from worldmodel.provenance import BUNDLE_FILE, load_bundle

        path = Path(models.get("provenance") or vigil.paths.bundle("provenance"))
        present = (path / BUNDLE_FILE).exists() if path.is_dir() else path.is_file()
        return cls(load_bundle(path) if present else None)

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        from worldmodel.provenance import score_provenance

        return score_provenance(steps, self.model)
