"""Training augmentation of the AgentDojo build: our own injection wordings, renamed tools.

Real AgentDojo suites, small limits (two builds of a few seconds each): banking and
travel train, slack held out, ``direct`` for ``test_attacks``.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from difflib import SequenceMatcher
from pathlib import Path

import pytest
from agentdojo.attacks.attack_registry import ATTACKS as ATTACK_REGISTRY
from agentdojo.task_suite.load_suites import get_suites

from monitor.cli.main import main
from worldmodel.datasets.agentdojo.augment import WORDINGS
from worldmodel.datasets.agentdojo.build import build_agentdojo
from worldmodel.datasets.agentdojo.runtime import NamedTarget
from worldmodel.datasets.agentdojo.trajectories import (
    BENCHMARK_VERSION,
    PARAPHRASE_ATTACK,
    TARGET_MODEL,
    TRAIN_ATTACK,
    TRAIN_SUITES,
)
from worldmodel.datasets.format import Manifest, Transition, read_manifest, read_transitions

SUITES = ["banking", "travel", "slack"]
ATTACKS = [TRAIN_ATTACK, "direct"]
LIMITS = {"max_user_tasks": 6, "max_injection_tasks": 3}
HELD_OUT = ("test_attacks", "test_slack")
# What the important_instructions template wraps every goal in (verbatim through YAML).
MARKER = "<INFORMATION>"


def _build(out: Path, augment: bool) -> Manifest:
    return build_agentdojo(
        out, suites=SUITES, attacks=ATTACKS, augment=augment, progress=False, **LIMITS
    )


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    out = {a: tmp_path_factory.mktemp(f"agentdojo-augment-{a}") for a in (True, False)}
    for augment, path in out.items():
        _build(path, augment)
    return out


@pytest.fixture(scope="module")
def trajectories(builds: dict[bool, Path]) -> dict[str, list[Transition]]:
    by_id: dict[str, list[Transition]] = defaultdict(list)
    for t in read_transitions(builds[True]):
        by_id[t.trajectory_id].append(t)
    return {k: sorted(v, key=lambda t: t.index) for k, v in by_id.items()}


def _templates() -> dict[str, str]:
    """Every registered AgentDojo attack's fixed text (the one asking on stdin aside)."""
    suite = get_suites(BENCHMARK_VERSION)["banking"]
    out: dict[str, str] = {}
    for name, cls in ATTACK_REGISTRY.items():
        if name == "manual":
            continue
        text = getattr(cls, "_JB_STRING", None) or getattr(cls, "_DOS_STRING", None)
        if text is None:
            text = cls(suite, NamedTarget(TARGET_MODEL)).jailbreak  # type: ignore[attr-defined]
        out[name] = text
    return out


def _unfolded(text: str) -> str:
    """Text as shown, with YAML's escaped line breaks (a backslash ending a line, and one
    escaping the next line's leading space) joined, and whitespace runs made one space."""
    return " ".join(re.sub(r"\\\n[ \t]*(\\(?= ))?", "", text).split())


def _letters(text: str) -> str:
    """The longest run of ASCII letters and spaces: survives YAML dumping verbatim."""
    runs = re.findall(r"[A-Za-z][A-Za-z ]*[A-Za-z]", " ".join(text.split()))
    return max(runs, key=len)


def test_the_wordings_are_ours_not_agentdojo_templates() -> None:
    templates = _templates()
    assert {"direct", "ignore_previous", "system_message", "injecagent", "tool_knowledge"} < set(
        templates
    )
    assert len(WORDINGS) >= 12 and len(set(WORDINGS)) == len(WORDINGS)
    for wording in WORDINGS:
        assert wording.count("{goal}") == 1 and not re.search(r'["\\]', wording)
        assert wording.format(goal="GOAL").count("GOAL") == 1
        for name, template in templates.items():
            m = SequenceMatcher(None, wording, template, autojunk=False)
            match = m.find_longest_match(0, len(wording), 0, len(template))
            common = wording[match.a : match.a + match.size]
            assert match.size < 16, (name, common)
            # nor any literal piece of a short template, e.g. direct's "TODO:"
            for piece in re.split(r"\{\w+\}", template):
                if len(piece.strip()) >= 5:
                    assert piece.strip().lower() not in wording.lower(), (name, piece)


