"""The scorers of each tier, and the one list of the signals they produce.

A scorer (:class:`monitor.screening.Scorer`) takes a batch of steps and returns named
signals, each "higher = more harmful", in [0, 1]. Every scorer class declares the names it
can produce in its ``signals`` attribute; this list of classes is the only place that says
which tier runs which scorer, so the default policy's signals (:func:`default_signals`)
and the check of a policy file (:func:`check_tier_signals`) both come from it.

=====  ==========================================  =============================
tier   scorer                                      signals
=====  ==========================================  =============================
L0     :class:`~.worldmodel.WorldModelSignals`     ``wm_*`` (surprise, harm)
L0     :class:`~.rules.RuleSignals`                ``rule_*`` (cheap text rules)
L0     :class:`~.rlhealth.RLHealthSignals`         ``rl_*`` (RL rollout health)
L1     :class:`~.probes.ProbeSignals`              ``probe_harm``
L2     the reviewer (:mod:`monitor.reviewer`)      ``rv_*`` (rubric verdict)
=====  ==========================================  =============================

To add a signal: write a scorer class (``name``, ``signals``, ``score_steps``) in a module
here, add it to :data:`TIER_SCORERS`, and have :func:`monitor.pipeline.build_parts` build
it; a test that scores a few steps with it. Nothing else names signals.
"""

from __future__ import annotations

from collections.abc import Sequence

from monitor.reviewer.verdict import ReviewVerdict
from monitor.scorers.probes import ProbeSignals
from monitor.scorers.rlhealth import RLHealthSignals
from monitor.scorers.rules import RuleSignals
from monitor.scorers.worldmodel import WorldModelSignals

#: the scorer classes of L0 and L1, and the reviewer's verdict at L2, in signal order
TIER_SCORERS: tuple[tuple[type, ...], ...] = (
    (WorldModelSignals, RuleSignals, RLHealthSignals),
    (ProbeSignals,),
    (ReviewVerdict,),
)
TIER_NAMES = ("L0", "L1", "L2")


def _names(cls: type) -> tuple[str, ...]:
    return tuple(getattr(cls, "SIGNALS", None) or cls.signals)  # type: ignore[attr-defined]


def tier_signals(tier: int) -> tuple[str, ...]:
    """Every signal a scorer of tier ``tier`` (0, 1, 2) can produce, in declaration order."""
    out: list[str] = []
    for cls in TIER_SCORERS[tier]:
        out.extend(s for s in _names(cls) if s not in out)
    return tuple(out)


def default_signals() -> tuple[tuple[str, ...], ...]:
    """The signals of L0, L1 and L2 in the default policy: all that the scorers produce."""
    return tuple(tier_signals(k) for k in range(len(TIER_SCORERS)))


class UnknownSignal(ValueError):  # noqa: N818 - reads as what went wrong
    """A policy names a signal that no scorer of its tier produces."""


def check_tier_signals(tier: int, names: Sequence[str]) -> None:
    """Raise :class:`UnknownSignal` (one sentence) for the first of ``names`` that no
    scorer of tier ``tier`` produces: a mistyped name would otherwise be a constant column."""
    known = tier_signals(tier)
    for name in names:
        if name not in known:
            where = [TIER_NAMES[k] for k in range(len(TIER_SCORERS))
                     if k != tier and name in tier_signals(k)]
            hint = f" (it is an {where[0]} signal)" if where else ""
            raise UnknownSignal(
                f"tiers.{TIER_NAMES[tier]}.signals names {name!r}, which no "
                f"{TIER_NAMES[tier]} scorer produces{hint}; {TIER_NAMES[tier]} signals are: "
                + ", ".join(known)
            )
