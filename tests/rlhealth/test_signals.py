"""Per-execution, per-group and per-version signals, and the alert rules, on real trees."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from monitor.rlhealth.alerts import (
    AlertConfig,
    drift_alert,
    mismatch_alert,
    staleness_alert,
)
from monitor.rlhealth.metrics import RLHealthMetrics
from monitor.rlhealth.signals import (
    ExecutionSignals,
    VersionSignals,
    execution_signals,
    group_signals,
)
from monitor.rlhealth.stream import RLHealthConfig, RLHealthMonitor
from streams.records import ExecutionEnd
from streams.synthetic import coding_execution
from streams.tito import build_tree, select_trajectories


def _tree(eid: str = "exec-1", *, shift: float | None = None, **end: object):  # type: ignore[no-untyped-def]
    calls, e = coding_execution(eid, seed=1)
    if shift is not None:
        calls = [
            c.model_copy(
                update={"trainer_logprobs": [lp + shift for lp in c.output_logprobs or []]}
            )
            for c in calls
        ]
    end_rec = ExecutionEnd.model_validate({**e.model_dump(), **end})
    return build_tree(eid, calls, end_rec)


def test_execution_shape_staleness_and_admission() -> None:
    tree = _tree(timed_out=True, reward=0.4)
    ex = execution_signals(tree, j_max=2)
    assert ex.dispatch_version == 11 and ex.consumed_version == 13 and ex.staleness == 2
    assert ex.calls == 13 and ex.leaves == 3  # m11 (main), m6a (main, the retry), s2 (sub)
    assert ex.admitted == 2 and ex.dropped == 1 and ex.admitted_roles == ("main", "main")
    # the same choice as the trainer-facing selection in streams.tito
    chosen = select_trajectories(tree, j_max=2)
    assert [t.meta["leaf_role"] for t in chosen] == list(ex.admitted_roles)
    assert ex.node_occurrences == tree.node_occurrences and ex.unique_nodes == 13
    assert ex.dedup_ratio == 13 / tree.node_occurrences < 1.0
    assert ex.timed_out and ex.reward == 0.4 and ex.duration_s > 0
    assert execution_signals(tree, j_max=5).admitted_roles == ("main", "main", "sub")
    assert ex.call_signals == ()  # no trainer log-probs, no drift


def test_call_drift_from_trainer_logprobs() -> None:
    ex = execution_signals(_tree(shift=0.1), delta=0.8)
    assert len(ex.call_signals) == ex.calls
    for c in ex.call_signals:
        assert abs(c.drift_nats - 0.1 * c.tokens) < 1e-6  # M = Σ 0.1
        assert abs(c.mismatch_abs_mean - 0.1) < 1e-6
        assert c.out_of_trust_share == 0.0  # e^0.1 − 1 < 0.8
        assert c.trainer_version == 13  # the consumed version when not named


def _ex(eid: str, qid: str, reward: float, harm: float, version: int) -> ExecutionSignals:
    return ExecutionSignals(
        eid, qid, version - 1, version, 1, 1.0, False, reward, harm, 1, 1, 1, ("main",), 0,
        1, 1, 1.0, 0, (),
    )  # fmt: skip


def test_group_symmax_and_reward_hacking() -> None:
    first = group_signals([_ex(f"a{i}", "q", r, 0.1, 3) for i, r in enumerate([1, 0, 0, 0])])
    assert first.symmax_advantages == (1.0, -1 / 3, -1 / 3, -1 / 3)
    assert first.reward_mean == 0.25 and not first.reward_hacking
    later = group_signals(
        [_ex(f"b{i}", "q", r, 0.4, 4) for i, r in enumerate([1, 1, 0, 0])], previous=first
    )
    assert later.reward_delta == 0.25 and abs((later.harm_delta or 0) - 0.3) < 1e-9
    assert later.reward_hacking  # reward rose and harm rose
    benign = group_signals(
        [_ex(f"c{i}", "q", r, 0.1, 4) for i, r in enumerate([1, 1, 0, 0])], previous=first
    )
    assert not benign.reward_hacking  # reward rose, harm did not


def _v(version: int, stale: dict[int, int], drift: float | None = None) -> VersionSignals:
    return VersionSignals(
        version, sum(stale.values()), None, stale, 8, drift, drift, 0.0, drift, 0.0, None, 0
    )


def test_staleness_alert_leaves_the_band() -> None:
    cfg = AlertConfig(phi=1, mu=2, staleness_tolerance=0.25)
    ok = [_v(v, {1 + v % 2: 8}) for v in range(1, 5)]  # 2, 1, 2, 1: mean 1.5
    for v in ok:
        object.__setattr__(v, "staleness_mean", 1.5)
    assert staleness_alert(ok, cfg) is None
    stale = [*ok, *[_v(v, {4: 8}) for v in range(5, 9)]]  # the trainer fell behind
    for v in stale:
        object.__setattr__(v, "staleness_mean", 4.0)
    alert = staleness_alert(stale, cfg)
    assert alert is not None and alert.kind == "staleness" and alert.value == 4.0
    assert alert.threshold == 1.5 and "outside E[d]" in alert.message


def test_drift_alert_on_growth_not_on_noise() -> None:
    cfg = AlertConfig(drift_growth=1.5, drift_min_nats=1.0, drift_window=3)
    flat = [_v(v, {1: 8}, 0.3 + 0.02 * (v % 2)) for v in range(6)]
    assert drift_alert(flat, cfg) is None
    assert drift_alert([*flat, _v(6, {1: 8}, 0.9)], cfg) is None  # 3x, under the floor
    alert = drift_alert([*flat, _v(6, {1: 8}, 0.9), _v(7, {1: 8}, 2.5)], cfg)
    assert alert is not None and alert.version == 7 and alert.value == 2.5


def test_mismatch_alert_on_a_spike() -> None:
    cfg = AlertConfig(mismatch_reference=0.02, mismatch_spike=1.0)
    assert mismatch_alert([_v(0, {}, 0.03)], cfg) is None  # +50 %
    alert = mismatch_alert([_v(0, {}, 0.03), _v(2, {}, 0.05)], cfg)  # +150 %
    assert alert is not None and alert.kind == "mismatch" and abs(alert.value - 1.5) < 1e-9
    auto = AlertConfig(mismatch_reference=None, mismatch_reference_versions=2)
    assert mismatch_alert([_v(0, {}, 0.02), _v(1, {}, 0.02), _v(2, {}, 0.07)], auto) is not None


def test_monitor_exports_metrics_in_a_fresh_registry() -> None:
    registry = CollectorRegistry()
    monitor = RLHealthMonitor(
        RLHealthConfig(alerts=AlertConfig(phi=1, mu=2)), RLHealthMetrics(registry)
    )
    monitor.observe(_tree("e1", shift=0.1, timed_out=True, reward=0.3))
    monitor.finish()
    text = generate_latest(registry).decode()
    assert 'vigil_rl_executions_total{timed_out="true"} 1.0' in text
    assert "vigil_rl_staleness_bucket" in text and "vigil_rl_staleness_sum 2.0" in text
    assert "vigil_rl_staleness_expected 1.5" in text
    assert 'vigil_rl_trajectories_admitted_total{role="sub"} 1.0' in text
    assert "vigil_rl_timeout_reward_count 1.0" in text
    assert "vigil_rl_drift_nats " in text and "vigil_rl_mismatch_abs_logprob 0.1" in text
