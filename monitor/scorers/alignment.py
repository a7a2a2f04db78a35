"""L0: goal alignment (``goal_lean``): does the action serve the task or an instruction read?

:mod:`worldmodel.alignment`: the most instruction-like passage the agent has read (the user's
task excluded) and the sentence encoder's cosine of the action to it and to the task. An
injected instruction sets the agent a goal; the steps that pursue it (reading every channel
before posting them to the attacker's site) read more like the passage than like the task,
whatever values they use. Tool-agnostic, nothing fitted: the calibrated stack weighs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep


class AlignmentSignals(TierScorer):
    """L0: ``goal_lean`` = (1 + cos(action, passage) − cos(action, task)) / 2, clipped to
    [0, 1]; 0 when nothing the agent read has an instruction cue. The encoder is
    all-MiniLM-L6-v2 (what the world model reads text with), cached by content under
    ``$VIGIL_HOME/cache``: a trajectory's task and its passages are encoded once."""

    tier = 0
    order = 35
    name = "alignment"
    signals = ("goal_lean",)
    in_default = False  # until the shipped policy is rebuilt with it

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> AlignmentSignals:
        import vigil.paths
        from worldmodel.encoders import text_encoder

        return cls(text_encoder("minilm", cache_dir=vigil.paths.text_cache()))

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        from worldmodel.alignment import goal_alignment

        out = []
        for a in goal_alignment(steps, self.encoder):
            lean = (1.0 + a.lean) / 2 if a.instruction.text else 0.0
            out.append({"goal_lean": min(1.0, max(0.0, lean))})
        return out
