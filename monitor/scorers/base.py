"""The base of every scorer class: what it declares, and the registry that collects it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from monitor.screening import ScreenStep


class TierScorer:
    """A tier's model or rule set: a batch of steps in, named signals out.

    A subclass declares its ``tier`` (0: every step; 1: what L0 escalates), a ``name``, the
    ``signals`` it can produce (each in [0, 1], higher = more harmful; one it cannot compute
    for a step is left out of that step's dict) and its place among its tier's scorers
    (``order``: the order of the signals in the default policy; ``in_default``: whether the
    default policy uses them at all). Defining the class registers it; :meth:`load` builds it
    from the model bundles a policy names; a screener loads only the scorers whose signals its
    policy uses.
    """

    tier: ClassVar[int]
    name: ClassVar[str]
    signals: ClassVar[tuple[str, ...]]
    order: ClassVar[int] = 100
    in_default: ClassVar[bool] = True  # whether the default policy uses its signals
    # signals known only once the action has run (absent for a proposed action)
    post_signals: ClassVar[tuple[str, ...]] = ()
    registry: ClassVar[list[type[TierScorer]]] = []

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        missing = [a for a in ("tier", "name", "signals") if not hasattr(cls, a)]
        if missing:
            raise TypeError(f"scorer {cls.__name__} does not declare {', '.join(missing)}")
        TierScorer.registry.append(cls)

    @classmethod
    def load(cls, models: Mapping[str, Path]) -> TierScorer:
        """The scorer, given the bundle folder of each model (``worldmodel``, ``probes``)."""
        return cls()

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        raise NotImplementedError


def post_execution_signals() -> frozenset[str]:
    """Every registered scorer's signals that exist only once an action has run."""
    return frozenset(s for cls in TierScorer.registry for s in cls.post_signals)
