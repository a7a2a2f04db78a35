"""The screen stage with live gate thresholds (``monitor stream --adapt``) on the real broker:
it screens with thresholds that move off the calibrated ones, exports both, saves its
sketches to the gates topic, and a restarted stage resumes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dashboards.metrics import WorkerMetrics
from monitor.adaptive import LiveGates
from monitor.pipeline import load_screener
from monitor.stream.screen import ScreenStage
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import publish_record
from streams.records import Trajectory, step_events


def _slack(small_agentdojo: Path, copies: int) -> list[Trajectory]:
    rows = [json.loads(line) for line in (small_agentdojo / "trajectories.jsonl").open()]
    slack = [r for r in rows if r["meta"]["split"] == "test_slack"]
    return [Trajectory.model_validate({**r, "trajectory_id": f"{r['trajectory_id']}/r{i}"})
            for i in range(copies) for r in slack]


def _stage(tiny_policy: Path, topics: Topics, said: list[str]) -> tuple[ScreenStage, WorkerMetrics]:
    screener = load_screener(tiny_policy, reviewer=False)
    screener.live = LiveGates(screener.policy, window=200, min_count=40)
    metrics = WorkerMetrics(CollectorRegistry())
    return ScreenStage(screener, topics, metrics=metrics, report=said.append,
                       gates_every_s=0.0), metrics


def test_live_gates_move_are_exported_and_resume_after_a_restart(
    kafka_settings: KafkaSettings, topics: Topics, tiny_policy: Path, small_agentdojo: Path,
    unique: str,
) -> None:
    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    for t in _slack(small_agentdojo, 2):
        for e in step_events(t):
            publish_record(bus, topics.steps_deployment, e, key=e.trajectory_id)
    bus.flush()
    group = f"{unique}.screen"
    said: list[str] = []
    stage, metrics = _stage(tiny_policy, topics, said)
    stage.processor(bus, group, batch_size=16).run(idle_timeout_s=3.0)
    live = stage.screener.live
    assert live is not None and stage.stats.scored_l0 > 0
    seen = [g.scores.n for g in live.gates]
    assert seen[0] > 40  # every step reached gate L0 ...
    moved = live.thresholds()
    calibrated = tuple(g.threshold for g in stage.screener.policy.gates)
    assert moved[0] != calibrated[0]  # ... and its threshold left the calibrated one
    value = metrics.registry.get_sample_value
    assert value("vigil_gate_threshold", {"gate": "L0", "kind": "calibrated"}) == calibrated[0]
    assert value("vigil_gate_threshold", {"gate": "L0", "kind": "live"}) == moved[0]
    assert value("vigil_gate_budget", {"gate": "L0"}) == stage.screener.policy.gates[0].budget

    # a new process of the same group starts from the sketches the first one saved
    said2: list[str] = []
    again, _ = _stage(tiny_policy, topics, said2)
    assert again.screener.live is not None
    again.processor(bus, group, batch_size=16).run(idle_timeout_s=2.0)
    assert any("live gates resumed" in s for s in said2), said2
    assert [g.scores.n for g in again.screener.live.gates] == seen
    assert again.screener.live.thresholds() == moved
    # another group has nothing saved: it starts from the calibrated thresholds
    fresh, _ = _stage(tiny_policy, topics, [])
    fresh.processor(bus, f"{unique}.other", batch_size=16)
    assert fresh.screener.live is not None
    assert fresh.screener.live.thresholds() == calibrated
    bus.close()


def test_rollout_verdicts_carry_the_trajectory_verdict_and_its_live_threshold(
    kafka_settings: KafkaSettings, topics: Topics, narrow_policy: Path, small_agentdojo: Path,
    unique: str,
) -> None:
    """Rollout executions through the screen and probe stages: each verdict carries the
    policy's trajectory score over the execution's steps (the same as monitor screen's for
    those step scores), quarantines when it reaches the threshold, and with live gates the
    trajectory threshold leaves the calibrated one to flag its budget of the executions
    closed, exported beside the gates' thresholds."""
    from monitor.stream.probe import ProbeStage
    from tests.worker.conftest import Outputs

    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    runs = [t.model_copy(update={"source": "rollout"}) for t in _slack(small_agentdojo, 3)]
    for t in runs:
        for e in step_events(t):
            publish_record(bus, topics.steps_rollout, e, key=e.trajectory_id)
    bus.flush()
    out = Outputs(bus, topics, f"{unique}.reader")
    said: list[str] = []
    screen = ScreenStage(load_screener(narrow_policy, reviewer=False), topics, report=said.append)
    screen.processor(bus, f"{unique}.screen", batch_size=16).run(idle_timeout_s=3.0)
    screener = load_screener(narrow_policy, reviewer=False)
    screener.live = LiveGates(screener.policy, window=200, min_count=40, trajectory_window=40)
    metrics = WorkerMetrics(CollectorRegistry())
    probe = ProbeStage(screener, topics, metrics=metrics, report=said.append, gates_every_s=0.0)
    probe.processor(bus, f"{unique}.probe", batch_size=16).run(idle_timeout_s=3.0)
    steps = sum(len(t.steps) for t in runs)
    assert out.read_until(lambda o: len(o.of(topics.verdicts_rollout)) >= len(runs)
                          and len(o.keys(topics.scores, tier=0)) >= steps, 60)
    verdicts = {v["execution_id"]: v for v in
                (json.loads(m.value) for m in out.of(topics.verdicts_rollout))}
    assert set(verdicts) == {t.trajectory_id for t in runs}
    deepest: dict[tuple[str, str], dict] = {}  # each step's deepest score record
    for m in out.of(topics.scores):
        r = json.loads(m.value)
        key = (r["trajectory_id"], r["step_id"])
        if key not in deepest or r["tier"] > deepest[key]["tier"]:
            deepest[key] = r
    agg = screener.policy.trajectory
    assert agg is not None
    flagged_by_score = 0
    for t in runs:
        v = verdicts[t.trajectory_id]
        final = [deepest[(t.trajectory_id, s.step_id)]["score"] for s in t.steps]
        assert v["trajectory_score"] == pytest.approx(agg.score(final), abs=1e-6)
        by_score = [r for r in v["reasons"] if r.startswith("trajectory score")]
        flagged_by_score += bool(by_score)
        assert v["quarantine"] == bool(v["step_ids"] or by_score)
    live = screener.live.trajectory
    assert live is not None and 20 <= live.scores.n <= 40  # the window: the latest 20-40 runs
    assert screener.live.trajectory_threshold() != agg.threshold  # it moved off calibration
    value = metrics.registry.get_sample_value
    assert value("vigil_gate_threshold", {"gate": "trajectory", "kind": "live"}) == \
        screener.live.trajectory_threshold()
    assert 0 < flagged_by_score < len(runs)
    out.close()
    bus.close()