def test_each_pair_gets_one_of_our_wordings_and_the_flags_follow_its_text(
    trajectories: dict[str, list[Transition]],
) -> None:
    pairs: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    used: set[int] = set()
    for steps in trajectories.values():
        meta = steps[0].meta
        if meta["kind"] != "hijacked" or meta.get("renamed"):
            continue
        pairs[meta["attack"]].add((meta["suite"], meta["user_task"], meta["injection_task"]))
        if meta["attack"] != PARAPHRASE_ATTACK:
            assert "wording" not in meta
            continue
        used.add(meta["wording"])
        fragment = _letters(WORDINGS[meta["wording"]].split("{goal}")[0])
        for t in steps:
            seen = _unfolded(t.observation.text)
            assert MARKER not in seen
            assert t.injected == (fragment in seen), (t.transition_id, fragment)
        assert any(t.injected for t in steps) and any(t.label for t in steps)
    train_pairs = {p for p in pairs[TRAIN_ATTACK] if p[0] in TRAIN_SUITES}
    assert pairs[PARAPHRASE_ATTACK] == train_pairs
    assert len(train_pairs) == 2 * 6 * 3
    assert len(used) >= 10  # 36 pairs spread over the wordings


def test_renamed_copies_show_none_of_the_suites_tool_names(
    trajectories: dict[str, list[Transition]],
) -> None:
    suites = get_suites(BENCHMARK_VERSION)
    originals = {s: {f.name for f in suites[s].tools} for s in TRAIN_SUITES}
    renamed = [v for v in trajectories.values() if v[0].meta.get("renamed")]
    assert renamed
    n_calls = 0
    for steps in renamed:
        names = originals[steps[0].meta["suite"]]
        for t in steps:
            assert not any(name in t.action_text for name in names), t.action_text
            for h in t.history:
                assert not any(name in h[1] for name in names)
            if t.tool is not None:
                n_calls += 1
                assert t.tool["name"] not in names
                assert t.action_text.startswith(t.tool["name"] + "(")
    assert n_calls > 100


def _rename(names: dict[str, str], text: str) -> str:
    """Whole-identifier function names in ``text`` replaced by their new names."""
    pattern = r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(1)], text)


def _keys(action_text: str) -> list[str]:
    return re.findall(r"(?:\(|, )(\w+)=", action_text)


def test_a_renamed_copy_is_its_original_under_one_consistent_map(
    builds: dict[bool, Path], trajectories: dict[str, list[Transition]]
) -> None:
    recorded = read_manifest(builds[True]).builder_args["augment"]["renamings"]
    functions: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    keys: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    kinds: set[str] = set()
    for tid, copy in trajectories.items():
        if not tid.endswith("/renamed"):
            continue
        original = trajectories[tid.removesuffix("/renamed")]
        suite = original[0].meta["suite"]
        kinds.add(original[0].meta["kind"])
        assert copy[0].meta == {**original[0].meta, "renamed": True}
        assert len(copy) == len(original)
        for c, o in zip(copy, original, strict=True):
            assert (c.label, c.injected, c.next_injected, c.category) == (
                o.label,
                o.injected,
                o.next_injected,
                o.category,
            )
            assert (c.split, c.group, c.task) == (o.split, o.group, o.task)
            renamed = _rename(recorded[suite]["functions"], o.next_observation.text)
            assert c.next_observation.text == renamed
            if o.tool is None:
                assert c.tool is None and c.action_text == o.action_text
                continue
            assert c.tool is not None
            functions[suite][o.tool["name"]].add(c.tool["name"])
            # argument keys pair up in the order the action texts write them
            pairs = dict(zip(_keys(o.action_text), _keys(c.action_text), strict=True))
            assert sorted(pairs) == sorted(o.tool["arguments"])
            assert c.tool["arguments"] == {pairs[k]: v for k, v in o.tool["arguments"].items()}
            for old, new in pairs.items():
                assert old != new
                keys[suite][old].add(new)
    assert kinds == {"benign", "injection", "hijacked"}
    for suite in ("banking", "travel"):
        for mapping in (functions[suite], keys[suite]):
            assert all(len(images) == 1 for images in mapping.values()), mapping
            images = [next(iter(i)) for i in mapping.values()]
            assert len(set(images)) == len(images)  # one-to-one
        # the manifest records the map that was applied
        for name, renamed_as in functions[suite].items():
            assert {recorded[suite]["functions"][name]} == renamed_as
        for key, renamed_as in keys[suite].items():
            assert {recorded[suite]["arguments"][key]} == renamed_as


