"""Alerts are edge-triggered: a condition that holds over many versions is one alert, and it
alerts again only after it has cleared."""

from __future__ import annotations

from monitor.rlhealth.alerts import Alert, AlertConfig, AlertLatch
from monitor.rlhealth.stream import RLHealthConfig, RLHealthMonitor
from streams.synthetic import coding_execution
from streams.tito import ExecutionTree, build_tree


def _execution(eid: str, version: int, staleness: int) -> ExecutionTree:
    """A real coding execution dispatched ``staleness`` versions before it was consumed."""
    calls, end = coding_execution(eid, query_id=f"q-{eid}", seed=1)
    calls = [c.model_copy(update={"dispatch_version": version - staleness,
                                  "policy_version": version - staleness}) for c in calls]
    return build_tree(eid, calls, end.model_copy(update={"consumed_version": version}))


def test_staleness_that_persists_alerts_once_and_again_after_it_cleared() -> None:
    # E[d] = φ + (μ − 1)/2 = 1; each version judged on its own (window 1)
    monitor = RLHealthMonitor(RLHealthConfig(alerts=AlertConfig(
        phi=1, mu=1, staleness_tolerance=0.5, staleness_window=1, staleness_warmup=0)))
    # on target for 3 versions, 5 versions behind, back on target, behind again
    plan = [1] * 3 + [4] * 5 + [1] * 3 + [4] * 4
    raised: dict[int, list[Alert]] = {}
    for v, d in enumerate(plan, start=1):
        for k in range(2):
            _, alerts = monitor.observe(_execution(f"e{v}-{k}", v, d))
            for a in alerts:
                raised.setdefault(a.version or 0, []).append(a)
    for a in monitor.finish():
        raised.setdefault(a.version or 0, []).append(a)
    stale = [a for a in monitor.alerts if a.kind == "staleness"]
    # one alert when the trainer fell behind (version 4), none while it stayed behind,
    # and one more when it fell behind again (version 12) after catching up
    assert [a.version for a in stale] == [4, 12]
    assert all(a.value == 4.0 and a.threshold == 1.0 for a in stale)
    assert sorted(raised) == [4, 12]
    report = monitor.report()
    assert [a["version"] for a in report["alerts"]] == [4, 12]
    # still behind at the end: the condition is active, its latest judgement is version 15
    assert [(a["kind"], a["version"]) for a in report["alerts_active"]] == [("staleness", 15)]


def test_the_latch_holds_per_condition() -> None:
    latch = AlertLatch()

    def hacking(version: int, query: str) -> Alert:
        return Alert("reward_hacking", version, 0.5, 0.0, "reward and harm rose", subject=query)

    assert latch.update("reward_hacking/q1", hacking(3, "q1")) == hacking(3, "q1")
    assert latch.update("reward_hacking/q2", hacking(3, "q2")) == hacking(3, "q2")  # its own
    assert latch.update("reward_hacking/q1", hacking(4, "q1")) is None  # still hacking
    assert latch.update("reward_hacking/q1", None) is None  # cleared
    assert [a.subject for a in latch.active] == ["q2"]
    assert latch.update("reward_hacking/q1", hacking(6, "q1")) == hacking(6, "q1")  # again
    assert hacking(6, "q1").condition == "reward_hacking/q1"