def test_a_deployment_run_goes_to_l2_once_when_its_trajectory_score_reaches_the_threshold(
    kafka_settings: KafkaSettings, topics: Topics, narrow_policy: Path, small_agentdojo: Path,
    unique: str,
) -> None:
    """Deployment runs never end, so no verdict closes them: the probe stage keeps each one's
    running trajectory score and, the first time it reaches the threshold at a step no gate
    passed up, escalates that step with the run so far to L2, once a run; a run that stays
    below it, or whose steps went to L2 on their own first, gets no such escalation."""
    from dataclasses import replace

    from monitor.stream.probe import ProbeStage
    from monitor.trajectory import RunningScores
    from tests.worker.conftest import Outputs

    bus = KafkaBus(kafka_settings)
    bus.ensure_topics(topics.all())
    runs = _slack(small_agentdojo, 2)
    for t in runs:
        for e in step_events(t):
            publish_record(bus, topics.steps_deployment, e, key=e.trajectory_id)
    bus.flush()
    out = Outputs(bus, topics, f"{unique}.reader")
    screen = ScreenStage(load_screener(narrow_policy, reviewer=False), topics, report=print)
    screen.processor(bus, f"{unique}.screen", batch_size=16).run(idle_timeout_s=3.0)
    steps = sum(len(t.steps) for t in runs)
    assert out.read_until(lambda o: len(o.keys(topics.scores, tier=0)) >= steps, 60)
    screener = load_screener(narrow_policy, reviewer=False)
    agg = screener.policy.trajectory
    assert agg is not None
    # a threshold half the runs reach on their L0 scores, so both outcomes occur
    l0 = {(r["trajectory_id"], r["step_id"]): r["score"] for r in
          (json.loads(m.value) for m in out.of(topics.scores)) if r["tier"] == 0}
    peaks = []
    for t in runs:
        running = RunningScores()
        for s in t.steps:
            running.add(l0[(t.trajectory_id, s.step_id)])
        peaks.append(agg.score(running))
    agg = replace(agg, threshold=sorted(peaks)[len(peaks) // 2])
    screener.policy = replace(screener.policy, trajectory=agg)
    probe = ProbeStage(screener, topics, report=print)
    probe.processor(bus, f"{unique}.probe", batch_size=16).run(idle_timeout_s=3.0)
    out.read_until(lambda o: False, 3)  # what the probe stage wrote
    deepest: dict[tuple[str, str], dict] = {}
    for m in out.of(topics.scores):
        r = json.loads(m.value)
        key = (r["trajectory_id"], r["step_id"])
        if key not in deepest or r["tier"] > deepest[key]["tier"]:
            deepest[key] = r
    expected = {}
    for t in runs:  # the first step where the run's score reaches it, unless L2 came first
        running = RunningScores()
        for s in t.steps:
            d = deepest[(t.trajectory_id, s.step_id)]
            running.add(d["score"])
            if d["tier"] == 1 and d["flagged"]:  # passed up by the L1 gate: at L2 already
                break
            if agg.score(running) >= agg.threshold:
                expected[t.trajectory_id] = s.step_id
                break
    by_run = [json.loads(m.value) for m in out.of(topics.escalations)]
    by_run = [e for e in by_run if e["reason"].startswith("trajectory score")]
    got = {e["trajectory_id"]: e["step_id"] for e in by_run}
    assert len(got) == len(by_run)  # once a run
    assert got == expected
    assert 0 < len(got) < len(runs)
    assert probe.stats.runs_to_review == len(got) and not out.of(topics.deadletter)
    first = by_run[0]
    assert first["tier"] == 2 and first["trajectory"]["steps"][-1]["step_id"] == first["step_id"]
    out.close()
    bus.close()
