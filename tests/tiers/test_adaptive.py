"""Live thresholds (monitor.adaptive): a gate under a shifted score distribution converges to
its budget, never rises past the canaries' recall floor, forgets what left its window and
resumes from its saved sketches; ``monitor screen --adapt`` holds L0's budget on a suite the
models never saw, where the calibrated threshold does not."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from monitor.adaptive import LiveGate, LiveGates, WindowSketch
from monitor.cli.main import main
from monitor.tiers import CalibratedPolicy

KLL_RANK_ERROR = 0.02  # k = 200: about 1.3 % at 99 % confidence, two sketches merged


def binomial_tol(p: float, n: int) -> float:
    return 4 * math.sqrt(p * (1 - p) / n) + KLL_RANK_ERROR


def gate(calibrated: float = 0.5, share: float = 0.2, window: int = 4000) -> LiveGate:
    return LiveGate(calibrated=calibrated, share=share, scores=WindowSketch(window),
                    canaries=WindowSketch(window), min_count=500)


def test_a_gate_under_a_shifted_distribution_converges_to_its_budget() -> None:
    rng = np.random.default_rng(0)
    g = gate()
    shifted = rng.beta(4, 2, 20_000)  # a stream the calibrated 0.5 would pass ~80 % of
    assert (shifted >= g.calibrated).mean() > 0.75
    assert g.threshold() == g.calibrated  # nothing seen yet: the calibrated threshold holds
    for chunk in np.array_split(shifted, 100):
        g.scores.update(chunk)
    fresh = rng.beta(4, 2, 5_000)
    passed = float((fresh >= g.threshold()).mean())
    assert abs(passed - 0.2) <= binomial_tol(0.2, len(fresh)), passed


def test_the_threshold_never_rises_past_the_canaries_recall_floor() -> None:
    rng = np.random.default_rng(1)
    g = gate()
    # canaries: 90 % score in [0.55, 0.7] -> the calibrated 0.5 catches 90 % of them
    canaries = np.concatenate([rng.uniform(0.55, 0.7, 900), rng.uniform(0.0, 0.45, 100)])
    g.canaries.update(canaries)
    g.scores.update(rng.beta(8, 2, 10_000))  # benign mass at 0.8: the budget wants ~0.9
    t = g.threshold()
    assert t < np.quantile(rng.beta(8, 2, 10_000), 0.8)  # the floor, not the budget, won
    recall = float((canaries >= t).mean())
    assert recall >= 0.9 - KLL_RANK_ERROR, (t, recall)
    # ... and it does rise to the floor: up to the lowest canary still caught (0.55), past
    # the calibrated 0.5, where no caught canary scores
    assert t >= canaries[canaries >= g.calibrated].min() - 1e-9, t


def test_the_window_forgets_old_scores() -> None:
    rng = np.random.default_rng(2)
    g = gate(window=2_000)
    g.scores.update(rng.uniform(0.0, 0.3, 10_000))
    g.scores.update(rng.uniform(0.6, 0.9, 2_000))  # the window now holds only the new ones
    assert 0.6 <= g.threshold() <= 0.9
    assert g.scores.n <= 2_000


def test_saved_sketches_resume_to_the_same_thresholds(tiny_policy: Path) -> None:
    policy = CalibratedPolicy.load(tiny_policy)
    rng = np.random.default_rng(3)
    live = LiveGates(policy, window=4_000, min_count=100)
    for g in live.gates:
        g.scores.update(rng.beta(2, 5, 3_000))
        g.canaries.update(rng.beta(5, 2, 300))
    assert policy.trajectory is not None and live.trajectory is not None
    live.trajectory.scores.update(rng.beta(2, 5, 1_000))
    blob = live.to_bytes()
    assert len(blob) < 64_000
    again = LiveGates(policy, window=4_000, min_count=100)
    assert again.thresholds() == tuple(g.threshold for g in policy.gates)  # fresh: calibrated
    assert again.trajectory_threshold() == policy.trajectory.threshold
    again.restore(blob)
    assert again.thresholds() == live.thresholds()
    assert again.trajectory_threshold() == live.trajectory_threshold() != (
        policy.trajectory.threshold)
    # a save from before the trajectory threshold adapted resumes the gates
    older = LiveGates(policy, window=4_000, min_count=100)
    older.restore(json.dumps(json.loads(blob)[:3]).encode())
    assert older.thresholds() == live.thresholds()
    assert older.trajectory_threshold() == policy.trajectory.threshold
    with pytest.raises(ValueError, match="gates"):
        again.restore(json.dumps([]).encode())


def test_screen_adapt_holds_the_l0_budget_on_an_unseen_suite(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny policy, calibrated on banking, meets slack traffic (never trained on; the
    suite's trajectories replayed 4 times): the calibrated L0 threshold passes more than its
    budget of benign steps; adapted, once its window has filled, about the budget."""
    rows = [json.loads(line) for line in (small_agentdojo / "trajectories.jsonl").open()]
    slack = [r for r in rows if r["meta"]["split"] == "test_slack"]
    stream = [{**r, "trajectory_id": f"{r['trajectory_id']}/r{i}"}
              for i in range(4) for r in slack]
    src = tmp_path / "slack.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in stream))
    budget = CalibratedPolicy.load(tiny_policy).gates[0].budget

    def benign_past_l0(*extra: str) -> list[bool]:
        out = tmp_path / f"out{len(extra)}.jsonl"
        args = ["screen", str(src), "--out", str(out), "--policy", str(tiny_policy),
                "--no-review", "--batch-steps", "16", *extra]
        assert main(args) == 0
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        return [s["tier"] >= 1 for line, r in zip(lines, stream, strict=True)
                for s, rs in zip(line["steps"], r["steps"], strict=True) if rs["label"] == 0]

    fixed = benign_past_l0()
    capsys.readouterr()
    adapted = benign_past_l0("--adapt", "--adapt-window", "200", "--adapt-trajectory-window",
                             "40")
    err = capsys.readouterr().err
    assert "adapted gate L0->L1" in err
    # the trajectory threshold followed the file's runs too (the latest 20 to 40 of them)
    got = re.search(r"adapted trajectory threshold: \S+ -> \S+ \(flags ([\d.]+)% of the "
                    r"last (\d+) trajectories; target ([\d.]+)%\)", err)
    assert got is not None, err
    assert 20 <= int(got[2]) <= 40 and float(got[1]) <= float(got[3]) + 100 * KLL_RANK_ERROR
    later = len(fixed) // 2  # the second half: the window (200 scores) has filled by then
    fixed_share, adapted_share = np.mean(fixed[later:]), np.mean(adapted[later:])
    tol = 3 * math.sqrt(budget * (1 - budget) / (len(fixed) - later)) + KLL_RANK_ERROR
    assert fixed_share > budget + tol, (fixed_share, budget)
    assert adapted_share <= budget + tol, (adapted_share, budget)


