"""`monitor calibrate --benign FILE`: a policy's thresholds re-fitted to a user's own
known-good runs (models and weights kept), each budget then held on those runs, and the
report of what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.cli.main import main
from monitor.tiers import CalibratedPolicy
from tests.built import bundle_digests


def _benign_runs(small_agentdojo: Path, out: Path, min_steps: int = 240) -> int:
    """Benign AgentDojo runs, copied under new ids until there are ``min_steps`` steps."""
    rows = [json.loads(x) for x in (small_agentdojo / "trajectories.jsonl").open()]
    benign = [r for r in rows if r["label"] == 0]
    lines, steps, copy = [], 0, 0
    while steps < min_steps:
        for r in benign:
            lines.append(json.dumps({**r, "trajectory_id": f"{r['trajectory_id']}#{copy}"}))
            steps += len(r["steps"])
        copy += 1
    out.write_text("\n".join(lines) + "\n")
    return steps


def test_thresholds_move_to_hold_each_budget_on_the_users_runs(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, out = tmp_path / "ours.jsonl", tmp_path / "ours-policy.json"
    n = _benign_runs(small_agentdojo, src)
    bundles = bundle_digests(tiny_policy)
    assert main(["calibrate", "--benign", str(src), "--policy", str(tiny_policy),
                 "--out", str(out), "--no-review"]) == 0
    assert bundle_digests(out) == bundles  # the same model files, byte for byte
    err = capsys.readouterr().err
    assert f"re-fitted on {n} benign steps" in err and "gate L0->L1" in err
    old = CalibratedPolicy.from_dict(json.loads(tiny_policy.read_text()))
    new = CalibratedPolicy.from_dict(json.loads(out.read_text()))
    assert new.data == old.data  # the same models
    for a, b in zip(old.gates, new.gates, strict=True):
        assert a.signals == b.signals and a.budget == b.budget
        assert list(a.combiner.coef_) == list(b.combiner.coef_)  # the same weights
    report = new.metrics["benign_refit"]
    assert report["steps"] == n
    # each budget holds on these runs (L0 and L1 ran; the tiny policy has no reviewer)
    for name, g in list(report["gates"].items())[:2]:
        assert g["share_passing_after"] <= g["budget"] + 1e-9, (name, g)
    # and monitor screen with the new policy sees exactly what the report says
    screened = tmp_path / "screened.jsonl"
    assert main(["screen", str(src), "--out", str(screened), "--policy", str(out),
                 "--no-review"]) == 0
    tiers = [s["tier"] for line in screened.read_text().splitlines()
             for s in json.loads(line)["steps"]]
    assert len(tiers) == n
    got = sum(t >= 1 for t in tiers) / n
    assert got == pytest.approx(report["gates"]["L0->L1"]["share_passing_after"], abs=2 / n)


def test_too_few_steps_is_one_sentence_before_any_model(
    small_agentdojo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "few.jsonl"
    row = next(json.loads(x) for x in (small_agentdojo / "trajectories.jsonl").open())
    src.write_text(json.dumps(row) + "\n")
    assert main(["calibrate", "--benign", str(src), "--policy", str(tmp_path / "none.json"),
                 "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "needs at least 200" in err and len(err.strip().splitlines()) == 1
