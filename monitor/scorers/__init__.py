"""The scorers of each tier, and the one list of the signals they produce.

A scorer takes a batch of steps and returns named signals, each "higher = more harmful", in
[0, 1]. Every scorer class derives from :class:`~monitor.scorers.base.TierScorer` and
declares its tier and the names it can produce; the scorer classes of every module in this
package are collected here, so the default policy's signals (:func:`default_signals`), the
check of a policy file (:func:`check_tier_signals`) and the scorers a screener runs
(:func:`scorers_of`, used by :func:`monitor.pipeline.build_parts`) all come from them.

=====  ==========================================  =============================
tier   scorer                                      signals
=====  ==========================================  =============================
L0     :class:`~.worldmodel.WorldModelSignals`     ``wm_*`` (surprise, harm)
L0     :class:`~.rules.RuleSignals`                ``rule_*`` (cheap text rules)
L0     :class:`~.rlhealth.RLHealthSignals`         ``rl_*`` (RL rollout health)
L0     :class:`~.provenance.ProvenanceSignals`     ``prov_*`` (argument provenance)
L0     :class:`~.alignment.AlignmentSignals`       ``goal_lean`` (goal alignment; opt-in)
L1     :class:`~.probes.ProbeSignals`              ``probe_harm``
L1     :class:`~.drift.DriftSignals`               ``drift_task`` (opt-in)
L1     :class:`~.likelihood.LikelihoodSignals`     ``lm_task_gain`` (opt-in)
L2     the reviewer (:mod:`monitor.reviewer`)      ``rv_*``; ``judge_unsafe`` (a judge)
=====  ==========================================  =============================

To add a signal, write a :class:`~monitor.scorers.base.TierScorer` subclass in a new module
here (``tier``, ``name``, ``signals``, ``score_steps``; ``load`` if it needs a model bundle),
and a test that scores a few steps with it. Nothing else names signals.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

from monitor.reviewer.verdict import ReviewVerdict
from monitor.scorers.base import TierScorer
from monitor.scorers.probes import ProbeSignals
from monitor.scorers.rlhealth import RLHealthSignals
from monitor.scorers.rules import RuleSignals
from monitor.scorers.worldmodel import WorldModelSignals

__all__ = [
    "ProbeSignals", "RLHealthSignals", "RuleSignals", "TierScorer", "UnknownSignal",
    "WorldModelSignals", "check_tier_signals", "default_signals", "scorers_of", "tier_signals",
]

for _module in pkgutil.iter_modules(__path__):  # every scorer module registers its classes
    importlib.import_module(f"{__name__}.{_module.name}")

TIER_NAMES = ("L0", "L1", "L2")


def scorers_of(tier: int) -> list[type[TierScorer]]:
    """The scorer classes of tier ``tier`` (0 or 1), in their declared order."""
    return sorted((c for c in TierScorer.registry if c.tier == tier),
                  key=lambda c: (c.order, c.name))


def tier_signals(tier: int) -> tuple[str, ...]:
    """Every signal tier ``tier`` (0, 1, 2) can produce, in declaration order."""
    if tier == 2:
        return (*ReviewVerdict.SIGNALS, ReviewVerdict.JUDGE_SIGNAL)
    out: list[str] = []
    for cls in scorers_of(tier):
        out.extend(s for s in cls.signals if s not in out)
    return tuple(out)


def default_signals() -> tuple[tuple[str, ...], ...]:
    """The signals of L0, L1 and L2 in the default policy: all that the scorers marked
    ``in_default`` produce."""
    out: list[tuple[str, ...]] = []
    for k in range(len(TIER_NAMES)):
        if k == 2:
            out.append(ReviewVerdict.SIGNALS)
            continue
        names: list[str] = []
        for cls in scorers_of(k):
            if cls.in_default:
                names.extend(s for s in cls.signals if s not in names)
        out.append(tuple(names))
    return tuple(out)


class UnknownSignal(ValueError):  # noqa: N818 - reads as what went wrong
    """A policy names a signal that no scorer of its tier produces."""


def check_tier_signals(tier: int, names: Sequence[str]) -> None:
    """Raise :class:`UnknownSignal` (one sentence) for the first of ``names`` that no
    scorer of tier ``tier`` produces: a mistyped name would otherwise be a constant column."""
    known = tier_signals(tier)
    for name in names:
        if name not in known:
            where = [TIER_NAMES[k] for k in range(len(TIER_NAMES))
                     if k != tier and name in tier_signals(k)]
            hint = f" (it is an {where[0]} signal)" if where else ""
            raise UnknownSignal(
                f"tiers.{TIER_NAMES[tier]}.signals names {name!r}, which no "
                f"{TIER_NAMES[tier]} scorer produces{hint}; {TIER_NAMES[tier]} signals are: "
                + ", ".join(known)
            )
