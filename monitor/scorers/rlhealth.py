"""L0: RL-health flags of a rollout step (``rl_*``), from what the reassembled step carries.

A rollout step rebuilt from TITO records (``streams.tito``) keeps its call's exact tokens:
``output_logprobs`` (the rollout engine's), ``trainer_logprobs`` when the producer sends the
trainer's recomputation, and its execution's end in ``meta`` (``timed_out``). From them:

* ``rl_timed_out``: 1 when the harness timed the execution out (DESIGN §5, execution shape);
* ``rl_out_of_trust_share``: the share of the step's tokens whose importance ratio leaves the
  trust region, ``|ρ − 1| > δ`` with δ = 0.8 (BRAT's off-policy drift, DESIGN §5).

A deployment step, or a rollout step without these fields, gets no ``rl_*`` signal (unknown to
the policy, which fills in the benign median). Run-level RL health (staleness bands, drift
growth, reward hacking) is ``monitor rlhealth``, which publishes per-execution records and
alerts; these per-step flags are what the L0 gate sees of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from monitor.rlhealth.formulas import out_of_trust_share
from monitor.scorers.base import TierScorer
from monitor.screening import ScreenStep

TRUST_DELTA = 0.8  # δ of the trust region |ρ − 1| ≤ δ (BRAT)


def _logprobs(extra: Mapping[str, Any], key: str) -> list[float] | None:
    v = extra.get(key)
    if isinstance(v, list) and v and all(isinstance(x, int | float) for x in v):
        return [float(x) for x in v]
    return None


class RLHealthSignals(TierScorer):
    """L0: per-step RL-health flags of rollout steps, in [0, 1]."""

    tier = 0
    order = 20
    name = "rlhealth"
    signals = ("rl_timed_out", "rl_out_of_trust_share")

    def __init__(self, delta: float = TRUST_DELTA) -> None:
        self.delta = delta

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        return [self.score_step(st) for st in steps]

    def score_step(self, st: ScreenStep) -> dict[str, float]:
        if st.source != "rollout":
            return {}
        row: dict[str, float] = {}
        timed_out = st.meta.get("timed_out") if isinstance(st.meta, Mapping) else None
        if isinstance(timed_out, bool):
            row["rl_timed_out"] = float(timed_out)
        extra = st.step.model_extra or {}
        new, old = _logprobs(extra, "trainer_logprobs"), _logprobs(extra, "output_logprobs")
        if new is not None and old is not None and len(new) == len(old):
            row["rl_out_of_trust_share"] = out_of_trust_share(new, old, self.delta)
        return row
