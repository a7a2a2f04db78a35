"""Recall from every source of ground truth: the join of labels with the tiers steps reached.

Ground truth reaches the labels topic from three places, told apart by
``LabelRecord.origin``: ``dataset`` (labels carried by replayed benchmark
data), ``canary`` (injected known-harmful steps) and ``human`` (verdicts on
pages). The scores topic says how far each step went: a ``Score`` of tier t
means the step reached tier t, and ``flagged`` that it went on to t + 1.

:class:`LabelJoin` joins the two in either order (a label may arrive before
or after a step's scores, and a step climbs tiers over time as L2 reviews
finish) and counts ``vigil_labelled_steps_total{origin, stream, category,
label, tier}``: once per labelled step for every tier it reached. Recall at
tier k over any window is then a ratio of two increases (``dashboards.promql``).

A step is counted once per origin: a redelivered score or label changes
nothing, and a later label of the same origin (a corrected verdict) is not
counted again. State is an LRU of the last ``max_steps`` steps; a label whose
step fell out of it (or was never screened here) is not counted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from dashboards.metrics import WorkerMetrics
from streams.records import LabelRecord, Score


@dataclass
class _StepState:
    reached: int = -1  # highest tier reached so far (-1: no score seen yet)
    stream: str = "deployment"
    labels: dict[str, tuple[int, str]] = field(default_factory=dict)  # origin -> label, category


@dataclass
class JoinStats:
    scores: int = 0
    labels: int = 0
    counted: int = 0  # (step, origin) pairs counted
    unmatched: int = 0  # labels without a step id
    evicted: int = 0


class LabelJoin:
    """Joins labels with reached tiers and counts them into ``metrics.labelled``."""

    def __init__(self, metrics: WorkerMetrics, max_steps: int = 200_000) -> None:
        self.metrics = metrics
        self.max_steps = max_steps
        self.stats = JoinStats()
        self._steps: OrderedDict[str, _StepState] = OrderedDict()

    def _state(self, key: str) -> _StepState:
        st = self._steps.pop(key, None) or _StepState()
        self._steps[key] = st
        while len(self._steps) > self.max_steps:
            self._steps.popitem(last=False)
            self.stats.evicted += 1
        return st

    def _count(self, st: _StepState, origin: str, label: int, category: str,
               tiers: range) -> None:
        for t in tiers:
            self.metrics.labelled.labels(origin=origin, stream=st.stream, category=category,
                                         label=str(label), tier=str(t)).inc()

    def on_score(self, score: Score) -> None:
        self.stats.scores += 1
        st = self._state(f"{score.trajectory_id}/{score.step_id}")
        reached = score.tier + 1 if score.flagged else score.tier
        if st.reached < 0:
            st.stream = score.source
        if reached <= st.reached:
            return
        before, st.reached = st.reached, reached
        for origin, (label, category) in st.labels.items():
            self._count(st, origin, label, category, range(before + 1, reached + 1))

    def on_label(self, label: LabelRecord) -> None:
        self.stats.labels += 1
        if label.step_id is None:
            self.stats.unmatched += 1
            return
        st = self._state(f"{label.trajectory_id}/{label.step_id}")
        if label.origin in st.labels:
            return
        category = label.category or "none"
        st.labels[label.origin] = (int(label.label), category)
        self.stats.counted += 1
        self._count(st, label.origin, int(label.label), category, range(0, st.reached + 1))


def reached_counts(metrics: WorkerMetrics, label: int = 1) -> dict[str, list[int]]:
    """Per origin, how many steps labelled ``label`` reached tiers 0..3 (this process's
    counts since it started: ``[screened, reached L1, reached L2, reached L3]``)."""
    out: dict[str, list[int]] = {}
    for metric in metrics.registry.collect():
        for s in metric.samples:
            if s.name != "vigil_labelled_steps_total" or s.labels.get("label") != str(label):
                continue
            row = out.setdefault(s.labels["origin"], [0, 0, 0, 0])
            row[int(s.labels["tier"])] += int(s.value)
    return {origin: row for origin, row in out.items() if row[0] > 0}
