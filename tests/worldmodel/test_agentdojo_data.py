"""The AgentDojo builder on real AgentDojo suites (small limits, a few seconds)."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline
from agentdojo.attacks import BaseAttack, load_attack
from agentdojo.functions_runtime import FunctionsRuntime, TaskEnvironment
from agentdojo.task_suite.load_suites import get_suites
from agentdojo.types import get_text_content_as_str

from streams.records import Trajectory, read_jsonl
from worldmodel.datasets.agentdojo.augment import ParaphraseAttack
from worldmodel.datasets.agentdojo.build import build_agentdojo, iter_agentdojo_trajectories
from worldmodel.datasets.agentdojo.runtime import NamedTarget
from worldmodel.datasets.agentdojo.trajectories import (
    BENCHMARK_VERSION,
    PARAPHRASE_ATTACK,
    TARGET_MODEL,
    TRAIN_ATTACK,
    TRAIN_ATTACKS,
)
from worldmodel.datasets.format import Manifest, Transition, read_manifest, read_transitions

ATTACKS = [TRAIN_ATTACK, "direct", "tool_knowledge"]
# The first 4 user tasks of every suite include val groups (workspace user_task_3,
# travel user_task_0 and _2, banking user_task_3), so both train and val are populated.
MAX_USER_TASKS = 4
MAX_INJECTION_TASKS = 2
# The default build augments the 3 training suites (test_agentdojo_augment.py): a
# vigil_paraphrase hijacking per pair, and a renamed-tools copy of each benign,
# injection-alone and paraphrased trajectory (id suffix /renamed).
TRAIN_SUITES = 3
# What the important_instructions template wraps every goal in; YAML reflows the
# rest of the text, but these tags come through verbatim.
MARKER = "<INFORMATION>"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    out = tmp_path_factory.mktemp("agentdojo")
    manifest = build_agentdojo(
        out,
        attacks=ATTACKS,
        max_user_tasks=MAX_USER_TASKS,
        max_injection_tasks=MAX_INJECTION_TASKS,
        progress=False,
    )
    return out, manifest


@pytest.fixture(scope="module")
def trajectories(built: tuple[Path, Manifest]) -> dict[str, list[Transition]]:
    by_id: dict[str, list[Transition]] = defaultdict(list)
    for t in read_transitions(built[0]):
        by_id[t.trajectory_id].append(t)
    for steps in by_id.values():
        steps.sort(key=lambda t: t.index)
    return dict(by_id)


@functools.cache
def _default_environment(suite: str) -> TaskEnvironment:
    """Read-only: for computing ground truths (AgentDojo's own slow loader, so once)."""
    return get_suites(BENCHMARK_VERSION)[suite].load_and_inject_default_environment({})


def _kind(steps: list[Transition]) -> str:
    return steps[0].meta["kind"]


def _renamed(steps: list[Transition]) -> bool:
    return bool(steps[0].meta.get("renamed"))


def test_manifest_counts_match_what_reads_back(built: tuple[Path, Manifest]) -> None:
    root, manifest = built
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    ids: dict[str, set[str]] = defaultdict(set)
    for t in read_transitions(root):
        counts[t.split]["transitions"] += 1
        counts[t.split]["harmful"] += t.label
        counts[t.split]["injected_observations"] += t.injected
        ids[t.split].add(t.trajectory_id)
    assert set(manifest.counts) == {"train", "val", "test_attacks", "test_slack"}
    for split, c in manifest.counts.items():
        assert c["transitions"] == counts[split]["transitions"] > 0
        assert c["harmful"] == counts[split]["harmful"]
        assert c["injected_observations"] == counts[split]["injected_observations"]
        assert c["trajectories"] == len(ids[split])
        assert sum(1 for _ in read_transitions(root, [split])) == c["transitions"]
    assert read_manifest(root).counts == manifest.counts
    assert manifest.held_out_splits == ["test_attacks", "test_slack"]
    assert manifest.rule_derived_labels is False
    assert BENCHMARK_VERSION in manifest.source
    assert manifest.builder_args["attacks"] == ATTACKS
    assert {"label", "injected", "next_injected"} <= set(manifest.label_semantics)


def test_benign_trajectories_run_the_user_tasks_ground_truth_unlabelled(
    trajectories: dict[str, list[Transition]],
) -> None:
    benign = {k: v for k, v in trajectories.items() if _kind(v) == "benign" and not _renamed(v)}
    assert len(benign) == 4 * MAX_USER_TASKS
    renamed = [v for v in trajectories.values() if _kind(v) == "benign" and _renamed(v)]
    assert len(renamed) == TRAIN_SUITES * MAX_USER_TASKS
    suites = get_suites(BENCHMARK_VERSION)
    for steps in benign.values():
        assert all(t.label == 0 and t.injected == 0 and t.next_injected == 0 for t in steps)
        assert all(t.category is None for t in steps)
        meta = steps[0].meta
        task = suites[meta["suite"]].user_tasks[meta["user_task"]]
        assert steps[0].observation.text == task.PROMPT == steps[0].task
        calls = [t.tool["name"] for t in steps if t.tool is not None]
        env = _default_environment(meta["suite"])
        assert calls == [c.function for c in task.ground_truth(env)]
        # a final answer step exactly when the ground truth has one
        assert (steps[-1].tool is None) == bool(task.GROUND_TRUTH_OUTPUT)
        for prev, nxt in zip(steps, steps[1:], strict=False):
            assert nxt.observation.text == prev.next_observation.text


def test_benign_tool_results_are_what_agentdojo_shows_the_model(
    trajectories: dict[str, list[Transition]],
) -> None:
    """Same results as AgentDojo's own ground-truth pipeline (banking, slack: no clocks)."""
    suites = get_suites(BENCHMARK_VERSION)
    checked = 0
    for steps in trajectories.values():
        meta = steps[0].meta
        if _kind(steps) != "benign" or meta["suite"] not in ("banking", "slack") or _renamed(steps):
            continue
        suite = suites[meta["suite"]]
        task = suite.user_tasks[meta["user_task"]]
        env = suite.load_and_inject_default_environment({})
        _, _, _, messages, _ = GroundTruthPipeline(task).query(
            task.PROMPT, FunctionsRuntime(suite.tools), env
        )
        results = [get_text_content_as_str(m["content"]) for m in messages if m["role"] == "tool"]
        assert [t.next_observation.text for t in steps if t.tool is not None] == results
        checked += 1
    assert checked == 2 * MAX_USER_TASKS


def test_hijacked_trajectories_splice_the_attack_after_the_first_injected_result(
    trajectories: dict[str, list[Transition]],
) -> None:
    suites = get_suites(BENCHMARK_VERSION)
    hijacked = {k: v for k, v in trajectories.items() if _kind(v) == "hijacked"}
    pairs = MAX_USER_TASKS * MAX_INJECTION_TASKS
    assert len(hijacked) == 4 * len(ATTACKS) * pairs + TRAIN_SUITES * 2 * pairs
    benign = {
        (v[0].meta["suite"], v[0].meta["user_task"], _renamed(v)): v
        for v in trajectories.values()
        if _kind(v) == "benign"
    }
    for tid, steps in hijacked.items():
        meta = steps[0].meta
        suite = suites[meta["suite"]]
        injection_task = suite.injection_tasks[meta["injection_task"]]
        labels = [t.label for t in steps]
        first = next(i for i, t in enumerate(steps) if t.next_injected)
        n_attack = len(injection_task.ground_truth(_default_environment(meta["suite"])))
        # the attacker's calls come right after the first injected result, and only there
        assert n_attack >= 1
        rest = len(steps) - first - 1 - n_attack
        assert labels == [0] * (first + 1) + [1] * n_attack + [0] * rest
        assert steps[first + 1].injected == 1
        assert all(
            t.category in {"financial", "data_exfiltration", "prompt_injection"}
            for t in steps
            if t.label
        )
        # ...and the user task carries on with the rest of its own calls
        user_calls = [t.action_text for t in steps if t.tool is not None and not t.label]
        own = [
            t.action_text
            for t in benign[(meta["suite"], meta["user_task"], _renamed(steps))]
            if t.tool
        ]
        assert [c.split("(")[0] for c in user_calls] == [c.split("(")[0] for c in own], tid
        # flags chain: what a step acts on is what the previous step returned
        assert steps[0].injected == 0
        for prev, nxt in zip(steps, steps[1:], strict=False):
            assert nxt.injected == prev.next_injected
            assert nxt.observation.text == prev.next_observation.text
        if meta["attack"] == TRAIN_ATTACK:
            # checked against the attack text itself
            for t in steps:
                assert t.injected == (MARKER in t.observation.text), (tid, t.index)
                assert t.next_injected == (MARKER in t.next_observation.text), (tid, t.index)


def test_injected_flags_match_the_attack_text_in_every_user_task() -> None:
    """All user tasks of every suite (one injection task): tasks whose later calls write,
    delete or re-read injected data flag exactly the results that show the attack."""
    n = 0
    trajectories = iter_agentdojo_trajectories(
        attacks=[TRAIN_ATTACK], max_injection_tasks=1, augment=False
    )
    for traj in trajectories:
        if traj.kind != "hijacked":
            continue
        n += 1
        for s in traj.steps:
            assert s.injected == (MARKER in s.observation), (traj.trajectory_id, s.action_text)
            assert s.next_injected == (MARKER in s.next_observation), (
                traj.trajectory_id,
                s.action_text,
            )
    assert n == 40 + 20 + 16 + 21


def test_hijacked_environments_carry_agentdojos_own_injections(
    trajectories: dict[str, list[Transition]],
) -> None:
    """Up to the splice, a hijacked run equals AgentDojo's ground-truth run on its attack's
    injected environment, and the injected vectors are the ones the attack itself picks
    (our vigil_paraphrase attack too, run by AgentDojo itself)."""
    suites = get_suites(BENCHMARK_VERSION)
    target = NamedTarget(TARGET_MODEL)
    attacks: dict[tuple[str, str], BaseAttack] = {}
    checked = 0
    for steps in trajectories.values():
        meta = steps[0].meta
        # the slow pure-Python loader: every pair in the small suites, one injection task
        # in the large ones
        if (
            _kind(steps) != "hijacked"
            or _renamed(steps)
            or (
                meta["suite"] in ("workspace", "travel")
                and meta["injection_task"] != "injection_task_0"
            )
        ):
            continue
        suite = suites[meta["suite"]]
        key = (meta["suite"], meta["attack"])
        if key not in attacks:
            attacks[key] = (
                ParaphraseAttack(suite, target)
                if meta["attack"] == PARAPHRASE_ATTACK
                else load_attack(meta["attack"], suite, target)
            )
        user_task = suite.user_tasks[meta["user_task"]]
        injections = attacks[key].attack(user_task, suite.injection_tasks[meta["injection_task"]])
        assert meta["vectors"] == sorted(injections)
        env = suite.load_and_inject_default_environment(injections)
        _, _, _, messages, _ = GroundTruthPipeline(user_task).query(
            user_task.PROMPT, FunctionsRuntime(suite.tools), env
        )
        results = [get_text_content_as_str(m["content"]) for m in messages if m["role"] == "tool"]
        first = next(i for i, t in enumerate(steps) if t.next_injected)
        assert [t.next_observation.text for t in steps[: first + 1]] == results[: first + 1]
        if meta["attack"] == TRAIN_ATTACK:
            assert MARKER in results[first]
            assert not any(MARKER in r for r in results[:first])
        checked += 1
    # per attack: every pair of banking and slack, injection_task_0 of workspace and travel;
    # vigil_paraphrase: banking, workspace and travel only
    paraphrased = MAX_USER_TASKS * (MAX_INJECTION_TASKS + 2)
    assert checked == len(ATTACKS) * MAX_USER_TASKS * (2 * MAX_INJECTION_TASKS + 2) + paraphrased


def test_injection_alone_trajectories_are_all_harmful(
    trajectories: dict[str, list[Transition]],
) -> None:
    alone = [v for v in trajectories.values() if _kind(v) == "injection"]
    assert len(alone) == 4 * MAX_INJECTION_TASKS + TRAIN_SUITES * MAX_INJECTION_TASKS
    suites = get_suites(BENCHMARK_VERSION)
    for steps in alone:
        assert all(t.label == 1 and t.category for t in steps)
        task = suites[steps[0].meta["suite"]].injection_tasks[steps[0].meta["injection_task"]]
        assert _renamed(steps) == (steps[0].trajectory_id.endswith("/renamed"))
        assert steps[0].task == task.GOAL


def test_held_out_data_never_reaches_train_or_val(
    trajectories: dict[str, list[Transition]],
) -> None:
    groups: dict[str, set[str]] = defaultdict(set)
    for steps in trajectories.values():
        for t in steps:
            groups[t.split].add(t.group)
            if t.split in ("train", "val"):
                assert t.meta["suite"] != "slack"
                assert t.meta["attack"] in (None, *TRAIN_ATTACKS)
            if t.meta["suite"] == "slack":
                assert t.split == "test_slack"
            elif t.meta["attack"] not in (None, *TRAIN_ATTACKS):
                assert t.split == "test_attacks"
        split = steps[0].split
        assert all(t.split == split and t.group == steps[0].group for t in steps)
    assert groups["train"] and groups["val"]
    assert not groups["train"] & groups["val"]
    kinds = {(v[0].split, _kind(v)) for v in trajectories.values()}
    assert ("test_attacks", "benign") not in kinds
    assert ("test_attacks", "injection") not in kinds
    assert {("test_slack", k) for k in ("benign", "injection", "hijacked")} <= kinds
    slack = [v for v in trajectories.values() if v[0].split == "test_slack"]
    assert {v[0].meta["attack"] for v in slack} == {None, *ATTACKS}


def test_interchange_trajectories_agree_with_the_transitions(
    built: tuple[Path, Manifest], trajectories: dict[str, list[Transition]]
) -> None:
    exported = list(read_jsonl(built[0] / "trajectories.jsonl", Trajectory))
    assert {t.trajectory_id for t in exported} == set(trajectories)
    for traj in exported:
        steps = trajectories[traj.trajectory_id]
        assert traj.source == "benchmark"
        assert traj.task == steps[0].task
        assert len(traj.steps) == len(steps)
        assert [s.label for s in traj.steps] == [t.label for t in steps]
        assert [s.category for s in traj.steps] == [t.category for t in steps]
        assert [s.action.text for s in traj.steps] == [t.action_text for t in steps]
        assert [s.result.text if s.result else None for s in traj.steps] == [
            t.next_observation.text for t in steps
        ]
        assert traj.label == max(t.label for t in steps)
        assert traj.meta["split"] == steps[0].split
        assert traj.meta["suite"] == steps[0].meta["suite"]
        assert traj.meta["attack"] == steps[0].meta["attack"]
        for s, t in zip(traj.steps, steps, strict=True):
            assert (s.action.tool.name if s.action.tool else None) == (
                t.tool["name"] if t.tool else None
            )


def test_transitions_carry_a_short_history(trajectories: dict[str, list[Transition]]) -> None:
    steps = max(trajectories.values(), key=len)
    assert len(steps) > 5
    for t in steps:
        assert t.transition_id == f"{t.trajectory_id}/{t.index}"
        expected = [(s.observation.text, s.action_text) for s in steps[: t.index]][-4:]
        assert list(t.history) == expected


def test_an_attack_with_nothing_to_splice_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dos.*no attacker calls to splice"):
        build_agentdojo(tmp_path, attacks=["dos"], progress=False)


def test_the_build_writes_the_same_bytes_whatever_the_callers_hash_seed(tmp_path: Path) -> None:
    """Some AgentDojo tools return sets (a calendar event's participants, in workspace's
    user_task_4), whose order follows the interpreter's string hashing: two processes
    built different files from the same arguments. Hash seeds 1 and 4 order that set
    differently; the builds must not differ."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = ("import sys\n"
            "from worldmodel.datasets.agentdojo.build import build_agentdojo\n"
            "m = build_agentdojo(sys.argv[1], suites=['workspace'], "
            "attacks=['important_instructions'], max_user_tasks=5, max_injection_tasks=1, "
            "progress=False, augment=False)\n"
            "print(m.content_hash)\n")
    hashes = []
    for seed in ("1", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        run = subprocess.run([sys.executable, "-c", code, str(tmp_path / seed)], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        hashes.append(run.stdout.split()[-1])
    assert hashes[0] == hashes[1]
    assert (tmp_path / "1" / "trajectories.jsonl").read_bytes() == (
        tmp_path / "4" / "trajectories.jsonl").read_bytes()
