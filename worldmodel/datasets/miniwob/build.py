"""The MiniWoB++ dataset build: episodes played in headless Chromium, written to disk.

:func:`build_miniwob` plays each task's episodes under each policy in one
browser and writes every step with
:class:`~worldmodel.datasets.format.DatasetWriter`: the views before and after
(text and screenshot), the action, the env reward on the step that ended the
episode and the rule-derived harm label; each episode also goes out as a
DESIGN §2.1 trajectory. Groups ``miniwob/<task>/<seed>`` go 70 / 15 / 15 % to
``train`` / ``val`` / ``test`` by a stable hash.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np
from miniwob.action import ActionTypes
from miniwob.dom import DOMElement
from PIL import Image

from streams.records import Action, GuiAction, Observation, Step, Trajectory
from worldmodel.datasets.format import DatasetWriter, Manifest, Transition, View, history_of
from worldmodel.datasets.miniwob.browser import CHROMIUM_FLAGS, Browser, browser_paths
from worldmodel.datasets.miniwob.harm import (
    HARM_RULES,
    HARM_TASKS,
    destructive_acts,
    judge,
    parse_request,
)
from worldmodel.datasets.miniwob.page import VIEW_CHARS, Command, Page, center, describe, page_from
from worldmodel.datasets.miniwob.policies import (
    DESTRUCTIVE,
    POLICIES,
    SCRIPTED,
    Context,
    policy_for,
)

DEFAULT_TASKS: tuple[str, ...] = (
    "click-button",
    "click-link",
    "click-checkboxes",
    "click-option",
    "click-dialog",
    "click-tab",
    "focus-text",
    "enter-text",
    "enter-password",
    "login-user",
    "choose-list",
    *HARM_TASKS,
)
# Episodes per task and policy in the default build (destructive: harm tasks only).
DEFAULT_EPISODES: dict[str, int] = {"scripted": 20, "random": 10, "destructive": 20}
MAX_STEPS = 8  # an episode still running after this many actions is cut (truncated)
SPLITS: tuple[tuple[str, float], ...] = (("train", 0.70), ("val", 0.85), ("test", 1.0))


def _split(group: str) -> str:
    u = int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big") / 2**64
    return next(name for name, upper in SPLITS if u < upper)


def _save_png(pixels: np.ndarray, path: Path) -> None:
    Image.fromarray(pixels).save(path, format="PNG", compress_level=6)


@dataclass
class _Tally:
    episodes: Counter[str] = field(default_factory=Counter)
    steps: int = 0
    harmful: int = 0
    solved: Counter[str] = field(default_factory=Counter)
    env_seconds: float = 0.0


def _action_text(command: Command, el: DOMElement) -> str:
    x, y = center(el)
    if command.kind == "click":
        return f"click {describe(el)} at ({x}, {y})"
    return f"type {json.dumps(command.text)} into {describe(el)} at ({x}, {y})"


def _record_episode(
    browser: Browser,
    writer: DatasetWriter,
    task: str,
    policy: str,
    seed: int,
    build_seed: int,
    max_steps: int,
    tally: _Tally,
) -> None:
    trajectory_id = f"miniwob/{task}/{policy}/{seed}"
    group = f"miniwob/{task}/{seed}"
    split = _split(group)
    obs, info = browser.reset(seed=seed)
    page = page_from(obs, info["root_dom"])
    ctx = Context(
        task,
        parse_request(task, page.utterance),
        random.Random(f"{build_seed}/{task}/{policy}/{seed}"),
    )
    act = policy_for(task, policy)
    shot_name = f"{task}-{policy}-{seed}"
    path, shot = writer.screen_path(f"{shot_name}-0")
    _save_png(page.screenshot, path)
    pairs: list[tuple[str, str]] = []
    steps: list[Step] = []
    reward: float | None = None
    done = False
    for index in range(max_steps):
        command = act(page, ctx)
        if command is None:
            break
        el = page.by_ref(command.ref)
        judged = (judge(ctx.request, a) for a in destructive_acts(browser, page, el, command))
        category = next((c for c in judged if c is not None), None)
        label: Literal[0, 1] = 0 if category is None else 1
        kind = (
            ActionTypes.CLICK_ELEMENT
            if command.kind == "click"
            else ActionTypes.FOCUS_ELEMENT_AND_TYPE_TEXT
        )
        action = browser.create_action(kind, ref=command.ref, text=command.text)
        started = time.perf_counter()
        obs, env_reward, done, _, info = browser.step(action)
        tally.env_seconds += time.perf_counter() - started
        if done:
            root, pixels = browser.capture_final()
            after = Page(page.utterance, page.fields, root, pixels)
            # the raw reward: MiniWoB++ scales env_reward by the wall-clock time the episode
            # took, so two builds of the same seeds would differ in it
            raw = info.get("raw_reward")
            reward = float(raw if raw is not None else env_reward)
        else:
            after = page_from(obs, info["root_dom"])
        next_path, next_shot = writer.screen_path(f"{shot_name}-{index + 1}")
        _save_png(after.screenshot, next_path)
        x, y = center(el)
        text = command.text if command.kind == "type" else None
        gui = {"kind": command.kind, "x": x, "y": y, "text": text, "ref": command.ref}
        action_text = _action_text(command, el)
        meta: dict[str, Any] = {
            "task": task,
            "policy": policy,
            "seed": seed,
            "utterance": page.utterance,
            "done": bool(done),
        }
        if done:
            meta |= {"raw_reward": info.get("raw_reward"), "reason": info.get("reason")}
        writer.add(
            Transition(
                transition_id=f"{trajectory_id}/{index}",
                trajectory_id=trajectory_id,
                split=split,
                index=index,
                task=page.utterance,
                observation=View(page.text, shot),
                action_text=action_text,
                next_observation=View(after.text, next_shot),
                history=history_of(pairs),
                gui=gui,
                label=label,
                category=category,
                reward=reward,
                group=group,
                meta=meta,
            )
        )
        steps.append(
            Step(
                step_id=f"s{index}",
                index=index,
                observation=Observation(text=page.text, screenshot=shot),
                action=Action(text=action_text, gui=GuiAction.model_validate(gui)),
                result=Observation(text=after.text, screenshot=next_shot),
                label=label,
                category=category,
            )
        )
        tally.steps += 1
        tally.harmful += category is not None
        pairs.append((page.text, action_text))
        page, shot = after, next_shot
        if done:
            break
    if not steps:  # the policy found nothing to do: no episode to record
        path.unlink()
        return
    writer.add_trajectory(
        Trajectory(
            trajectory_id=trajectory_id,
            source="benchmark",
            task=page.utterance,
            steps=steps,
            label=1 if any(s.label for s in steps) else 0,
            meta={
                "dataset": "miniwob",
                "task": task,
                "policy": policy,
                "seed": seed,
                "group": group,
                "split": split,
                "reward": reward,
                "done": bool(done),
                "truncated": not done,
            },
        )
    )
    tally.episodes[policy] += 1
    tally.solved[policy] += reward is not None and reward > 0


# --- the build ------------------------------------------------------------------------


def _plan(
    tasks: tuple[str, ...], policies: tuple[str, ...], episodes: int | Mapping[str, int]
) -> dict[str, list[tuple[str, int]]]:
    """Episodes per (task, policy). A mapping is keyed by policy, task or "task/policy"."""
    if not isinstance(episodes, int):
        known = set(POLICIES) | set(tasks) | {f"{t}/{p}" for t in tasks for p in POLICIES}
        unknown = sorted(set(episodes) - known)
        if unknown:
            raise ValueError(
                f"episodes_per_task has unknown keys {unknown}: "
                "use a policy, a task or 'task/policy'"
            )
    plan: dict[str, list[tuple[str, int]]] = {}
    for task in tasks:
        plan[task] = []
        for policy in policies:
            if policy == "destructive" and task not in DESTRUCTIVE:
                continue
            if isinstance(episodes, int):
                n = episodes
            else:
                n = episodes.get(f"{task}/{policy}", episodes.get(task, episodes.get(policy, 0)))
            if n > 0:
                plan[task].append((policy, n))
    return plan


def _manifest(browser: Browser, builder_args: dict[str, Any]) -> Manifest:
    chromium = browser.driver.capabilities.get("browserVersion", "?")
    rules = "; ".join(f"{c}: {r}" for c, r in HARM_RULES.items())
    return Manifest(
        name="miniwob",
        source=f"miniwob {metadata.version('miniwob')} in chromium {chromium}",
        how=(
            "MiniWoB++ tasks (the miniwob package's local HTML) played through its gymnasium "
            "environment in one headless Chromium; per step the utterance, a compact DOM text "
            f"(at most {VIEW_CHARS} characters with the utterance) and a 160x210 screenshot "
            "before and after the action, the action (click an element, or click it and type "
            "text, with the element's centre as coordinates) and the env reward on the step "
            "that ended the episode. Policies: scripted (reads utterance and DOM, does the "
            "task), random (random element click or random words typed into a random input), "
            "destructive (harm tasks only: the harmful variant on purpose, then the task). "
            "Harm labels are RULE-DERIVED from the utterance and the executed action, not "
            f"human judgements: label=1 when {rules}; every other step 0. Splits by a stable "
            "hash of the group miniwob/<task>/<episode seed>: 70% train, 15% val, 15% test "
            "(held out)."
        ),
        label_semantics={
            "label": (
                "1 = the executed action is a destructive act on an object the utterance did "
                "not name for that act (rule-derived, see the categories), else 0"
            ),
            **HARM_RULES,
            "injected": "always 0: MiniWoB pages carry no injected instructions",
            "next_injected": "always 0",
            "reward": (
                "the env's raw reward (in [-1, 1]; not scaled by the episode's wall-clock "
                "time, so builds agree) on the step that ended the episode; None on other "
                "steps and on episodes cut after max_steps"
            ),
        },
        rule_derived_labels=True,
        builder_args=builder_args,
    )


def build_miniwob(
    out_dir: str | Path,
    *,
    tasks: Iterable[str] | None = None,
    episodes_per_task: int | Mapping[str, int] = DEFAULT_EPISODES,
    policies: Iterable[str] = POLICIES,
    seed: int = 0,
    progress: bool = True,
    max_steps: int = MAX_STEPS,
    chromium: str | None = None,
    chromedriver: str | None = None,
) -> Manifest:
    """Record MiniWoB++ episodes in headless Chromium into a transition dataset at ``out_dir``.

    ``episodes_per_task``: episodes for each (task, policy), as one number or a
    mapping keyed by policy (``{"scripted": 20, "random": 10}``), task or
    ``"task/policy"`` (the most specific key wins, missing ones are 0);
    ``destructive`` runs on ``HARM_TASKS`` only. Episode ``i`` of every policy
    plays the problem seeded ``seed * 100000 + i``. Progress goes to stderr, a
    line per task. Returns the written manifest.
    """
    tasks = tuple(tasks) if tasks is not None else DEFAULT_TASKS
    policies = tuple(policies)
    bad = [t for t in tasks if t not in SCRIPTED] + [p for p in policies if p not in POLICIES]
    if bad or not tasks:
        raise ValueError(
            f"unknown MiniWoB tasks or policies {bad}; tasks: {sorted(SCRIPTED)}, "
            f"policies: {list(POLICIES)}"
        )
    plan = _plan(tasks, policies, episodes_per_task)
    chromium, chromedriver = browser_paths(chromium, chromedriver)
    builder_args = {
        "tasks": list(tasks),
        "policies": list(policies),
        "episodes": {t: dict(p) for t, p in plan.items()},
        "seed": seed,
        "max_steps": max_steps,
        "chromium_flags": list(CHROMIUM_FLAGS),
    }
    started = time.perf_counter()
    browser = Browser(tasks[0], chromium=chromium, chromedriver=chromedriver)
    try:
        writer = DatasetWriter(out_dir, _manifest(browser, builder_args))
        with writer:
            total = 0
            for task in tasks:
                browser.switch_task(task)
                tally, t0 = _Tally(), time.perf_counter()
                for policy, n in plan[task]:
                    for i in range(n):
                        episode_seed = seed * 100_000 + i
                        _record_episode(
                            browser, writer, task, policy, episode_seed, seed, max_steps, tally
                        )
                total += tally.steps
                if progress:
                    _report(task, tally, time.perf_counter() - t0)
        if progress:
            elapsed = time.perf_counter() - started
            counts = ", ".join(
                f"{s} {c['transitions']} ({c['harmful']} harmful)"
                for s, c in writer.manifest.counts.items()
            )
            print(
                f"miniwob: {total} transitions in {elapsed:.0f} s ({total / elapsed:.1f} steps/s): "
                f"{counts} -> {out_dir}",
                file=sys.stderr,
            )
        return writer.manifest
    finally:
        browser.close()


def _report(task: str, tally: _Tally, seconds: float) -> None:
    episodes = ", ".join(f"{p} {n} ({tally.solved[p]} solved)" for p, n in tally.episodes.items())
    step_s = tally.env_seconds / max(tally.steps, 1)
    print(
        f"miniwob {task}: {sum(tally.episodes.values())} episodes [{episodes}], "
        f"{tally.steps} steps, {tally.harmful} harmful, "
        f"{tally.steps / max(seconds, 1e-9):.1f} steps/s (env.step {step_s * 1000:.0f} ms)",
        file=sys.stderr,
    )
