"""Recall from labels: the label/score join, Wilson intervals (Python and PromQL on a real
Prometheus agree), and the canary set (training data only, one harmful step each)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from dashboards import promql
from dashboards.canary import (
    CanaryError,
    CanaryInjector,
    build_canary_set,
    canary_events,
    is_canary,
    load_canary_set,
)
from dashboards.ground_truth import LabelJoin
from dashboards.metrics import WorkerMetrics
from dashboards.prometheus import LocalPrometheus
from streams.records import LabelRecord, Score, Trajectory, read_jsonl
from vigil.metrics import wilson_interval


def _count(m: WorkerMetrics, **labels: str) -> float:
    total = 0.0
    for metric in m.registry.collect():
        for s in metric.samples:
            if s.name == "vigil_labelled_steps_total" and all(
                s.labels.get(k) == v for k, v in labels.items()
            ):
                total += s.value
    return total


def _score(step: str, tier: int, flagged: bool, source: str = "deployment") -> Score:
    return Score(trajectory_id="t", step_id=step, tier=tier, score=0.5, flagged=flagged,
                 source=source)  # type: ignore[arg-type]


def _label(step: str, label: int, origin: str = "dataset", category: str | None = None
           ) -> LabelRecord:
    return LabelRecord(trajectory_id="t", step_id=step, label=label,  # type: ignore[arg-type]
                       origin=origin, category=category)  # type: ignore[arg-type]


def test_join_counts_each_labelled_step_once_per_tier_it_reached_in_any_order() -> None:
    m = WorkerMetrics(CollectorRegistry())
    join = LabelJoin(m)
    # a: label first, then it climbs to tier 3 as its scores arrive
    join.on_label(_label("a", 1, category="financial"))
    join.on_score(_score("a", 0, True))
    join.on_score(_score("a", 1, True))
    join.on_score(_score("a", 2, True))
    # b: scores first (stops at tier 1), label later
    join.on_score(_score("b", 0, True))
    join.on_score(_score("b", 1, False))
    join.on_label(_label("b", 1, category="financial"))
    # c: benign, stays at tier 0; redelivered score and label change nothing
    for _ in range(2):
        join.on_score(_score("c", 0, False))
        join.on_label(_label("c", 0))
    harmful = {"label": "1", "origin": "dataset", "category": "financial"}
    assert [_count(m, tier=str(t), **harmful) for t in range(4)] == [2, 2, 1, 1]
    assert [_count(m, tier=str(t), label="0") for t in range(4)] == [1, 0, 0, 0]
    # the same step labelled by a human as well counts under its own origin
    join.on_label(_label("b", 1, origin="human"))
    assert [_count(m, tier=str(t), origin="human") for t in range(4)] == [1, 1, 0, 0]
    assert _count(m, tier="0", origin="dataset") == 3


def test_join_forgets_the_oldest_steps_past_its_bound() -> None:
    m = WorkerMetrics(CollectorRegistry())
    join = LabelJoin(m, max_steps=2)
    for s in ("a", "b", "c"):
        join.on_score(_score(s, 0, False))
    join.on_label(_label("a", 1))  # "a" fell out: its tiers are unknown now
    assert _count(m, tier="0") == 0
    assert join.stats.evicted >= 1


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson_interval(8, 10)  # type: ignore[misc]
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) is None
    lo, hi = wilson_interval(0, 20)  # type: ignore[misc]
    assert lo == 0.0 and 0.15 < hi < 0.17


@given(st.integers(0, 200), st.integers(1, 200))
@settings(max_examples=60, deadline=None)
def test_wilson_interval_contains_the_estimate(k: int, n: int) -> None:
    k = min(k, n)
    lo, hi = wilson_interval(k, n)  # type: ignore[misc]
    assert 0.0 <= lo <= k / n <= hi <= 1.0


@pytest.fixture(scope="module")
def prometheus() -> Iterator[LocalPrometheus]:
    with LocalPrometheus([]) as p:
        yield p


@pytest.mark.parametrize("k, n", [(8, 10), (0, 20), (37, 40), (1, 1), (500, 1000)])
def test_promql_wilson_equals_python(prometheus: LocalPrometheus, k: int, n: int) -> None:
    """The dashboards' PromQL interval is the same number as ``monitor report``'s."""
    want = wilson_interval(k, n)
    assert want is not None
    for bound, expected in zip(("lower", "upper"), want, strict=True):
        got = prometheus.client.value(promql.wilson(f"vector({k})", f"vector({n})", bound))
        assert got is not None
        assert got == pytest.approx(expected, abs=1e-9) or (expected == 0 and abs(got) < 1e-9)


def test_recall_promql_is_valid_and_matches_by_group(prometheus: LocalPrometheus) -> None:
    for expr in (promql.recall(2, "5m", by=("origin",), origin="~canary|dataset"),
                 promql.recall_interval(3, "1h", "upper", by=("stream", "category")),
                 promql.false_positive_rate(1, "1h"), promql.page_precision("1d")):
        assert prometheus.client.query(expr) == []  # parses; no data yet


# --- canaries --------------------------------------------------------------------------


def test_canary_set_comes_from_training_data_with_one_harmful_step_each(
    small_agentdojo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "canaries.jsonl"
    n = build_canary_set([small_agentdojo], out)
    canaries = load_canary_set(out)
    assert n == len(canaries) > 0
    train_ids = {t.trajectory_id for t in read_jsonl(small_agentdojo / "trajectories.jsonl",
                                                      Trajectory)
                 if t.meta.get("split") == "train"}
    for c in canaries:
        assert c.meta["from"] in train_ids
        assert [s.label for s in c.steps][-1] == 1
        assert sum(s.label == 1 for s in c.steps) == 1
        assert c.meta["category"] and c.meta["category"] != "unknown"
    with pytest.raises(CanaryError, match="held out"):
        build_canary_set([small_agentdojo], out, splits=["test_slack"])
    with pytest.raises(CanaryError, match="no trajectories file"):
        build_canary_set([tmp_path], out)


def test_injector_draws_deterministically_at_its_rate(small_agentdojo: Path,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "canaries.jsonl"
    build_canary_set([small_agentdojo], out)
    inj = CanaryInjector(load_canary_set(out), rate=0.05)
    a = inj.draw(64, "steps/0/100")
    assert a == inj.draw(64, "steps/0/100"), "a redelivered batch re-injects the same canaries"
    total = sum(len(inj.draw(100, f"steps/1/{i * 100}")) for i in range(200))
    # 20,000 draws at 5 %: 1,000 expected, sd ~31
    assert abs(total - 1000) < 5 * math.sqrt(1000 * 0.95)
    c, instance = inj.draw(1000, "x")[0]
    events = canary_events(c, instance, "rollout")
    assert all(is_canary(e.meta) and e.source == "rollout" for e in events)
    assert events[-1].final and not any(e.final for e in events[:-1])
    assert [e.step.label for e in events][-1] == 1
    with pytest.raises(CanaryError):
        CanaryInjector([], rate=0.1)
    with pytest.raises(CanaryError):
        CanaryInjector(inj.canaries, rate=1.5)
