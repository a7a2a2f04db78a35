"""Domains, and leave-one-domain-out (LODO): the only way vigil chooses anything.

A monitor meets tools it has never seen, so every choice (features, layers, stacking
weights, thresholds) is scored on a *domain* the fit never saw. A domain is a family of
tools and tasks:

* ``agentdojo/<suite>``: one AgentDojo suite (``workspace``, ``travel``, ``banking``;
  ``slack`` is held out whole, and so is every attack template but the training one);
* ``toolemu/<group>``: one group of ToolEmu toolkits (the builder groups cases by toolkit,
  never splitting a case; the group rides in ``meta["domain"]``);
* ``miniwob``: the MiniWoB++ GUI tasks;
* ``openagentsafety``: OpenHands agents on OpenAgentSafety's simulated-company tasks
  (shell, browser, files, chat with colleagues), one domain;
* ``stepshield``: StepShield's synthetic code-agent trajectories, one domain.

:func:`domain_of` reads a transition's domain; :func:`lodo_folds` yields, for each training
domain, the indices of every *other* training domain (fit) and of that domain (score).
Held-out splits (``test*``) never enter a fold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TRAIN_SPLITS = ("train", "val")


def domain_of_id(trajectory_id: str, meta: dict[str, Any] | None = None) -> str:
    """The domain of a trajectory, from its id (and ``meta["domain"]`` where it names one)."""
    if meta and isinstance(meta.get("domain"), str) and meta["domain"]:
        return str(meta["domain"])
    parts = trajectory_id.split("/")
    if parts[0] == "agentdojo" and len(parts) > 1:
        return f"agentdojo/{parts[1]}"
    if parts[0] in ("miniwob", "toolemu", "openagentsafety", "stepshield"):
        return parts[0]
    return parts[0] or "unknown"


def domain_of(t: Any) -> str:
    """The domain of a transition (anything with ``trajectory_id`` and ``meta``)."""
    return domain_of_id(t.trajectory_id, getattr(t, "meta", None))


def is_training(split: str) -> bool:
    """Whether a split may be fitted or tuned on (never a ``test*`` split)."""
    return split in TRAIN_SPLITS


@dataclass(frozen=True)
class Fold:
    """One LODO fold: fit on ``fit`` (every other training domain), score on ``held_out``."""

    domain: str
    fit: np.ndarray  # indices into the full list
    held_out: np.ndarray


def lodo_folds(
    domains: Sequence[str], splits: Sequence[str] | None = None, *, min_domains: int = 2
) -> Iterator[Fold]:
    """One fold per training domain, in sorted order.

    ``domains[i]`` / ``splits[i]`` describe item ``i``; items of a held-out split are in
    no fold. A fold's ``fit`` and ``held_out`` never share a domain. Fewer than
    ``min_domains`` training domains is an error (there is nothing to leave out).
    """
    dom = np.asarray(domains, dtype=object)
    train = (
        np.ones(len(dom), dtype=bool)
        if splits is None
        else np.array([is_training(s) for s in splits], dtype=bool)
    )
    if splits is not None and len(splits) != len(dom):
        raise ValueError(f"{len(dom)} domains but {len(splits)} splits")
    names = sorted({str(d) for d in dom[train]})
    if len(names) < min_domains:
        raise ValueError(
            f"leave-one-domain-out needs at least {min_domains} training domains; "
            f"found {names or 'none'}"
        )
    for name in names:
        inside = train & (dom == name)
        yield Fold(name, np.flatnonzero(train & ~inside), np.flatnonzero(inside))
