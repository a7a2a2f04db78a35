"""The MiniWoB++ builder in a real headless Chromium on real MiniWoB tasks (~15 s)."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from streams.records import Trajectory, read_jsonl
from worldmodel.datasets.format import (
    HISTORY,
    Manifest,
    Transition,
    read_manifest,
    read_transitions,
)
from worldmodel.datasets.miniwob.build import DEFAULT_TASKS, build_miniwob
from worldmodel.datasets.miniwob.harm import HARM_RULES, HARM_TASKS, Request, parse_request
from worldmodel.datasets.miniwob.page import VIEW_CHARS

TASKS = ["click-button", "email-inbox-delete", "terminal", "social-media"]
EPISODES = {"scripted": 3, "random": 2, "destructive": 3}
CATEGORIES = {
    "email-inbox-delete": {"destructive_delete"},
    "terminal": {"wrong_file_rm"},
    "social-media": {"wrong_user_block", "wrong_user_mute", "wrong_user_report"},
}
MARK = "VIGIL_MINIWOB_TEST"


def _marked_processes(value: str) -> list[str]:
    """Processes (other than this one) started with MARK=value in their environment."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        if proc.name == str(os.getpid()):
            continue
        try:
            if f"{MARK}={value}".encode() in (proc / "environ").read_bytes():
                found.append(f"{proc.name} {(proc / 'comm').read_text().strip()}")
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest, list[str]]:
    """One small build; also what of its browser was still running a moment after it."""
    out = tmp_path_factory.mktemp("miniwob")
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark  # inherited by chromedriver and Chromium
    try:
        manifest = build_miniwob(
            out, tasks=TASKS, episodes_per_task=EPISODES, seed=0, progress=False
        )
    finally:
        del os.environ[MARK]
    deadline = time.monotonic() + 10
    while (left := _marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return out, manifest, left


@pytest.fixture(scope="module")
def episodes(built: tuple[Path, Manifest, list[str]]) -> dict[str, list[Transition]]:
    by_id: dict[str, list[Transition]] = defaultdict(list)
    for t in read_transitions(built[0]):
        by_id[t.trajectory_id].append(t)
    for steps in by_id.values():
        steps.sort(key=lambda t: t.index)
    return dict(by_id)


def _all(episodes: dict[str, list[Transition]]) -> list[Transition]:
    return [t for steps in episodes.values() for t in steps]


def _pixels(root: Path, rel: str | None) -> np.ndarray:
    assert rel is not None
    return np.asarray(Image.open(root / rel).convert("RGB"))


def test_manifest_counts_what_read_transitions_reads(
    built: tuple[Path, Manifest, list[str]], episodes: dict[str, list[Transition]]
) -> None:
    root, manifest, _ = built
    assert read_manifest(root) == manifest
    assert manifest.rule_derived_labels is True
    assert manifest.source.startswith("miniwob 1.1.0 in chromium ")
    assert "RULE-DERIVED" in manifest.how
    assert set(HARM_RULES) <= set(manifest.label_semantics)
    transitions = _all(episodes)
    for split, counts in manifest.counts.items():
        mine = [t for t in transitions if t.split == split]
        assert counts["transitions"] == len(mine)
        assert counts["harmful"] == sum(t.label for t in mine)
        assert counts["trajectories"] == len({t.trajectory_id for t in mine})
    assert sum(c["transitions"] for c in manifest.counts.values()) == len(transitions)
    assert {t.meta["task"] for t in transitions} == set(TASKS)
    assert manifest.held_out_splits == sorted(s for s in manifest.counts if s.startswith("test"))


def test_every_step_has_native_size_screenshots_and_bounded_views(
    built: tuple[Path, Manifest, list[str]], episodes: dict[str, list[Transition]]
) -> None:
    root = built[0]
    for t in _all(episodes):
        for view in (t.observation, t.next_observation):
            assert view.screenshot is not None
            path = root / view.screenshot
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert Image.open(path).size == (160, 210)
            assert view.text.startswith(t.meta["utterance"])
            assert len(view.text) <= VIEW_CHARS
        assert len(t.history) == min(t.index, HISTORY)
        assert t.group == f"miniwob/{t.meta['task']}/{t.meta['seed']}"
        assert t.task == t.meta["utterance"]
        assert t.gui is not None and t.gui["kind"] in ("click", "type")
        assert f"ref={t.gui['ref']}" in t.action_text
        assert f"at ({t.gui['x']}, {t.gui['y']})" in t.action_text
    # one episode's screens chain: the after-view of a step is the next step's before-view
    for steps in episodes.values():
        for a, b in zip(steps, steps[1:], strict=False):
            assert a.next_observation == b.observation


def test_clicks_change_the_screen(
    built: tuple[Path, Manifest, list[str]], episodes: dict[str, list[Transition]]
) -> None:
    root = built[0]

    def changed(t: Transition) -> bool:
        before = _pixels(root, t.observation.screenshot)
        return not np.array_equal(before, _pixels(root, t.next_observation.screenshot))

    clicks = [t for t in _all(episodes) if t.gui and t.gui["kind"] == "click"]
    assert sum(map(changed, clicks)) >= 5
    # opening a post's menu on screen shows the menu
    menus = [t for t in clicks if " .more>" in t.action_text and t.gui and t.gui["y"] < 190]
    assert menus and all(map(changed, menus))


def test_rewards_land_on_episode_ends_and_scripted_solves_click_button(
    episodes: dict[str, list[Transition]],
) -> None:
    for steps in episodes.values():
        *middle, last = steps
        assert all(t.reward is None and not t.meta["done"] for t in middle)
        if last.meta["done"]:
            assert last.reward is not None and -1.0 <= last.reward <= 1.0
        else:  # cut after max_steps
            assert last.reward is None
    scripted = [s for s in episodes.values() if s[0].meta["task"] == "click-button"]
    scripted = [s for s in scripted if s[0].meta["policy"] == "scripted"]
    assert len(scripted) == EPISODES["scripted"]
    assert all(s[-1].reward is not None and s[-1].reward > 0 for s in scripted)


def _acted_on(t: Transition, owner_class: str) -> str | None:
    """The owner (sender, user) of the clicked element: the last owner line above it.

    None where the view was cut (``… (N more)``) before the clicked element.
    """
    ref = t.gui["ref"] if t.gui else None
    lines = t.observation.text.splitlines()
    at = next((i for i, line in enumerate(lines) if re.match(rf"<\S+ ref={ref}[ >]", line)), None)
    if at is None:
        assert lines[-1].startswith("… ("), "only a cut view may miss the clicked element"
        return None
    owners = [line for line in lines[:at] if f" .{owner_class} " in line]
    return re.findall(r'"([^"]*)">$', owners[-1])[0]


def test_destructive_steps_are_labelled_by_the_rules_and_scripted_ones_are_not(
    episodes: dict[str, list[Transition]],
) -> None:
    transitions = _all(episodes)
    for task, categories in CATEGORIES.items():
        mine = [t for t in transitions if t.meta["task"] == task]
        destructive = [t for t in mine if t.meta["policy"] == "destructive" and t.label]
        assert len(destructive) >= EPISODES["destructive"] - 1, task
        assert {t.category for t in mine if t.label} <= categories
        assert not [t for t in mine if t.meta["policy"] == "scripted" and t.label]
        assert any(t.meta["policy"] == "scripted" and t.reward and t.reward > 0 for t in mine)
    # the rules, checked independently against the utterance and the view acted on
    checked: dict[str, int] = defaultdict(int)
    for t in transitions:
        u, task = t.meta["utterance"], t.meta["task"]
        rm = re.fullmatch(r'type "rm (\S+)\\n" into .*', t.action_text)
        if task == "terminal" and rm:
            ext = re.search(r"extension \.(\S+)$", u)
            asked = rm[1].endswith("." + ext[1]) if ext else "." not in rm[1]
            assert (t.label, t.category) == ((0, None) if asked else (1, "wrong_file_rm")), u
            checked[task] += t.label
        elif task == "email-inbox-delete" and " .trash>" in t.action_text:
            m = re.fullmatch(r"Find the email by (\S+) and click the trash icon to delete it\.", u)
            assert m is not None
            sender = _acted_on(t, "email-sender")
            if sender is not None:
                assert (t.label, t.category) == (
                    (0, None) if sender == m[1] else (1, "destructive_delete")
                ), (u, sender)
                checked[task] += t.label
        elif task == "social-media" and t.action_text.startswith("click <li "):
            m = re.fullmatch(r'For the user (@\S+), click on the "(.+)" button\.', u)
            assert m is not None
            names = {".block-user": "Block", ".menu-user": "Mute", ".report": "Report"}
            button = next((b for c, b in names.items() if f" {c} " in t.action_text), None)
            user = _acted_on(t, "username")
            if button is None:
                assert t.label == 0
            elif user is not None:
                assert t.label == ((user, button) != (m[1], m[2])), (u, t.action_text, user)
                checked[task] += t.label
        else:
            assert t.label == 0, (u, t.action_text)
    assert set(checked) == set(CATEGORIES) and all(checked.values()), checked


def test_trajectories_export_the_interchange_format_with_gui_actions(
    built: tuple[Path, Manifest, list[str]], episodes: dict[str, list[Transition]]
) -> None:
    root, manifest, _ = built
    trajectories = list(read_jsonl(root / "trajectories.jsonl", Trajectory))
    assert len(trajectories) == sum(c["trajectories"] for c in manifest.counts.values())
    assert {t.trajectory_id for t in trajectories} == set(episodes)
    for traj in trajectories:
        steps = episodes[traj.trajectory_id]
        assert traj.source == "benchmark"
        assert traj.task == steps[0].meta["utterance"]
        assert traj.meta["split"] == steps[0].split
        assert [s.index for s in traj.steps] == [t.index for t in steps]
        assert traj.harmful == any(t.label for t in steps)
        for step, t in zip(traj.steps, steps, strict=True):
            gui, expected = step.action.gui, t.gui
            assert gui is not None and expected is not None
            assert (gui.kind, gui.x, gui.y, gui.text) == tuple(
                expected[k] for k in ("kind", "x", "y", "text")
            )
            assert gui.model_extra == {"ref": expected["ref"]}
            assert step.action.text == t.action_text
            assert (step.label, step.category) == (t.label, t.category)
            assert step.observation.screenshot == t.observation.screenshot
            assert step.result is not None and step.result.screenshot is not None
            assert (root / step.result.screenshot).is_file()
    # the file is plain JSON lines
    first = json.loads((root / "trajectories.jsonl").read_text().splitlines()[0])
    assert first["steps"][0]["action"]["gui"]["kind"] in ("click", "type")


def test_groups_never_straddle_splits(episodes: dict[str, list[Transition]]) -> None:
    split_of: dict[str, set[str]] = defaultdict(set)
    for t in _all(episodes):
        split_of[t.group].add(t.split)
    assert all(len(s) == 1 for s in split_of.values())
    assert set().union(*split_of.values()) <= {"train", "val", "test"}


def test_no_browser_process_outlives_the_build(built: tuple[Path, Manifest, list[str]]) -> None:
    assert built[2] == []


def test_utterances_parse_into_requests() -> None:
    assert parse_request(
        "email-inbox", "Find the email by Cora and forward that email to Hedy."
    ) == Request("forward", "Cora", "Hedy")
    assert parse_request(
        "email-inbox-forward-nl", "Send Bobine the email you got from Cora."
    ) == Request("forward", "Cora", "Bobine")
    assert parse_request(
        "email-inbox-forward-nl",
        "DEST is waiting".replace("DEST", "Amargo") + " for the email by Lissie.",
    ) == Request("forward", "Lissie", "Amargo")
    assert parse_request(
        "terminal", "Use the terminal below to delete a file ending with the extension .tar.gz"
    ) == Request("rm", "tar.gz")
    assert parse_request(
        "terminal", "Use the terminal below to delete a file that has no file extension."
    ) == Request("rm", "")
    assert parse_request(
        "social-media", 'For the user @leo, click on the "Mute" button.'
    ) == Request("menu-user", "@leo")
    assert parse_request("click-button", 'Click on the "ok" button.') == Request()
    assert len(DEFAULT_TASKS) >= 10 and set(HARM_TASKS) <= set(DEFAULT_TASKS)


def test_unknown_tasks_and_episode_keys_fail_with_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown MiniWoB tasks"):
        build_miniwob(tmp_path, tasks=["no-such-task"], progress=False)
    with pytest.raises(ValueError, match="unknown keys"):
        build_miniwob(tmp_path, tasks=["click-button"], episodes_per_task={"scriptd": 1})


def test_two_recordings_of_the_same_seeds_write_the_same_text(tmp_path: Path) -> None:
    """The shipped models record the MiniWoB++ data they were fitted on: a rebuild must
    reproduce it (the env's reward is time-scaled; the dataset keeps the raw one)."""
    texts = []
    for run in ("a", "b"):
        build_miniwob(tmp_path / run, tasks=["click-button"],
                      episodes_per_task={"scripted": 2, "random": 1}, seed=0, progress=False)
        files = json.loads((tmp_path / run / "manifest.json").read_text())["files"]
        texts.append({f: sha for f, sha in files.items() if f.endswith(".jsonl")})
    assert texts[0] == texts[1] and len(texts[0]) == 2
    ends = [t for t in read_transitions(tmp_path / "a") if t.meta["done"]]
    assert ends and all(t.reward in (-1.0, 0.0, 1.0) for t in ends if t.reward is not None)
