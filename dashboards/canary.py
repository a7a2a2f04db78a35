"""Canaries: known-harmful steps injected into live streams, so recall is measured all the time.

A **canary set** is built from the *training* split of a transition dataset
(never a held-out one): each harmful trajectory, cut after its first harmful
step, becomes one canary, so one canary carries exactly one known-harmful step
(the benign steps before it give that step its history, as in real traffic).

The screen stage injects canaries at ``rate`` per real step: for each batch of
real steps it draws, deterministically from the batch's first input position,
how many canary trajectories to publish onto the same steps topic. They come
back through the broker and pass every tier exactly like real steps. Each
canary step carries ``meta.vigil_canary`` (the canary id and this instance);
the worker uses it to keep canaries out of a trainer's admission (no rollout
verdict) and out of the human queue (no page), and publishes their labels to
the labels topic with ``origin="canary"``, from which recall is computed.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.records import Source, StepEvent, Trajectory, read_jsonl, write_jsonl

CANARY_KEY = "vigil_canary"
TRAIN_SPLITS = ("train",)


class CanaryError(ValueError):
    """A canary set that cannot be built or read (one sentence)."""


def canary_of(meta: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The canary tag in a step event's or a trajectory's ``meta`` (None: not a canary)."""
    got = meta.get(CANARY_KEY) if meta else None
    return got if isinstance(got, Mapping) else None


def is_canary(meta: Mapping[str, Any] | None) -> bool:
    return canary_of(meta) is not None


def canary_from(trajectory: Trajectory) -> Trajectory | None:
    """``trajectory`` cut after its first harmful step (None when it has none)."""
    for i, step in enumerate(trajectory.steps):
        if step.label == 1:
            steps = [s.model_copy(update={"label": s.label if s.label is not None else 0})
                     for s in trajectory.steps[: i + 1]]
            category = step.category or "unknown"
            cid = f"{trajectory.trajectory_id}#{step.step_id}"
            return Trajectory(
                trajectory_id=cid, source=trajectory.source, task=trajectory.task,
                steps=steps, label=1,
                meta={"canary_id": cid, "category": category,
                      "from": trajectory.trajectory_id,
                      "split": trajectory.meta.get("split")},
            )
    return None


def build_canary_set(datasets: Sequence[str | Path], out: str | Path,
                     *, splits: Sequence[str] = TRAIN_SPLITS) -> int:
    """Write the canaries of ``datasets``' training trajectories to ``out`` (JSON Lines).

    Only ``splits`` (default: train) are read; a held-out split (``test*``) is refused.
    Returns the number of canaries.
    """
    held_out = [s for s in splits if s.startswith("test")]
    if held_out:
        raise CanaryError(f"canaries come from training data only; {held_out[0]!r} is held out")
    canaries: list[Trajectory] = []
    for d in datasets:
        path = Path(d) / "trajectories.jsonl"
        if not path.exists():
            raise CanaryError(f"{path}: no trajectories file (build the dataset first: "
                              "`monitor worldmodel build-data agentdojo`)")
        for t in read_jsonl(path, Trajectory):
            if t.meta.get("split") in splits:
                c = canary_from(t)
                if c is not None:
                    canaries.append(c)
    if not canaries:
        raise CanaryError(f"no harmful trajectory in the {'/'.join(splits)} split of "
                          f"{', '.join(map(str, datasets))}: no canary to build")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return write_jsonl(out, canaries)


def load_canary_set(path: str | Path) -> list[Trajectory]:
    p = Path(path)
    if not p.exists():
        raise CanaryError(f"{p}: no canary set (build one with `monitor canaries build`)")
    got = list(read_jsonl(p, Trajectory))
    if not got:
        raise CanaryError(f"{p}: the canary set is empty")
    for t in got:
        if t.meta.get("split") not in (None, *TRAIN_SPLITS):
            raise CanaryError(f"{p}: canary {t.trajectory_id!r} comes from the held-out split "
                              f"{t.meta.get('split')!r}")
    return got


@dataclass(frozen=True)
class CanaryInjector:
    """Draws the canaries to inject next to a batch of real steps (deterministically)."""

    canaries: Sequence[Trajectory]
    rate: float  # canary trajectories (each with one harmful step) per real step

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise CanaryError(f"the canary rate must be in [0, 1], got {self.rate}")
        if self.rate > 0 and not self.canaries:
            raise CanaryError("a canary rate > 0 needs a non-empty canary set")

    def draw(self, n_real: int, key: str) -> list[tuple[Trajectory, str]]:
        """The (canary, instance id) pairs to inject for ``n_real`` real steps at input
        position ``key`` (``topic/partition/offset``): the same key always draws the same,
        so a redelivered batch re-injects the same canary instances (same ids)."""
        if self.rate <= 0 or n_real <= 0:
            return []
        seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
        rng = random.Random(seed)
        out = []
        for i in range(n_real):
            if rng.random() < self.rate:
                c = self.canaries[rng.randrange(len(self.canaries))]
                out.append((c, f"{seed:016x}-{i}"))
        return out


def canary_events(canary: Trajectory, instance: str, stream: Source) -> list[StepEvent]:
    """One injected instance of ``canary`` as the step events of a live ``stream``."""
    tid = f"canary/{instance}"
    tag = {"canary_id": canary.meta.get("canary_id", canary.trajectory_id),
           "instance": instance, "category": canary.meta.get("category")}
    last = len(canary.steps) - 1
    return [
        StepEvent(trajectory_id=tid, source=stream, task=canary.task, step=step,
                  final=i == last, trajectory_label=1 if i == last else None,
                  meta={CANARY_KEY: tag})
        for i, step in enumerate(canary.steps)
    ]


def canary_trajectory(events: Iterable[StepEvent]) -> Trajectory:
    """The injected trajectory back from its events (offline recall of the same steps)."""
    evs = list(events)
    return Trajectory(trajectory_id=evs[0].trajectory_id, source=evs[0].source,
                      task=evs[0].task, steps=[e.step for e in evs], meta=dict(evs[0].meta))
