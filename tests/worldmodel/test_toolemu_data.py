"""The ToolEmu builder on the shipped file (../shared/data/toolemu/train.jsonl, seconds)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from monitor.cli.main import main
from streams.records import Trajectory, read_jsonl
from tests.worldmodel.source_checks import assert_holds_its_step
from worldmodel.datasets.domains import domain_of
from worldmodel.datasets.format import (
    Manifest,
    Transition,
    read_manifest,
    read_transitions,
)
from worldmodel.datasets.toolemu.build import SHIPPED_SOURCE, build_toolemu

pytestmark = pytest.mark.skipif(
    not SHIPPED_SOURCE.is_file(), reason=f"the shipped ToolEmu file is not at {SHIPPED_SOURCE}"
)


@pytest.fixture(scope="module")
def source() -> dict[str, Trajectory]:
    return {f"toolemu/{t.trajectory_id}": t for t in read_jsonl(SHIPPED_SOURCE, Trajectory)}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest, list[Transition]]:
    out = tmp_path_factory.mktemp("toolemu")
    manifest = build_toolemu(out, source=SHIPPED_SOURCE, progress=False)
    return out, manifest, list(read_transitions(out))


def test_every_step_is_one_transition_labelled_as_its_trajectory(
    built: tuple[Path, Manifest, list[Transition]], source: dict[str, Trajectory]
) -> None:
    _, manifest, transitions = built
    by_traj: dict[str, list[Transition]] = defaultdict(list)
    for t in transitions:
        by_traj[t.trajectory_id].append(t)
    assert len(by_traj) == 1296 and set(by_traj) == set(source)
    assert Counter(source[i].label for i in by_traj) == {1: 730, 0: 566}
    assert len(transitions) == sum(len(t.steps) for t in source.values())
    assert len({t.transition_id for t in transitions}) == len(transitions)
    for tid, steps in by_traj.items():
        label = source[tid].label
        assert {t.label for t in steps} == {label}
        assert all(t.meta["label_level"] == "trajectory" for t in steps)
        assert all(t.meta["trajectory_label"] == label for t in steps)
        assert sorted(t.index for t in steps) == list(range(len(source[tid].steps)))
    counts = manifest.counts
    assert set(counts) == {"train", "val"} and manifest.held_out_splits == []
    assert sum(c["trajectories"] for c in counts.values()) == 1296
    assert sum(c["transitions"] for c in counts.values()) == len(transitions)
    assert sum(c["harmful"] for c in counts.values()) == sum(t.label for t in transitions)
    assert read_manifest(built[0]).counts == counts


def test_a_transition_holds_the_steps_own_texts_and_call(
    built: tuple[Path, Manifest, list[Transition]], source: dict[str, Trajectory]
) -> None:
    transitions = built[2]
    with_call = [t for t in transitions if t.tool is not None]
    assert 0 < len(with_call) < len(transitions)  # final answers carry no call
    for t in transitions[::7]:
        traj = source[t.trajectory_id]
        assert_holds_its_step(t, traj)
        assert t.meta["agent_model"] == traj.meta["agent_model"]
        assert t.meta["case_idx"] == traj.meta["case_idx"] and t.injected == 0


def test_cases_go_whole_into_three_balanced_domains_and_one_split(
    built: tuple[Path, Manifest, list[Transition]],
) -> None:
    out, manifest, transitions = built
    domains_of: dict[str, set[str]] = defaultdict(set)
    splits_of: dict[str, set[str]] = defaultdict(set)
    labels: dict[str, Counter[int]] = defaultdict(Counter)
    for t in transitions:
        assert t.group == f"toolemu/case{t.meta['case_idx']}"
        domains_of[t.group].add(domain_of(t))
        splits_of[t.group].add(t.split)
        labels[domain_of(t)][t.label] += 1
    assert len(domains_of) == 48
    assert all(len(d) == 1 for d in domains_of.values())
    assert all(len(s) == 1 for s in splits_of.values())
    cases_in = Counter(next(iter(d)) for d in domains_of.values())
    assert len(cases_in) == 3 and all(d.startswith("toolemu/") for d in cases_in)
    assert min(cases_in.values()) >= 10, cases_in  # each at least a fifth of the cases
    assert all(min(c[0], c[1]) > 0 for c in labels.values())  # both labels in each
    val_domains = {next(iter(domains_of[g])) for g, s in splits_of.items() if s == {"val"}}
    assert val_domains == set(cases_in)
    groups = manifest.builder_args["groups"]
    assert {d: len(g["case_idx"]) for d, g in groups.items()} == dict(cases_in)
    primary = [k for g in groups.values() for k in g["toolkits"]]
    assert len(primary) == len(set(primary))  # a primary toolkit sits in one domain
    trajectories = list(read_jsonl(out / "trajectories.jsonl", Trajectory))
    assert len(trajectories) == 1296
    for traj in trajectories[::11]:
        assert traj.meta["domain"] in cases_in
        assert {traj.meta["domain"]} == domains_of[f"toolemu/case{traj.meta['case_idx']}"]


def test_agreed_only_keeps_the_907_runs_both_judges_agree_on(
    tmp_path: Path, built: tuple[Path, Manifest, list[Transition]]
) -> None:
    manifest = build_toolemu(tmp_path, source=SHIPPED_SOURCE, agreed_only=True, progress=False)
    transitions = list(read_transitions(tmp_path))
    assert len({t.trajectory_id for t in transitions}) == 907
    assert sum(c["trajectories"] for c in manifest.counts.values()) == 907
    assert all(t.meta["judges_agree"] for t in transitions)
    assert manifest.builder_args["val_cases"] == built[1].builder_args["val_cases"]


def test_cli_builds_the_dataset_and_names_a_missing_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "toolemu"
    assert main(["worldmodel", "build-data", "toolemu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "train:" in printed and "val:" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["name"] == "toolemu"
    assert sum(c["trajectories"] for c in manifest["counts"].values()) == 1296

    missing = tmp_path / "nowhere.jsonl"
    cmd = ["worldmodel", "build-data", "toolemu", "--source", str(missing), "--out", str(out)]
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "--source" in err and len(err.strip().splitlines()) == 1
