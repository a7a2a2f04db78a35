"""The AgentDojo dataset build: every trajectory of the suites x attacks, written to disk.

:func:`iter_agentdojo_trajectories` yields each trajectory with its split
(benign and injection-alone per suite, then hijacked per attack; by default, in
the training suites, also hijacked by our ``vigil_paraphrase`` wordings and a
renamed-tools copy of the benign, injection-alone and paraphrased ones:
:mod:`~worldmodel.datasets.agentdojo.augment`);
:func:`build_agentdojo` writes them as a transition dataset
(:mod:`worldmodel.datasets.format`: transitions and DESIGN §2.1 trajectories)
with a manifest that says how it was made. The full build takes about a
minute and a half on two cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from pathlib import Path

from agentdojo.attacks import BaseAttack
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.task_suite.load_suites import get_suites

from worldmodel.datasets.agentdojo.augment import (
    WORDINGS,
    ParaphraseAttack,
    ToolRenaming,
    tool_renaming,
)
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
    PARAPHRASE_ATTACK,
    SUITES,
    TARGET_MODEL,
    TRAIN_ATTACK,
    TRAIN_ATTACKS,
    TRAIN_SUITES,
    UNUSED_ATTACKS,
    VAL_FRACTION,
    BuildNotes,
    ToolUseTrajectory,
    assign_split,
    val_groups,
)
from worldmodel.datasets.format import DatasetWriter, Manifest, read_manifest


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
    augment: bool = True,
    progress: bool = False,
    notes: BuildNotes | None = None,
) -> Iterator[ToolUseTrajectory]:
    """Every AgentDojo trajectory of ``suites`` x ``attacks``, with its split.

    ``max_user_tasks`` / ``max_injection_tasks`` keep the first tasks by number
    (injection tasks counted among those with ground-truth calls). ``augment``
    adds, in the training suites, the ``vigil_paraphrase`` attack (one of our
    wordings per pair) and a renamed-tools copy (:mod:`.augment`) of each benign,
    injection-alone and paraphrased trajectory. ``notes``, when given, is filled
    with what was left out and why, the val groups and the renamings used.
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
        renaming = None
        if augment and suite_name in TRAIN_SUITES:
            renaming = tool_renaming(
                suite_name,
                [(f.name, list(f.parameters.model_fields)) for f in suite.tools],
                seed=seed,
            )
            notes.renamings[suite_name] = renaming.as_dict()
        candidates = {t.ID: r.injection_candidates(t) for t in user_tasks}

        n_steps = 0
        for user_task in user_tasks:
            group = f"{suite_name}/{user_task.ID}"
            steps = run_benign(r, user_task)
            n_steps += len(steps)
            benign = ToolUseTrajectory(
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
            yield from _with_renamed(benign, renaming)
        for task in injection_tasks:
            group = f"{suite_name}/{task.ID}"
            steps = run_injection_alone(r, task)
            n_steps += len(steps)
            alone = ToolUseTrajectory(
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
            yield from _with_renamed(alone, renaming)
        if progress:
            print(
                f"agentdojo {suite_name}: {len(user_tasks)} benign, {len(injection_tasks)} "
                f"injection-alone trajectories, {n_steps} steps "
                f"({time.perf_counter() - t0:.1f}s)",
                file=sys.stderr,
                flush=True,
            )

        for attack_name in attacks:
            attack = offline_attack(attack_name, suite, candidates)
            yield from _hijacked(
                r, attack, user_tasks, injection_tasks, candidates, val, notes, progress
            )
        if renaming is not None:
            paraphrase = offline_attack(ParaphraseAttack, suite, candidates, seed=seed)
            for trajectory in _hijacked(
                r, paraphrase, user_tasks, injection_tasks, candidates, val, notes, progress
            ):
                yield from _with_renamed(trajectory, renaming)


def _with_renamed(
    trajectory: ToolUseTrajectory, renaming: ToolRenaming | None
) -> Iterator[ToolUseTrajectory]:
    """The trajectory, then (with a renaming) its renamed-tools copy."""
    yield trajectory
    if renaming is not None:
        yield renaming.rename(trajectory)


def _hijacked(
    r: SuiteRunner,
    attack: BaseAttack,
    user_tasks: Sequence[BaseUserTask],
    injection_tasks: Sequence[BaseInjectionTask],
    candidates: dict[str, list[str]],
    val: frozenset[str],
    notes: BuildNotes,
    progress: bool,
) -> Iterator[ToolUseTrajectory]:
    """One attack's hijacked trajectories of a suite: every (injection, user task) pair
    whose user task shows injected text."""
    t0 = time.perf_counter()
    suite_name, attack_name = r.suite.name, attack.name
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
            meta: dict[str, object] = {"vectors": sorted(injections)}
            if isinstance(attack, ParaphraseAttack):
                meta["wording"] = attack.wording(user_task, injection_task)
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
                meta=meta,
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
    "LLM: YAML, or the error text; tools that stamp the time, sent emails and edited files, "
    "read the suites' own date, 2024-05-15 12:00). Benign: each user task on the default "
    "environment, then "
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
HOW_AUGMENT = (
    " Augmented (training suites only, to train/val by the same groups): the vigil_paraphrase "
    "attack, hijacked trajectories whose injected text is one of {n} wordings written for "
    "this project (none an AgentDojo template), one per (user task, injection task) pair by a "
    "seeded hash (meta.wording: its index in builder_args.augment.wordings); and a copy of "
    "each benign, injection-alone and vigil_paraphrase trajectory with its tools renamed "
    "(id suffix /renamed, meta.renamed): function names and argument keys mapped one-to-one "
    "to synonyms by a per-suite seeded map (builder_args.augment.renamings) in the tool call, "
    "the action text and any tool result that shows a function name; argument values, "
    "labels and injected flags unchanged."
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
    augment: bool = True,
    progress: bool = True,
) -> Manifest:
    """Write the AgentDojo transition dataset to ``out_dir`` and return its manifest.

    ``augment=False`` leaves out the paraphrased and renamed-tools training data
    (:func:`iter_agentdojo_trajectories`); held-out splits are the same either way.

    The same arguments write the same bytes (and content hash) in every process: some
    AgentDojo tools return collections in set order (a calendar event's participants),
    which follows Python's per-process string hashing, so unless this interpreter's hash
    seed is fixed to 0 the build runs in a child interpreter whose seed is.
    """
    if os.environ.get("PYTHONHASHSEED") != "0":
        return _build_in_fixed_hash_process(out_dir, dict(
            suites=suites, attacks=attacks, max_user_tasks=max_user_tasks,
            max_injection_tasks=max_injection_tasks, seed=seed, val_fraction=val_fraction,
            augment=augment, progress=progress))
    suites = list(suites) if suites is not None else list(SUITES)
    attacks = list(attacks) if attacks is not None else list(ATTACKS)
    notes = BuildNotes()
    manifest = Manifest(
        name="agentdojo",
        source=f"agentdojo {version('agentdojo')} benchmark {BENCHMARK_VERSION}",
        how=HOW.format(benchmark=BENCHMARK_VERSION)
        + (HOW_AUGMENT.format(n=len(WORDINGS)) if augment else ""),
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
            augment=augment,
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
            "train_attacks": list(TRAIN_ATTACKS) if augment else [TRAIN_ATTACK],
            "target_model": TARGET_MODEL,
            "max_user_tasks": max_user_tasks,
            "max_injection_tasks": max_injection_tasks,
            "seed": seed,
            "val_fraction": val_fraction,
            "val_groups": sorted(notes.val_groups),
            "unused_attacks": UNUSED_ATTACKS,
            "augment": {
                "paraphrase_attack": PARAPHRASE_ATTACK,
                "wordings": list(WORDINGS),
                "renamed_copies_of": ["benign", "injection", f"hijacked by {PARAPHRASE_ATTACK}"],
                "renamings": notes.renamings,
            }
            if augment
            else False,
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


def _build_in_fixed_hash_process(out_dir: str | Path, kwargs: dict[str, object]) -> Manifest:
    """:func:`build_agentdojo` in a child interpreter with ``PYTHONHASHSEED=0``; its progress
    goes to this process's stderr, and an error it raises is raised here (same message;
    a ``ValueError`` or ``FileNotFoundError`` as itself, anything else as ``RuntimeError``)."""
    root = Path(__file__).resolve().parents[3]  # the folder holding the worldmodel package
    code = ("import json, sys\n"
            "from worldmodel.datasets.agentdojo.build import build_agentdojo\n"
            "try:\n"
            "    build_agentdojo(sys.argv[1], **json.loads(sys.argv[2]))\n"
            "except Exception as e:\n"
            "    print(json.dumps({'type': type(e).__name__, 'message': str(e)}))\n"
            "    sys.exit(3)\n")
    env = {**os.environ, "PYTHONHASHSEED": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH"))
                                         if p)}
    done = subprocess.run([sys.executable, "-c", code, str(out_dir), json.dumps(kwargs)],
                          env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        try:
            err = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            err = {"type": "RuntimeError", "message": f"exit {done.returncode}"}
        kind = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError}.get(
            err["type"], RuntimeError)
        raise kind(err["message"])
    return read_manifest(out_dir)
