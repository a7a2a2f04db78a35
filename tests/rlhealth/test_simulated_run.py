"""A replayed synthetic RL run: staleness on target, the drift alert before the collapse."""

from __future__ import annotations

import numpy as np

from monitor.rlhealth.alerts import AlertConfig
from monitor.rlhealth.simulate import simulate_rl_run
from monitor.rlhealth.stream import RLHealthConfig, RLHealthMonitor, monitor_records
from streams.records import ExecutionEnd


def test_drift_alert_fires_before_the_collapse_and_not_before_the_drift() -> None:
    run = simulate_rl_run(steps=14, phi=1, mu=2, collapse_at=10, passes=2, seed=3)
    monitor, counts = monitor_records(
        run.records, RLHealthMonitor(RLHealthConfig(alerts=AlertConfig(phi=1, mu=2)))
    )
    assert counts.get("late", 0) == 0 and counts["added"] == len(run.records)
    report = monitor.report()
    rewards = {v["version"]: v["reward_mean"] for v in report["versions"]}
    # the run really collapses at collapse_at ...
    assert np.mean([rewards[v] for v in range(run.collapse_at - 3, run.collapse_at)]) > 0.3
    assert max(rewards[v] for v in range(run.collapse_at, run.steps)) < 0.2
    # ... and the early warning came first, after the drift started
    drift = [a for a in monitor.alerts if a.kind == "drift"]
    assert drift, "no drift alert"
    first = min(a.version for a in drift if a.version is not None)
    assert run.drift_onset <= first < run.collapse_at
    # multi-pass reuse: the second pass drifts more than the first, every version
    by_pass = report["drift_by_pass"]
    assert all(by_pass[v][1] > by_pass[v][0] for v in by_pass)
    # boundary dispatch kept staleness on target: no staleness alert
    assert not [a for a in monitor.alerts if a.kind == "staleness"]
    steady = [v for v in report["versions"] if v["version"] >= 1]
    n = sum(sum(v["staleness_hist"].values()) for v in steady[:12])  # six whole bursts
    mean = sum(int(d) * c for v in steady[:12] for d, c in v["staleness_hist"].items()) / n
    assert mean == report["staleness"]["expected"] == 1.5
    # the injected reward hacker is flagged, no other query is
    hacked = {g["query_id"] for g in report["groups"]["flagged"]}
    assert hacked == {run.hacking_query}
    # execution shape: a long tail, timeouts with partial rewards, J_max drops
    shape = report["shape"]
    assert shape["duration_s"]["p99"] > 3 * shape["duration_s"]["p50"]
    assert shape["timed_out"] > 0 and 0 < shape["timeout_reward"]["mean"] < 0.5
    assert shape["dropped_over_j_max"] > 0 and shape["dedup_ratio"] < 0.95


def test_a_healthy_run_raises_no_drift_alert() -> None:
    run = simulate_rl_run(steps=10, collapse_at=100, drift_onset=100, hacking_query=None, seed=4)
    monitor, _ = monitor_records(
        run.records, RLHealthMonitor(RLHealthConfig(alerts=AlertConfig(phi=1, mu=2)))
    )
    assert monitor.alerts == []


def test_a_stalled_trainer_raises_the_staleness_alert() -> None:
    run = simulate_rl_run(steps=12, collapse_at=100, drift_onset=100, hacking_query=None)
    # the run was configured for φ = 0, μ = 1 (E[d] = 0) but dispatches with φ = 1, μ = 2
    monitor, _ = monitor_records(
        run.records,
        RLHealthMonitor(RLHealthConfig(alerts=AlertConfig(phi=0, mu=1, staleness_tolerance=0.5))),
    )
    alerts = [a for a in monitor.alerts if a.kind == "staleness"]
    assert alerts and alerts[0].threshold == 0.0 and alerts[0].value >= 1.0
    assert len(alerts) == 1  # behind at every version after it: one alert, not one a version
    ends = [r for r in run.records if isinstance(r, ExecutionEnd)]
    assert len(ends) == run.executions