def test_only_real_traffic_and_harmful_canary_steps_are_sketched(tiny_policy: Path) -> None:
    from monitor.tiers import TierDecision

    live = LiveGates(CalibratedPolicy.load(tiny_policy), window=100, min_count=10)
    d = [TierDecision(tier=1, score=0.5, gate_scores=(0.5, 0.4), flagged=False,
                      evaluated_through=1) for _ in range(3)]
    live.observe(d, ["real", "canary", "replay"])  # replay: a canary's benign prefix step
    assert [g.scores.n for g in live.gates] == [1, 1, 0]
    assert [g.canaries.n for g in live.gates] == [1, 1, 0]


def test_the_trajectory_threshold_adapts_but_stays_under_the_canaries_recall_floor(
    small_agentdojo: Path, narrow_policy: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A shifted stream: only hijacked runs (the val split's, which score high), with
    harmful canary runs among them (training runs cut after their first harmful step). The
    live trajectory threshold would rise to flag only its budget of the stream's runs, but
    stops at the score that keeps the canaries' recall at what the calibrated threshold gave
    them; without the canaries it rises past that score."""
    from dashboards.canary import CANARY_KEY, canary_from
    from streams.records import Trajectory

    rows = [json.loads(line) for line in (small_agentdojo / "trajectories.jsonl").open()]
    hijacked = [r for r in rows if r["meta"]["split"] == "val" and r["label"] == 1]
    train = [Trajectory.model_validate(r) for r in rows if r["meta"]["split"] == "train"]
    canaries = [c for c in (canary_from(t) for t in train) if c is not None]
    real = [{**r, "trajectory_id": f"{r['trajectory_id']}/r{i}"}
            for i in range(-(-80 // len(hijacked))) for r in hijacked]
    fake = [json.loads(c.model_copy(update={  # tagged as a stream's injected canaries are
        "trajectory_id": f"canary/{c.trajectory_id}/{i}",
        "meta": {CANARY_KEY: {"canary_id": c.trajectory_id, "instance": str(i)}}})
        .model_dump_json()) for i in range(-(-60 // len(canaries))) for c in canaries]
    assert len(fake) >= 60

    def adapted(runs: list[dict]) -> re.Match[str]:
        src, out = tmp_path / f"in{len(runs)}.jsonl", tmp_path / f"out{len(runs)}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in runs))
        assert main(["screen", str(src), "--out", str(out), "--policy", str(narrow_policy),
                     "--no-review", "--adapt", "--adapt-trajectory-window", "160"]) == 0
        err = capsys.readouterr().err
        got = re.search(r"adapted trajectory threshold: ([\d.]+) -> ([\d.]+) \(.*?"
                        r"(?:; canaries' recall floor stops it at ([\d.]+|inf), (\d+) harmful "
                        r"canary runs)?"
                        r"\)\n", err)
        assert got is not None, err
        return got

    mixed = [r for pair in itertools.zip_longest(real, fake) for r in pair if r is not None]
    floor = adapted(mixed)
    assert floor[3] is not None and int(floor[4]) == len(fake), floor[0]
    assert float(floor[2]) <= float(floor[3])
    free = adapted(real)
    assert free[3] is None
    assert float(free[2]) > float(floor[3]) >= float(floor[2]), (free[0], floor[0])
