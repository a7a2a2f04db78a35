"""Budgets that hold under shift: each gate's threshold follows its live score distribution.

A calibrated gate passes ``budget_k`` of the *calibration* benign steps. On traffic the models
were not trained on, the same threshold may pass many times that (the AgentDojo ``slack``
suite sent 71 % of its benign steps into L1 against a 20 % budget). A :class:`LiveGate` keeps
a quantile sketch (Apache DataSketches KLL) of the scores reaching its gate over a sliding
window and moves the threshold so the gate passes its share of them:

* **share**: gate ``k`` sees only what gate ``k - 1`` passed, so it passes
  ``budget_k / budget_{k-1}`` of what reaches it (gate 0: ``budget_0``);
* **floor on recall**: the harmful steps of canaries (known harm injected into the stream,
  :mod:`dashboards.canary`) are sketched apart; the threshold never rises above the score
  that keeps the canaries' recall at what the calibrated threshold gives them, so adapting
  never escalates less harm than calibration promised on canaries;
* **warm-up**: until ``min_count`` scores have been seen, the calibrated threshold holds.

The trajectory threshold (a policy's trajectory section) adapts the same way over the
scores of finished trajectories: it flags the trajectory budget of them, runs a step pages
counted first (they are sketched above every score), never above the score that keeps
harmful canary trajectories' recall (:meth:`LiveGates.observe_trajectories`).

The window is two sketches: the newer one fills, and when it holds ``window / 2`` scores it
becomes the older one (the previous older one is dropped), so the estimate always covers
between ``window / 2`` and ``window`` of the latest scores. A gate's state serialises to a
few kilobytes (:meth:`LiveGates.to_bytes`) so a worker can persist it beside its offsets.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from monitor.tiers import CalibratedPolicy, TierDecision

SKETCH_K = 200  # KLL accuracy parameter: rank error about 1.3 % (the library's default)


class WindowSketch:
    """KLL quantiles over about the last ``window`` values (two sketches, rotated)."""

    def __init__(self, window: int, k: int = SKETCH_K) -> None:
        if window < 2:
            raise ValueError(f"window must be at least 2 values, got {window}")
        self.window = window
        self.k = k
        self._old = self._new()
        self._cur = self._new()

    def _new(self) -> Any:
        from datasketches import kll_doubles_sketch

        return kll_doubles_sketch(self.k)

    @property
    def n(self) -> int:
        return int(self._old.n + self._cur.n)

    def update(self, values: Sequence[float] | np.ndarray) -> None:
        half = self.window // 2
        for v in np.asarray(values, dtype=np.float64).ravel():
            if not math.isfinite(v):
                continue
            self._cur.update(float(v))
            if self._cur.n >= half:
                self._old, self._cur = self._cur, self._new()

    def _parts(self) -> list[Any]:
        return [s for s in (self._old, self._cur) if not s.is_empty()]

    def _rank(self, x: float, *, inclusive: bool) -> float:
        """The window's share below ``x`` (with ``inclusive``: at or below), from the two
        sketches' ranks weighted by their counts. Exact arithmetic on what they retained: no
        merged sketch, whose random compaction would make a restored window answer
        differently from the one saved."""
        parts = self._parts()
        n = sum(s.n for s in parts)
        return sum(s.n * s.get_rank(x, inclusive=inclusive) for s in parts) / n

    def _bisect(self, lo: float, hi: float, keep_low: Any) -> tuple[float, float]:
        """Narrow ``[lo, hi]`` to adjacent floats with ``keep_low(lo)`` true and
        ``keep_low(hi)`` false (the caller checked both ends)."""
        for _ in range(80):
            mid = lo + (hi - lo) / 2
            if mid in (lo, hi):
                break
            if keep_low(mid):
                lo = mid
            else:
                hi = mid
        return lo, hi

    def quantile(self, q: float) -> float:
        """The smallest value with a share of at least ``q`` of the window at or below it (NaN
        when empty)."""
        parts = self._parts()
        if not parts:
            return float("nan")
        q = min(max(q, 0.0), 1.0)
        lo = min(float(s.get_min_value()) for s in parts)
        hi = max(float(s.get_max_value()) for s in parts)
        if self._rank(lo, inclusive=True) >= q:
            return lo
        return self._bisect(lo, hi, lambda x: self._rank(x, inclusive=True) < q)[1]

    def share_at_least(self, x: float) -> float:
        """The share of the window scoring ``>= x`` (NaN when empty)."""
        if not self._parts():
            return float("nan")
        return float(1.0 - self._rank(x, inclusive=False))

    def highest_keeping(self, share: float, low: float) -> float:
        """The highest ``x >= low`` with :meth:`share_at_least` ``(x) >= share`` (``low`` when
        none is): where a threshold can rise to before the share scoring at least it falls
        below ``share``. With the window's values discrete that is one of them (the lowest
        one still kept), which a quantile query can miss by its rank error."""
        parts = self._parts()
        if not parts or self.share_at_least(low) < share:
            return low
        hi = max(float(s.get_max_value()) for s in parts)
        if self.share_at_least(hi) >= share:
            return hi
        return self._bisect(low, hi, lambda x: self.share_at_least(x) >= share)[0]

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "k": self.k,
                "old": base64.b64encode(self._old.serialize()).decode(),
                "cur": base64.b64encode(self._cur.serialize()).decode()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WindowSketch:
        from datasketches import kll_doubles_sketch

        s = cls(int(d["window"]), int(d["k"]))
        s._old = kll_doubles_sketch.deserialize(base64.b64decode(d["old"]))
        s._cur = kll_doubles_sketch.deserialize(base64.b64decode(d["cur"]))
        return s


@dataclass
class LiveGate:
    """One gate's live threshold: ``share`` of the scores reaching it pass, within the floor."""

    calibrated: float  # the policy's threshold (for proposals, its pre-execution one)
    share: float  # of the steps reaching this gate, the share that should pass
    scores: WindowSketch
    canaries: WindowSketch
    min_count: int = 500
    min_canaries: int = 50

    def threshold(self) -> float:
        if self.scores.n < self.min_count:
            return self.calibrated
        t = self.scores.quantile(1.0 - self.share)
        if self.scores.share_at_least(t) > self.share:  # a tie at t: pass at most the share
            t = float(np.nextafter(t, np.inf))
        return min(t, self.ceiling())

    def ceiling(self) -> float:
        """The highest threshold that keeps the canaries' recall at the calibrated one's
        (+inf until enough canaries were seen: nothing is promised yet, so the budget rules;
        the caller decides whether to adapt at all without canaries)."""
        if self.canaries.n < self.min_canaries:
            return math.inf
        promised = self.canaries.share_at_least(self.calibrated)
        if promised <= 0.0:
            return math.inf  # the calibrated threshold catches no canary: nothing to keep
        # the largest t with share(score >= t) >= promised: the lowest canary still caught
        return self.canaries.highest_keeping(promised, self.calibrated)


