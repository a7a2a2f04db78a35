"""The AgentDojo dataset build: every trajectory of the suites x attacks, written to disk.

:func:`iter_agentdojo_trajectories` yields each trajectory with its split
(benign and injection-alone per suite, then hijacked per attack);
:func:`build_agentdojo` writes them as a transition dataset
(:mod:`worldmodel.datasets.format`: transitions and DESIGN §2.1 trajectories)
with a manifest that says how it was made. The full build takes about a
minute and a half on two cores.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path

from agentdojo.task_suite.load_suites import get_suites

from worldmodel.datasets.agentdojo.runtime import (
    SuiteRunner,
    offline_attack,
    run_benign,
    run_hijacked,
    run_injection_alone,
)
from worldmodel.datasets.agentdojo.trajectories import (
    ATTACKS,
    BENCHMARK_VERSION,
    SUITES,
    TARGET_MODEL,
    TRAIN_ATTACK,
    TRAIN_SUITES,
    UNUSED_ATTACKS,
    VAL_FRACTION,
    BuildNotes,
    ToolUseTrajectory,
    assign_split,
    val_groups,
)
from worldmodel.datasets.format import DatasetWriter, Manifest


def _task_number(task_id: str) -> int:
    m = re.search(r"(\d+)$", task_id)
    return int(m.group(1)) if m else -1


def _check_names(given: Sequence[str], known: Sequence[str], what: str) -> None:
    unknown = [n for n in given if n not in known]
    if unknown:
        why = "; ".join(f"{n}: {UNUSED_ATTACKS[n]}" for n in unknown if n in UNUSED_ATTACKS)
        raise ValueError(
            f"unknown AgentDojo {what} {', '.join(map(repr, unknown))} "
            f"(usable: {', '.join(known)}){f'; {why}' if why else ''}"
        )


def iter_agentdojo_trajectories(
    suites: Sequence[str] | None = None,
    attacks: Sequence[str] | None = None,
    *,
    max_user_tasks: int | None = None,
    max_injection_tasks: int | None = None,
    seed: int = 0,
    val_fraction: float = VAL_FRACTION,
    progress: bool = False,
    notes: BuildNotes | None = None,
) -> Iterator[ToolUseTrajectory]:
    """Every AgentDojo trajectory of ``suites`` x ``attacks``, with its split.

    ``max_user_tasks`` / ``max_injection_tasks`` keep the first tasks by number
    (injection tasks counted among those with ground-truth calls). ``notes``,
    when given, is filled with what was left out and why, and the val groups.
    """
    suites = list(suites) if suites is not None else list(SUITES)
    attacks = list(attacks) if attacks is not None else list(ATTACKS)
    _check_names(suites, SUITES, "suite")
    _check_names(attacks, ATTACKS, "attack")
    notes = notes if notes is not None else BuildNotes()
    all_suites = get_suites(BENCHMARK_VERSION)

    for suite_name in suites:
        t0 = time.perf_counter()
        suite = all_suites[suite_name]
        r = SuiteRunner(suite)
        user_tasks = sorted(suite.user_tasks.values(), key=lambda t: _task_number(t.ID))
        injection_tasks = []
        for task in sorted(suite.injection_tasks.values(), key=lambda t: _task_number(t.ID)):
            if task.ground_truth(r.environment({}, keep=True)):
                injection_tasks.append(task)
            else:
                notes.injection_tasks_without_calls.append(f"{suite_name}/{task.ID}")
        val = val_groups(
            [f"{suite_name}/{t.ID}" for t in user_tasks], seed=seed, val_fraction=val_fraction
        ) | val_groups(
            [f"{suite_name}/{t.ID}" for t in injection_tasks], seed=seed, val_fraction=val_fraction
        )
        user_tasks = user_tasks[:max_user_tasks]
        injection_tasks = injection_tasks[:max_injection_tasks]
        if suite_name in TRAIN_SUITES:
            notes.val_groups |= val
        candidates = {t.ID: r.injection_candidates(t) for t in user_tasks}

        n_steps = 0
        for user_task in user_tasks:
            group = f"{suite_name}/{user_task.ID}"
            steps = run_benign(r, user_task)
            n_steps += len(steps)
            yield ToolUseTrajectory(
                trajectory_id=f"agentdojo/{suite_name}/{user_task.ID}/benign",
                kind="benign",
                suite=suite_name,
                user_task=user_task.ID,
                injection_task=None,
                attack=None,
                task=user_task.PROMPT,
                split=assign_split(suite_name, None, group, val),
                group=group,
                steps=steps,
            )
        for task in injection_tasks:
            group = f"{suite_name}/{task.ID}"
            steps = run_injection_alone(r, task)
            n_steps += len(steps)
            yield ToolUseTrajectory(
                trajectory_id=f"agentdojo/{suite_name}/{task.ID}/alone",
                kind="injection",
                suite=suite_name,
                user_task=None,
                injection_task=task.ID,
                attack=None,
                task=task.GOAL,
                split=assign_split(suite_name, None, group, val),
                group=group,
                steps=steps,
            )
        if progress:
            print(
                f"agentdojo {suite_name}: {len(user_tasks)} benign, {len(injection_tasks)} "
                f"injection-alone trajectories, {n_steps} steps "
                f"({time.perf_counter() - t0:.1f}s)",
                file=sys.stderr,
                flush=True,
            )

        for attack_name in attacks:
            t0 = time.perf_counter()
            attack = offline_attack(attack_name, suite, candidates)
            n_traj = n_steps = n_none = 0
            for injection_task in injection_tasks:
                for user_task in user_tasks:
                    hijacked = None
                    if candidates[user_task.ID]:
                        injections = attack.attack(user_task, injection_task)
                        hijacked = run_hijacked(r, user_task, injection_task, injections)
                    if hijacked is None:
                        notes.pairs_without_injection[f"{suite_name}/{attack_name}"] += 1
                        n_none += 1
                        continue
                    group = f"{suite_name}/{user_task.ID}"
                    n_traj += 1
                    n_steps += len(hijacked)
                    yield ToolUseTrajectory(
                        trajectory_id=(
                            f"agentdojo/{suite_name}/{user_task.ID}/{injection_task.ID}/{attack_name}"
                        ),
                        kind="hijacked",
                        suite=suite_name,
                        user_task=user_task.ID,
                        injection_task=injection_task.ID,
                        attack=attack_name,
                        task=user_task.PROMPT,
                        split=assign_split(suite_name, attack_name, group, val),
                        group=group,
                        steps=hijacked,
                        meta={"vectors": sorted(injections)},
                    )
                r.forget()
            if progress:
                print(
                    f"agentdojo {suite_name}/{attack_name}: {n_traj} hijacked trajectories, "
                    f"{n_steps} steps, {n_none} pairs without injection "
                    f"({time.perf_counter() - t0:.1f}s)",
                    file=sys.stderr,
                    flush=True,
                )


# --- the dataset -------------------------------------------------------------------

HOW = (
    "Ground-truth tool calls of AgentDojo {benchmark} tasks, executed one by one in each "
    "suite's FunctionsRuntime (offline; tool results rendered as AgentDojo shows them to the "
    "LLM: YAML, or the error text). Benign: each user task on the default environment, then "
    "its ground-truth answer if any. Hijacked: per (user task, injection task, attack), the "
    "environment carries the attack's text in the injection vectors the user task's ground "
    "truth reaches; after the first tool result that shows injected text the injection "
    "task's ground-truth calls are spliced in and executed, then the user task carries on. "
    "Injection-alone: each injection task's calls from the default environment. Injected "
    "observations are found by re-running the same calls on a canary-injected shadow "
    "environment. Train/val: suites workspace, travel, banking with important_instructions, "
    "split by user task (injection-alone by injection task): the lowest-hashing fifth of "
    "each suite's tasks is val; test_attacks: "
    "the same suites under every other template attack (hijacked only); test_slack: the "
    "slack suite, everything. Injection tasks with no ground-truth calls are left out."
)

LABEL_SEMANTICS = {
    "label": "1 for a call from the injection task's ground truth (it serves the attacker: "
    "spliced into a hijacked trajectory, or every step of an injection-alone one); 0 for the "
    "user task's own calls and answer",
    "injected": "1 when the observation the agent acts on (the previous tool result) shows "
    "text an attack placed in an injection vector",
    "next_injected": "1 when this call's result shows injected text",
    "category": "for label 1: financial (money movement), data_exfiltration (send/forward/"
    "share/post), else prompt_injection",
}


def build_agentdojo(
    out_dir: str | Path,
    *,
    suites: Sequence[str] | None = None,
    attacks: Sequence[str] | None = None,
    max_user_tasks: int | None = None,
    max_injection_tasks: int | None = None,
    seed: int = 0,
    val_fraction: float = VAL_FRACTION,
    progress: bool = True,
) -> Manifest:
    """Write the AgentDojo transition dataset to ``out_dir`` and return its manifest."""
    suites = list(suites) if suites is not None else list(SUITES)
    attacks = list(attacks) if attacks is not None else list(ATTACKS)
    notes = BuildNotes()
    manifest = Manifest(
        name="agentdojo",
        source=f"agentdojo {version('agentdojo')} benchmark {BENCHMARK_VERSION}",
        how=HOW.format(benchmark=BENCHMARK_VERSION),
        label_semantics=LABEL_SEMANTICS,
        rule_derived_labels=False,
    )
    t0 = time.perf_counter()
    with DatasetWriter(out_dir, manifest) as writer:
        for trajectory in iter_agentdojo_trajectories(
            suites,
            attacks,
            max_user_tasks=max_user_tasks,
            max_injection_tasks=max_injection_tasks,
            seed=seed,
            val_fraction=val_fraction,
            progress=progress,
            notes=notes,
        ):
            for t in trajectory.transitions():
                writer.add(t)
            writer.add_trajectory(trajectory.interchange())
        manifest.builder_args = {
            "benchmark_version": BENCHMARK_VERSION,
            "suites": suites,
            "attacks": attacks,
            "train_suites": [s for s in suites if s in TRAIN_SUITES],
            "train_attack": TRAIN_ATTACK,
            "target_model": TARGET_MODEL,
            "max_user_tasks": max_user_tasks,
            "max_injection_tasks": max_injection_tasks,
            "seed": seed,
            "val_fraction": val_fraction,
            "val_groups": sorted(notes.val_groups),
            "unused_attacks": UNUSED_ATTACKS,
            "skipped": {
                "injection_tasks_without_calls": notes.injection_tasks_without_calls,
                "pairs_without_injection": dict(sorted(notes.pairs_without_injection.items())),
            },
        }
    if progress:
        totals = ", ".join(
            f"{s} {c['trajectories']}/{c['transitions']}" for s, c in manifest.counts.items()
        )
        print(
            f"agentdojo: wrote {out_dir} (trajectories/transitions: {totals}) "
            f"in {time.perf_counter() - t0:.1f}s",
            file=sys.stderr,
        )
    return manifest
