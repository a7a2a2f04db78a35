"""The StepShield builder on the shipped file (../shared/data/stepshield/train.jsonl,
seconds)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from monitor.cli.main import main
from monitor.reviewer.train import judge_examples
from streams.records import Trajectory, read_jsonl
from tests.worldmodel.source_checks import (
    COMMON_BREAKS,
    Break,
    Built,
    assert_holds_its_step,
    assert_refused_naming_line_2,
    build_into,
    by_trajectory,
    read_source,
)
from worldmodel.datasets.domains import domain_of
from worldmodel.datasets.stepshield.build import SHIPPED_SOURCE, build_stepshield

pytestmark = pytest.mark.skipif(
    not SHIPPED_SOURCE.is_file(), reason=f"the shipped StepShield file is not at {SHIPPED_SOURCE}"
)

CATEGORIES = {"UFO", "SEC", "RES", "INV", "TST", "DEC"}


@pytest.fixture(scope="module")
def source() -> dict[str, Trajectory]:
    return read_source(SHIPPED_SOURCE, "stepshield/")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_into(tmp_path_factory, build_stepshield, SHIPPED_SOURCE)


def test_every_step_is_one_transition_with_its_step_label(
    built: Built, source: dict[str, Trajectory]
) -> None:
    _, manifest, transitions = built
    by_traj = by_trajectory(transitions)
    assert len(by_traj) == 580 and set(by_traj) == set(source)
    assert len(transitions) == 7248 == len({t.transition_id for t in transitions})
    levels = Counter((t.meta["label_level"], t.label) for t in transitions)
    assert levels == {("step", 0): 5259, ("step", 1): 309, ("after_rogue", 1): 1680}
    for tid, steps in by_traj.items():
        traj = source[tid]
        assert [t.index for t in steps] == list(range(len(traj.steps)))
        first = steps[0].meta["first_rogue_index"]
        if traj.label == 0:  # a clean twin: every step safe
            assert first is None and all(t.label == 0 for t in steps)
            continue
        assert first == traj.meta["first_rogue_index"]
        assert all(t.label == 0 and t.meta["label_level"] == "step" for t in steps[:first])
        assert steps[first].label == 1 and steps[first].category == traj.meta["category"]
        for t, s in zip(steps[first:], traj.steps[first:], strict=True):
            assert t.label == 1
            assert t.meta["label_level"] == ("step" if s.label == 1 else "after_rogue")
    rogue = [t for t in transitions if t.meta["label_level"] == "step" and t.label]
    assert {t.category for t in rogue} == CATEGORIES
    assert all(t.meta["rogue_rationale"] for t in rogue)
    assert all(t.category is None for t in transitions if t.meta["label_level"] == "after_rogue")
    firsts = [steps[0] for steps in by_traj.values()]
    assert Counter(t.meta["trajectory_label"] for t in firsts) == {0: 290, 1: 290}
    assert len({t.meta["pair_id"] for t in firsts}) == 290
    assert {t.meta["severity"] for t in firsts} == {"L1", "L2", "L3"}
    counts = manifest.counts
    assert set(counts) == {"train", "val"} and manifest.held_out_splits == []
    assert sum(c["harmful"] for c in counts.values()) == 309 + 1680
    assert manifest.builder_args["domains"]["stepshield"]["after_rogue_steps"] == 1680


def test_a_transition_holds_the_steps_texts_and_call(
    built: Built, source: dict[str, Trajectory]
) -> None:
    out, manifest, transitions = built
    for t in transitions[::3]:
        assert_holds_its_step(t, source[t.trajectory_id])
    written = {t.trajectory_id: t for t in read_jsonl(out / "trajectories.jsonl", Trajectory)}
    assert set(written) == set(source)
    assert all(written[i].steps == source[i].steps for i in source)  # nothing needed a cut
    assert manifest.builder_args["max_chars"] == 20_000
    assert manifest.builder_args["domains"]["stepshield"]["texts_cut"] == 0


def test_twins_and_same_title_pairs_never_straddle_the_splits(built: Built) -> None:
    out, manifest, transitions = built
    split_of_pair: dict[str, set[str]] = defaultdict(set)
    split_of_title: dict[str, set[str]] = defaultdict(set)
    group_of_pair: dict[str, set[str]] = defaultdict(set)
    for t in transitions:
        assert domain_of(t) == "stepshield" == t.meta["domain"]
        split_of_pair[t.meta["pair_id"]].add(t.split)
        split_of_title[t.meta["title"]].add(t.split)
        group_of_pair[t.meta["pair_id"]].add(t.group)
    assert len(split_of_pair) == 290 and all(len(s) == 1 for s in split_of_pair.values())
    assert len(split_of_title) == 174 and all(len(s) == 1 for s in split_of_title.values())
    # two pairs' twins carry reworded titles: each pair is still one group
    assert all(len(g) == 1 for g in group_of_pair.values())
    groups = {t.group for t in transitions}
    assert len(groups) == 172
    val = {t.group for t in transitions if t.split == "val"}
    assert len(val) == round(172 * 0.2)
    assert sorted(g.removeprefix("stepshield/") for g in val) == manifest.builder_args["val_groups"]
    pairs_per_group = Counter(g for gs in group_of_pair.values() for g in gs)
    assert max(pairs_per_group.values()) >= 10  # "Implement Retry Logic for API Calls"
    for traj in read_jsonl(out / "trajectories.jsonl", Trajectory):
        assert traj.meta["domain"] == "stepshield"
        assert {traj.meta["split"]} == split_of_pair[traj.meta["pair_id"]]


def test_the_judge_takes_no_step_example_after_the_first_rogue_step(built: Built) -> None:
    examples = judge_examples([built[0]], ["train", "val"], hard_negatives=0.0)
    steps = Counter(e.label for e in examples if e.mode == "step")
    assert steps == {0: 5259, 1: 309}  # the 1,680 after_rogue steps are left out
    whole = [e for e in examples if e.mode == "trajectory"]
    assert Counter(e.label for e in whole) == {0: 290, 1: 290}
    assert {e.category for e in whole if e.label} == CATEGORIES


BREAKS: dict[str, Break] = {
    **COMMON_BREAKS,
    "no pair_id": (lambda d: d["meta"].pop("pair_id"), "'meta.pair_id': required key is missing"),
    "null before rogue": (
        lambda d: d["steps"][0].update(label=None),
        "'steps.0.label': null before any rogue step",
    ),
}


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_malformed_line_is_refused_in_one_sentence_naming_it(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused_naming_line_2(
        build_stepshield, "stepshield", SHIPPED_SOURCE, BREAKS[how], tmp_path, capsys
    )


def test_cli_builds_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "stepshield"
    cmd = ["worldmodel", "build-data", "stepshield", "--source", str(SHIPPED_SOURCE)]
    assert main([*cmd, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out and "train:" in captured.out and "val:" in captured.out
    assert captured.err.startswith("stepshield: wrote ")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["name"] == "stepshield"
    assert "(github:glo26/stepshield-review 812a12e)" in manifest["source"]
    assert sum(c["trajectories"] for c in manifest["counts"].values()) == 580
