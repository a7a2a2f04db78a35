"""What the streaming worker did: thread-safe counters (the progress line), and small helpers
every stage shares for the numbers it publishes."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from streams.processor import ProcessorStats

Report = Callable[[str], None]


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def finite(signals: Mapping[str, float]) -> dict[str, float]:
    """The signals that are finite numbers (a record never carries NaN or infinity)."""
    return {k: float(v) for k, v in signals.items() if math.isfinite(float(v))}


def clip01(x: float) -> float:
    return min(1.0, max(0.0, float(x))) if math.isfinite(x) else 0.0


@dataclass
class WorkerStats:
    """What the worker did (thread-safe counters, printed as the progress line)."""

    scored_l0: int = 0  # steps the screen stage scored (L0)
    steps: int = 0  # steps the probe stage decided (their tier, L0 to L3)
    reached: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # steps reaching tier k
    reviewed: int = 0
    pages: int = 0
    verdicts: int = 0
    quarantined: int = 0
    runs_to_review: int = 0  # runs (not rollouts) sent to L2 by their trajectory score
    trees: int = 0
    canaries: int = 0  # canary steps screened
    canaries_to_review: int = 0  # canary steps that reached L2 (the reviewer sees them too)
    dead_letters: dict[str, int] = field(default_factory=dict)  # per stage
    retries: dict[str, int] = field(default_factory=dict)  # per stage: batches consumed again
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_tiers(self, tiers: Iterable[int]) -> None:
        with self._lock:
            for t in tiers:
                self.steps += 1
                for k in range(min(t, 3) + 1):
                    self.reached[k] += 1

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def sync(self, stage: str, proc: ProcessorStats) -> None:
        with self._lock:
            self.dead_letters[stage] = proc.dead_lettered
            self.retries[stage] = proc.retries

    def line(self) -> str:
        with self._lock:
            r = self.reached
            dl = sum(self.dead_letters.values())
            retried = sum(self.retries.values())
            return (
                f"vigil stream: L0 scored {self.scored_l0} steps; "
                f"screened {self.steps} steps (L0 {r[0]}, L1 {r[1]}, L2 {r[2]}, "
                f"L3 {r[3]}), reviewed {self.reviewed}, {self.pages} pages, "
                f"{self.verdicts} rollout verdicts ({self.quarantined} quarantined), "
                f"{dl} dead letters" + (f", {retried} batches retried" if retried else "")
                + (f", {self.canaries} canary steps" if self.canaries else "")
                + (f", {self.runs_to_review} runs to L2 by trajectory score"
                   if self.runs_to_review else "")
            )
