"""`monitor calibrate --runs FILE...`: a policy's trajectory verdict re-fitted on labelled
runs (monitor.trajectory_fit), every model, gate and step threshold kept; each form read on
each domain left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.cli.main import main
from monitor.tiers import CalibratedPolicy
from tests.built import bundle_digests


def _files(small_agentdojo: Path, tmp: Path) -> tuple[Path, Path]:
    """Two domains: the real banking runs as they are, and a team's file of the same runs
    three times as long (each run's steps repeated, ids of the team's own): long runs."""
    rows = [json.loads(x) for x in (small_agentdojo / "trajectories.jsonl").open()]
    rows = [r for r in rows if r["meta"]["split"] in ("train", "val")]
    ours = []
    for n, r in enumerate(rows):
        steps = [{**s, "step_id": f"{k}-{s['step_id']}"} for k in range(3) for s in r["steps"]]
        ours.append({**r, "trajectory_id": f"run-{n}", "steps": steps, "meta": {}})
    a, b = tmp / "banking.jsonl", tmp / "ours.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b.write_text("".join(json.dumps(r) + "\n" for r in ours))
    return a, b


def test_the_trajectory_verdict_is_refitted_and_nothing_else(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = _files(small_agentdojo, tmp_path)
    out = tmp_path / "refit.json"
    bundles = bundle_digests(tiny_policy)
    assert main(["calibrate", "--runs", str(a), str(b), "--policy", str(tiny_policy),
                 "--out", str(out), "--no-review", "--form", "null"]) == 0
    assert bundle_digests(out) == bundles  # the same model files, byte for byte
    err = capsys.readouterr().err
    assert "trajectory verdict (null, threshold by domain" in err and "each domain left out" in err
    old = CalibratedPolicy.from_dict(json.loads(tiny_policy.read_text()))
    new = CalibratedPolicy.from_dict(json.loads(out.read_text()))
    assert new.data == old.data and new.config == old.config
    assert new.block_threshold == old.block_threshold
    for g, h in zip(old.gates, new.gates, strict=True):
        assert g.threshold == h.threshold and list(g.combiner.coef_) == list(h.combiner.coef_)
    assert new.trajectory is not None and new.trajectory.features == ("null_max", "null_top2")
    assert new.trajectory != old.trajectory
    report = new.metrics["trajectory_refit"]
    assert set(report["domains"]) == {"agentdojo/banking", "ours"}
    assert set(report["lodo"]) == {f"{f}/{t}" for f in ("legacy", "max", "null", "null_max")
                                   for t in ("pooled", "domain")}
    # monitor screen with the new policy flags what the report says it flags on these runs
    flagged, harmful = [], []
    for f in (a, b):
        dst = tmp_path / f"{f.stem}.screened.jsonl"
        assert main(["screen", str(f), "--out", str(dst), "--policy", str(out),
                     "--no-review"]) == 0
        flagged += [json.loads(x)["flagged"] for x in dst.read_text().splitlines()]
        harmful += [json.loads(x)["label"] == 1 for x in f.read_text().splitlines()]
    after = report["after"]
    assert after["runs"] == len(flagged) and after["harmful"] == sum(harmful)
    # (within one run: the threshold sits just above a benign run's score, and monitor
    # screen batches steps otherwise, which moves scores in their last digits)
    benign = [fl for fl, h in zip(flagged, harmful, strict=True) if not h]
    assert abs(sum(benign) - after["benign_flagged"] * len(benign)) <= 1
    caught = sum(fl for fl, h in zip(flagged, harmful, strict=True) if h)
    assert abs(caught - after["recall"] * sum(harmful)) <= 1


def test_runs_without_labels_or_from_a_test_split_are_one_sentence(
    small_agentdojo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = next(json.loads(x) for x in (small_agentdojo / "trajectories.jsonl").open())
    src = tmp_path / "unlabelled.jsonl"
    steps = [{**s, "label": None} for s in row["steps"]]
    src.write_text(json.dumps({**row, "label": None, "steps": steps}) + "\n")
    args = ["calibrate", "--policy", str(tmp_path / "none.json"), "--out", str(tmp_path / "o")]
    assert main([*args, "--runs", str(src)]) == 2
    err = capsys.readouterr().err
    assert "has no label" in err and row["trajectory_id"] in err
    assert len(err.strip().splitlines()) == 1
    assert main([*args, "--runs", str(src), "--split", "test_slack"]) == 2
    err = capsys.readouterr().err
    assert "held out" in err and len(err.strip().splitlines()) == 1


def test_the_command_offers_every_form_the_build_computes() -> None:
    """`--form` lists its choices without importing numpy (the CLI stays light): they are
    the forms monitor.trajectory computes."""
    import argparse

    from monitor.cli.screen import add_parser
    from monitor.trajectory import FORMS

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    [form] = [a for a in parser._subparsers._group_actions[0].choices["calibrate"]._actions
              if "--form" in a.option_strings]
    assert set(form.choices) == set(FORMS)
