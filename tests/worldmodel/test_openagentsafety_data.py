"""The OpenAgentSafety builder on the shipped file (../shared/data/openagentsafety/
train.jsonl, seconds)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from monitor.cli.main import main
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
from worldmodel.datasets.openagentsafety.build import (
    MAX_CHARS,
    SHIPPED_SOURCE,
    build_openagentsafety,
)

pytestmark = pytest.mark.skipif(
    not SHIPPED_SOURCE.is_file(),
    reason=f"the shipped OpenAgentSafety file is not at {SHIPPED_SOURCE}",
)


@pytest.fixture(scope="module")
def source() -> dict[str, Trajectory]:
    return read_source(SHIPPED_SOURCE, "openagentsafety/")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_into(tmp_path_factory, build_openagentsafety, SHIPPED_SOURCE)


def test_every_step_is_one_transition_labelled_as_its_trajectory(
    built: Built, source: dict[str, Trajectory]
) -> None:
    _, manifest, transitions = built
    by_traj = by_trajectory(transitions)
    assert len(by_traj) == 507 and set(by_traj) == set(source)
    assert Counter(source[i].label for i in by_traj) == {1: 176, 0: 331}
    assert len(transitions) == 4826 == len({t.transition_id for t in transitions})
    for tid, steps in by_traj.items():
        traj = source[tid]
        assert {t.label for t in steps} == {traj.label}
        assert sorted(t.index for t in steps) == list(range(len(traj.steps)))
        for t in steps:
            assert t.meta["label_level"] == "trajectory"
            assert t.meta["trajectory_label"] == traj.label
            for key in ("judge_label", "reached_risk", "agent_model", "task_id", "unsafe_behavior"):
                assert t.meta[key] == traj.meta[key]
            assert t.category is None and t.injected == 0
    judged = Counter(steps[0].meta["judge_label"] for steps in by_traj.values())
    assert judged == {-1: 204, 0: 127, 1: 13, 2: 163}
    counts = manifest.counts
    assert set(counts) == {"train", "val"} and manifest.held_out_splits == []
    assert sum(c["trajectories"] for c in counts.values()) == 507
    assert sum(c["harmful"] for c in counts.values()) == sum(t.label for t in transitions)
    assert manifest.builder_args["domains"]["openagentsafety"]["unsafe"] == 176
    assert "(github:sani903/OpenAgentSafety 7528288)" in manifest.source


def test_a_transition_holds_the_steps_texts_and_call_long_ones_cut(
    built: Built, source: dict[str, Trajectory]
) -> None:
    out, manifest, transitions = built
    assert 0 < sum(t.tool is None for t in transitions) < len(transitions)  # plain messages
    for t in transitions[::5]:
        assert_holds_its_step(t, source[t.trajectory_id], MAX_CHARS)
    # the 1.1 MB page is cut to its head and says by how much, here and in the trajectories
    longest = max(
        (s for traj in source.values() for s in traj.steps if s.result),
        key=lambda s: len(s.result.text if s.result else ""),
    )
    full = longest.result.text if longest.result else ""
    assert len(full) > 1_000_000
    head = full[:MAX_CHARS]
    cut = [t for t in transitions if t.next_observation.text.startswith(head)]
    marker = f"\n[... {len(full) - MAX_CHARS} characters cut]"
    assert cut and all(t.next_observation.text == head + marker for t in cut)
    limit = MAX_CHARS + len("\n[... 9999999 characters cut]")
    for t in transitions:
        texts = [t.observation.text, t.action_text, t.next_observation.text, t.task]
        texts += [x for pair in t.history for x in pair]
        assert max(map(len, texts)) <= limit
    for traj in read_jsonl(out / "trajectories.jsonl", Trajectory):
        for s in traj.steps:
            assert len(s.result.text if s.result else "") <= limit
            arguments = s.action.tool.arguments if s.action.tool else {}
            assert max(map(len, strings_in(arguments)), default=0) <= limit
    assert manifest.builder_args["max_chars"] == MAX_CHARS
    assert manifest.builder_args["domains"]["openagentsafety"]["texts_cut"] > 0
    assert f"{MAX_CHARS:,} characters" in manifest.how


def test_one_domain_and_a_task_never_straddles_the_splits(built: Built) -> None:
    out, manifest, transitions = built
    splits_of: dict[str, set[str]] = defaultdict(set)
    for t in transitions:
        assert domain_of(t) == "openagentsafety" == t.meta["domain"]
        assert t.group == f"openagentsafety/{t.meta['task_id']}"
        splits_of[t.meta["task_id"]].add(t.split)
    assert len(splits_of) == 168 and all(len(s) == 1 for s in splits_of.values())
    val_tasks = sorted(task for task, s in splits_of.items() if s == {"val"})
    assert len(val_tasks) == round(168 * 0.2) and manifest.builder_args["val_groups"] == val_tasks
    runs_per_task = Counter(t.meta["task_id"] for t in transitions if t.index == 0)
    assert max(runs_per_task.values()) == 4  # several models' runs of one task, one side
    for traj in read_jsonl(out / "trajectories.jsonl", Trajectory):
        assert traj.meta["domain"] == "openagentsafety"
        assert traj.meta["split"] in splits_of[traj.meta["task_id"]]
        assert traj.meta["group"] == f"openagentsafety/{traj.meta['task_id']}"


def strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [x for v in value for x in strings_in(v)] if isinstance(value, list) else []


BREAKS: dict[str, Break] = {
    **COMMON_BREAKS,
    "no task_id": (lambda d: d["meta"].pop("task_id"), "'meta.task_id': required key is missing"),
    "unlabelled": (lambda d: d.update(label=None), "'label': the trajectory is unlabelled"),
}


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_malformed_line_is_refused_in_one_sentence_naming_it(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused_naming_line_2(
        build_openagentsafety, "openagentsafety", SHIPPED_SOURCE, BREAKS[how], tmp_path, capsys
    )


def test_cli_builds_under_vigil_home_and_names_a_missing_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VIGIL_HOME", str(tmp_path))
    monkeypatch.delenv("VIGIL_OPENAGENTSAFETY", raising=False)
    assert main(["worldmodel", "build-data", "openagentsafety"]) == 0
    out = tmp_path / "data" / "openagentsafety"
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out and "train:" in captured.out and "val:" in captured.out
    assert captured.err.startswith("openagentsafety: wrote ")  # the progress line
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["name"] == "openagentsafety"
    assert sum(c["trajectories"] for c in manifest["counts"].values()) == 507

    missing = tmp_path / "nowhere.jsonl"
    monkeypatch.setenv("VIGIL_OPENAGENTSAFETY", str(missing))
    assert main(["worldmodel", "build-data", "openagentsafety"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "--source" in err and len(err.strip().splitlines()) == 1