def test_augmented_data_lands_only_in_train_and_val_of_the_training_suites(
    builds: dict[bool, Path], trajectories: dict[str, list[Transition]]
) -> None:
    augmented = 0
    for steps in trajectories.values():
        meta = steps[0].meta
        if meta.get("renamed") or meta["attack"] == PARAPHRASE_ATTACK:
            augmented += 1
            assert meta["suite"] in TRAIN_SUITES
            assert {t.split for t in steps} <= {"train", "val"}
    # per training suite: 18 paraphrased pairs, and a renamed copy of each of those and of
    # the 6 benign and 3 injection-alone trajectories
    assert augmented == 2 * (18 + (18 + 6 + 3))
    plain = read_manifest(builds[False])
    aug = read_manifest(builds[True])
    assert plain.builder_args["augment"] is False
    assert PARAPHRASE_ATTACK not in plain.how and PARAPHRASE_ATTACK in aug.how
    assert aug.builder_args["augment"]["wordings"] == list(WORDINGS)
    assert set(aug.builder_args["augment"]["renamings"]) == {"banking", "travel"}
    for split in ("train", "val"):
        extra = aug.counts[split]["trajectories"] - plain.counts[split]["trajectories"]
        assert extra > 0
    assert augmented == sum(
        aug.counts[s]["trajectories"] - plain.counts[s]["trajectories"] for s in ("train", "val")
    )


def _lines(path: Path, splits: tuple[str, ...]) -> list[bytes]:
    return [
        line
        for line in path.read_bytes().splitlines()
        if (json.loads(line).get("split") or json.loads(line)["meta"]["split"]) in splits
    ]


def test_held_out_splits_are_byte_identical_with_and_without_augmentation(
    builds: dict[bool, Path],
) -> None:
    for name in ("transitions.jsonl", "trajectories.jsonl"):
        held = [_lines(builds[a] / name, HELD_OUT) for a in (True, False)]
        assert held[0] and held[0] == held[1]
        # and the un-augmented training data is all still there, unchanged
        aug, plain = (set(_lines(builds[a] / name, ("train", "val"))) for a in (True, False))
        assert plain < aug
    manifests = [read_manifest(builds[a]) for a in (True, False)]
    assert all(manifests[0].counts[s] == manifests[1].counts[s] for s in HELD_OUT)


def test_the_cli_augments_by_default_and_not_with_no_augment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--suites", "banking", "--max-user-tasks", "2", "--max-injection-tasks", "1"]
    for flag, out in (([], tmp_path / "aug"), (["--no-augment"], tmp_path / "plain")):
        cmd = ["worldmodel", "build-data", "agentdojo", "--out", str(out), *args, *flag]
        assert main(cmd) == 0
        assert "train" in capsys.readouterr().out
    ids = {a: {t.trajectory_id for t in read_transitions(tmp_path / a)} for a in ("aug", "plain")}
    assert ids["plain"] < ids["aug"]
    assert any(i.endswith("/renamed") for i in ids["aug"] - ids["plain"])
    assert any(i.endswith(f"/{PARAPHRASE_ATTACK}") for i in ids["aug"] - ids["plain"])