class LiveGates:
    """The live thresholds of a policy's gates (L0 → L1, L1 → L2, L2 → L3).

    :meth:`thresholds` goes to :meth:`~monitor.tiers.CalibratedPolicy.decide_many`;
    :meth:`observe` feeds the decided steps back (each gate sketches the scores of the steps
    that reached it; canary steps go to the canary sketches).
    """

    def __init__(self, policy: CalibratedPolicy, *, window: int = 20_000,
                 min_count: int | None = None, proposal: bool = False,
                 trajectory_window: int = 2_000) -> None:
        """``min_count``: scores a gate waits for before it moves (default: a quarter of the
        window, at most 500). ``trajectory_window``: the latest trajectory scores the
        trajectory threshold follows (it waits for a quarter of them, at most 200)."""
        if min_count is None:
            min_count = min(500, window // 4)
        agg = policy.trajectory
        # the trajectory threshold flags its budget of the runs scored (the policy's
        # trajectory section; none: the highest step score decides, nothing to adapt)
        self.trajectory: LiveGate | None = None if agg is None or proposal else LiveGate(
            calibrated=agg.threshold, share=agg.budget, scores=WindowSketch(trajectory_window),
            canaries=WindowSketch(trajectory_window),
            min_count=min(200, trajectory_window // 4))
        self.policy = policy
        self.proposal = proposal
        budgets = [g.budget for g in policy.gates]
        self.gates = [
            LiveGate(
                calibrated=g.threshold_for(proposal),
                share=min(1.0, budgets[k] / (budgets[k - 1] if k else 1.0)),
                scores=WindowSketch(window),
                canaries=WindowSketch(window),
                min_count=min_count,
            )
            for k, g in enumerate(policy.gates)
        ]

    def thresholds(self) -> tuple[float, ...]:
        return tuple(g.threshold() for g in self.gates)

    def observe(self, decisions: Sequence[TierDecision], kind: Sequence[str], *,
                first: int = 0) -> None:
        """Sketch each decided step's score at every gate it reached, from gate ``first`` on
        (a stream's L1 stage sees only what L0 escalated: gate 0 is the L0 stage's to
        sketch). ``kind`` per step: ``"real"`` (traffic), ``"canary"`` (a harmful canary
        step: the recall floor) or anything else (not sketched: the benign steps of a canary
        trajectory replay training traffic, not this stream's)."""
        for k, gate in enumerate(self.gates):
            if k < first:
                continue
            real = [d.gate_scores[k] for d, c in zip(decisions, kind, strict=True)
                    if len(d.gate_scores) > k and c == "real"]
            fake = [d.gate_scores[k] for d, c in zip(decisions, kind, strict=True)
                    if len(d.gate_scores) > k and c == "canary"]
            if real:
                gate.scores.update(real)
            if fake:
                gate.canaries.update(fake)

    def trajectory_threshold(self) -> float | None:
        """The live trajectory threshold (None: the policy has no trajectory section)."""
        return None if self.trajectory is None else self.trajectory.threshold()

    def observe_trajectories(self, scores: Sequence[float], kind: Sequence[str]) -> None:
        """Sketch finished trajectories' scores; ``kind`` as in :meth:`observe` (a harmful
        canary trajectory: ``"canary"``, the recall floor)."""
        if self.trajectory is None:
            return
        real = [s for s, c in zip(scores, kind, strict=True) if c == "real"]
        fake = [s for s, c in zip(scores, kind, strict=True) if c == "canary"]
        if real:
            self.trajectory.scores.update(real)
        if fake:
            self.trajectory.canaries.update(fake)

    def _live(self) -> list[LiveGate]:
        return self.gates + ([self.trajectory] if self.trajectory is not None else [])

    def to_bytes(self) -> bytes:
        return json.dumps([{"scores": g.scores.to_dict(), "canaries": g.canaries.to_dict()}
                           for g in self._live()]).encode()

    def restore(self, blob: bytes) -> None:
        """Resume the sketches a :meth:`to_bytes` saved (the window sizes come with them); a
        save from before trajectory thresholds adapted (the gates only) resumes the gates."""
        saved = json.loads(blob)
        live = self._live()
        if len(saved) not in (len(self.gates), len(live)):
            raise ValueError(f"saved state has {len(saved)} gates, the policy {len(live)}")
        for g, s in zip(live, saved, strict=False):
            g.scores = WindowSketch.from_dict(s["scores"])
            g.canaries = WindowSketch.from_dict(s["canaries"])

    def status(self) -> list[dict[str, float]]:
        """Per gate: the calibrated and the live threshold, the share passing in the window."""
        return [_status(g) for g in self.gates]

    def trajectory_status(self) -> dict[str, float] | None:
        """:meth:`status` of the trajectory threshold (None: the policy has none)."""
        return None if self.trajectory is None else _status(self.trajectory)


def _status(g: LiveGate) -> dict[str, float]:
    t = g.threshold()
    return {"calibrated": g.calibrated, "threshold": t, "ceiling": g.ceiling(),
            "target_share": g.share, "window_share": g.scores.share_at_least(t),
            "seen": g.scores.n, "canaries_seen": g.canaries.n}
