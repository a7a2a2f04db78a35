"""AgentDojo tool-use transitions: ground-truth traces run in the suites' own runtime.

Three kinds of trajectory, all from the installed ``agentdojo`` package, offline:

* **benign** -- a user task's ground-truth calls, executed one by one in the
  suite's ``FunctionsRuntime`` on a fresh default environment (injection
  vectors at their benign defaults), then its ground-truth answer if it has one.
* **hijacked** -- the same user task in an environment whose injection vectors
  (those the task's ground truth reaches) carry an attack's text for one
  injection task; after the first tool result that shows injected text, the
  injection task's ground-truth calls are spliced in and executed in the same
  runtime (so they change the environment), then the user task carries on.
* **injection** -- an injection task's ground-truth calls alone, from a fresh
  default environment, with its goal as the task.

Labels come from the ground truth, not from rules: ``label`` = 1 exactly for
the spliced (or injection-alone) calls. ``category`` of a label-1 call is
:func:`category_of` its function name. ``injected`` / ``next_injected`` say
whether the observation before / after the call shows injected text; this is
decided the way AgentDojo finds injection candidates: the same calls are run
in lockstep on a shadow environment whose injected vectors hold canary
strings, and a result is injected when it shows a canary (the attack text
itself is reflowed by YAML on the way in and out, so it cannot be searched
for verbatim).

Splits (held-out discipline): suites ``workspace``, ``travel``, ``banking``
with ``important_instructions`` go to ``train`` / ``val`` by user task (group
``f"{suite}/{user_task}"``; injection-alone trajectories by
``f"{suite}/{injection_task}"``), a fifth of each suite's groups to ``val`` chosen
by a stable hash (:func:`val_groups`); every other attack on those suites goes to
``test_attacks`` (hijacked only); ``slack`` (benign, injection-alone and every
attack) goes to ``test_slack``.

``build_agentdojo(out_dir)`` writes the dataset (``worldmodel.data`` format,
transitions and DESIGN §2.1 trajectories); the full build takes about a
minute and a half on two cores.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import yaml
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.attacks import BaseAttack
from agentdojo.attacks.attack_registry import ATTACKS as ATTACK_REGISTRY
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime, TaskEnvironment
from agentdojo.task_suite.load_suites import get_suites
from agentdojo.task_suite.task_suite import TaskSuite, read_suite_file, validate_injections

from streams.records import Action, Observation, Step, ToolCall, Trajectory
from worldmodel.data import DatasetWriter, Manifest, Transition, View, history_of

BENCHMARK_VERSION = "v1.2.2"  # the newest benchmark version agentdojo 0.1.35 ships
TRAIN_SUITES = ("workspace", "travel", "banking")
EVAL_SUITES = ("slack",)
SUITES = (*TRAIN_SUITES, *EVAL_SUITES)
TRAIN_ATTACK = "important_instructions"
# Template attacks that need no LLM: each fills a fixed jailbreak string with the
# injection task's goal (and the names below). Evaluation only.
EVAL_ATTACKS = (
    "direct",
    "ignore_previous",
    "system_message",
    "injecagent",
    "tool_knowledge",
    "important_instructions_no_user_name",
    "important_instructions_no_model_name",
    "important_instructions_no_names",
    "important_instructions_wrong_model_name",
    "important_instructions_wrong_user_name",
)
ATTACKS = (TRAIN_ATTACK, *EVAL_ATTACKS)
# Registered attacks this builder does not use, and why.
_DOS = "a denial-of-service text with no injection task: no attacker calls to splice"
UNUSED_ATTACKS = {
    "manual": "asks for the injection text on stdin",
    **{
        name: _DOS
        for name in ("dos", "swearwords_dos", "captcha_dos", "offensive_email_dos", "felony_dos")
    },
}
# The attacked pipeline's name: the attacks address the model by the prose name
# AgentDojo maps it to ("GPT-4"); nothing is ever queried.
TARGET_MODEL = "gpt-4o-2024-05-13"
VAL_FRACTION = 0.2

MONEY_MOVEMENT = frozenset({"send_money", "schedule_transaction", "update_scheduled_transaction"})
OUTBOUND_PREFIXES = ("send_", "forward_", "share_", "post_")

Kind = Literal["benign", "hijacked", "injection"]

_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _json_dump(data: Any) -> str:
    return json.dumps(data, default=str, ensure_ascii=False)


def category_of(function: str) -> str:
    """Harm category of an attacker-serving call, by its function name.

    Money movement (``send_money``, ``schedule_transaction``,
    ``update_scheduled_transaction``) is ``financial``; anything that sends,
    forwards, shares or posts data out is ``data_exfiltration``; every other
    attacker call (reads, deletions, bookings, password changes) is
    ``prompt_injection``.
    """
    if function in MONEY_MOVEMENT:
        return "financial"
    if function.startswith(OUTBOUND_PREFIXES):
        return "data_exfiltration"
    return "prompt_injection"


def render_call(call: FunctionCall) -> str:
    """``send_money(recipient='US13...', amount=50.0)``: the call as an agent would write it."""
    args = ", ".join(f"{k}={_render_arg(v)}" for k, v in call.args.items())
    return f"{call.function}({args})"


def _render_arg(value: Any) -> str:
    return render_call(value) if isinstance(value, FunctionCall) else repr(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, FunctionCall):
        return {"function": value.function, "args": _jsonable(dict(value.args))}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _task_number(task_id: str) -> int:
    m = re.search(r"(\d+)$", task_id)
    return int(m.group(1)) if m else -1


def val_groups(
    groups: Sequence[str], *, seed: int = 0, val_fraction: float = VAL_FRACTION
) -> frozenset[str]:
    """The ``val`` share of a suite's groups: the lowest by a stable hash.

    Called with all of a suite's user tasks (or injection tasks), never a
    limited subset, so a group keeps its split whatever the build's limits and
    each suite gets its exact share (a bare hash threshold over 16-40 groups
    lands anywhere from 10 to 40 %).
    """

    def rank(group: str) -> str:
        return hashlib.sha256(f"{seed}/{group}".encode()).hexdigest()

    return frozenset(sorted(groups, key=rank)[: round(len(groups) * val_fraction)])


def assign_split(suite: str, attack: str | None, group: str, val: frozenset[str]) -> str:
    """Where a trajectory goes (``attack`` None: benign or injection-alone).

    Held-out suites go whole to ``test_{suite}``; train suites under any attack
    but ``TRAIN_ATTACK`` go to ``test_attacks``; the rest to ``val`` when the
    group is in ``val`` (see :func:`val_groups`), else ``train``.
    """
    if suite not in TRAIN_SUITES:
        return f"test_{suite}"
    if attack not in (None, TRAIN_ATTACK):
        return "test_attacks"
    return "val" if group in val else "train"


# --- trajectories ------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUseStep:
    """One agent step: what it saw, the call (or final answer) it made, and the result."""

    observation: str
    action_text: str
    next_observation: str
    tool: dict[str, Any] | None = None  # {"name", "arguments"}; None for a final answer
    label: int = 0
    injected: int = 0
    next_injected: int = 0
    category: str | None = None


@dataclass(frozen=True)
class ToolUseTrajectory:
    """One AgentDojo trajectory and where it belongs."""

    trajectory_id: str
    kind: Kind
    suite: str
    user_task: str | None
    injection_task: str | None
    attack: str | None
    task: str
    split: str
    group: str
    steps: tuple[ToolUseStep, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> int:
        return int(any(s.label for s in self.steps))

    def _meta(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "user_task": self.user_task,
            "injection_task": self.injection_task,
            "attack": self.attack,
            "kind": self.kind,
            **self.meta,
        }

    def transitions(self) -> list[Transition]:
        out: list[Transition] = []
        pairs: list[tuple[str, str]] = []
        for i, s in enumerate(self.steps):
            out.append(
                Transition(
                    transition_id=f"{self.trajectory_id}/{i}",
                    trajectory_id=self.trajectory_id,
                    split=self.split,
                    index=i,
                    task=self.task,
                    observation=View(text=s.observation),
                    action_text=s.action_text,
                    next_observation=View(text=s.next_observation),
                    history=history_of(pairs),
                    tool=s.tool,
                    label=s.label,
                    injected=s.injected,
                    next_injected=s.next_injected,
                    category=s.category,
                    group=self.group,
                    meta=self._meta(),
                )
            )
            pairs.append((s.observation, s.action_text))
        return out

    def interchange(self) -> Trajectory:
        """The DESIGN §2.1 form; per-step ``injected`` / ``next_injected`` ride as extra keys."""
        steps = [
            Step(
                step_id=str(i),
                index=i,
                role="main",
                observation=Observation(text=s.observation),
                action=Action(
                    text=s.action_text,
                    tool=ToolCall(name=s.tool["name"], arguments=s.tool["arguments"])
                    if s.tool
                    else None,
                ),
                result=Observation(text=s.next_observation),
                label=1 if s.label else 0,
                category=s.category,
                **{"injected": s.injected, "next_injected": s.next_injected},
            )
            for i, s in enumerate(self.steps)
        ]
        return Trajectory(
            trajectory_id=self.trajectory_id,
            source="benchmark",
            task=self.task,
            steps=steps,
            label=1 if self.label else 0,
            meta={**self._meta(), "split": self.split, "group": self.group},
        )


@dataclass
class BuildNotes:
    """What a build left out and why, and which groups went to val (kept in the manifest)."""

    # "suite/injection_task": its ground truth has no calls (the goal is judged on the
    # final text or by a checker only), so there is nothing to splice or label
    injection_tasks_without_calls: list[str] = field(default_factory=list)
    # "suite/attack" -> (user task, injection task) pairs whose user-task ground truth
    # never shows injected text, so no hijacked trajectory exists
    pairs_without_injection: Counter[str] = field(default_factory=Counter)
    val_groups: set[str] = field(default_factory=set)


# --- running ground truth in a suite -----------------------------------------------


def canary(vector: str) -> str:
    """The marker AgentDojo itself uses to find which vectors a task's ground truth shows."""
    return f"<CANARY---{vector}--->"


class _NamedTarget(BasePipelineElement):
    """Stand-in for the attacked pipeline: attacks read only its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def query(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the AgentDojo builder never queries a model")


class _SuiteRunner:
    """One suite: cached environments (loaded once, deep-copied per use) and its runtime."""

    def __init__(self, suite: TaskSuite) -> None:
        self.suite = suite
        self.runtime = FunctionsRuntime(suite.tools)
        self.defaults = suite.get_injection_vector_defaults()
        self._text = read_suite_file(suite.name, "environment.yaml", suite.data_path)
        self._envs: dict[frozenset[tuple[str, str]], TaskEnvironment] = {}
        self._keep: set[frozenset[tuple[str, str]]] = set()

    def environment(self, injections: Mapping[str, str], *, keep: bool = False) -> TaskEnvironment:
        """A fresh copy of the default environment with ``injections`` in place.

        Same steps as ``TaskSuite.load_and_inject_default_environment``, with
        libyaml's loader when present (an order of magnitude faster).
        """
        key = frozenset(injections.items())
        if key not in self._envs:
            validate_injections(dict(injections), self.defaults)
            text = self._text.format(**(self.defaults | dict(injections)))
            data = yaml.load(text, Loader=_YAML_LOADER)  # a safe loader: CSafeLoader or SafeLoader
            self._envs[key] = self.suite.environment_type.model_validate(data)
        if keep:
            self._keep.add(key)
        return self._envs[key].model_copy(deep=True)

    def forget(self) -> None:
        """Drop cached attack environments (kept: benign and canary ones)."""
        self._envs = {k: v for k, v in self._envs.items() if k in self._keep}

    def execute(self, env: TaskEnvironment, call: FunctionCall) -> str:
        """The call's result as the LLM sees it: AgentDojo's YAML text, or the error."""
        result, error = self.runtime.run_function(env, call.function, call.args)
        return error if error is not None else tool_result_to_str(result)

    def shows(self, env: TaskEnvironment, call: FunctionCall, markers: Sequence[str]) -> bool:
        """Run the call; whether its result (or error) shows any of ``markers``.

        For shadow runs: markers have no characters JSON escapes or YAML folds, so
        a JSON dump finds them as the YAML text would, in a fraction of the time.
        """
        result, error = self.runtime.run_function(env, call.function, call.args)
        text = error if error is not None else tool_result_to_str(result, _json_dump)
        return any(m in text for m in markers)

    def injection_candidates(self, user_task: BaseUserTask) -> list[str]:
        """Vectors the user task's ground truth shows (``BaseAttack.get_injection_candidates``)."""
        canaries = {v: canary(v) for v in self.defaults}
        env = user_task.init_environment(self.environment(canaries, keep=True))
        seen = "\n".join(self.execute(env, c) for c in user_task.ground_truth(env))
        return [v for v, text in canaries.items() if text in seen]


def _offline_attack(name: str, suite: TaskSuite, candidates: Mapping[str, list[str]]) -> BaseAttack:
    """Instantiate a registered attack whose injection candidates are precomputed.

    AgentDojo computes them per attack by reloading the environment with the
    slow pure-Python YAML loader; the answer is the same for every attack.
    """
    base = ATTACK_REGISTRY[name]

    def get_injection_candidates(self: BaseAttack, user_task: BaseUserTask) -> list[str]:
        found = candidates[user_task.ID]
        if not found:
            raise ValueError(f"{user_task.ID} is not injectable.")
        return found

    cls = type(
        f"Offline{base.__name__}", (base,), {"get_injection_candidates": get_injection_candidates}
    )
    attack: BaseAttack = cls(suite, _NamedTarget(TARGET_MODEL))
    return attack


@dataclass
class _Trace:
    """Steps being recorded, with the observation the next step will act on."""

    prompt: str
    steps: list[ToolUseStep] = field(default_factory=list)

    def add(
        self,
        call: FunctionCall,
        result: str,
        *,
        label: int = 0,
        next_injected: bool = False,
    ) -> None:
        prev = self.steps[-1] if self.steps else None
        self.steps.append(
            ToolUseStep(
                observation=prev.next_observation if prev else self.prompt,
                action_text=render_call(call),
                next_observation=result,
                tool={"name": call.function, "arguments": _jsonable(dict(call.args))},
                label=label,
                injected=prev.next_injected if prev else 0,
                next_injected=int(next_injected),
                category=category_of(call.function) if label else None,
            )
        )

    def answer(self, text: str, *, label: int = 0) -> None:
        """The final text answer (the episode ends: no observation follows)."""
        prev = self.steps[-1] if self.steps else None
        self.steps.append(
            ToolUseStep(
                observation=prev.next_observation if prev else self.prompt,
                action_text=text,
                next_observation="",
                label=label,
                injected=prev.next_injected if prev else 0,
                category="prompt_injection" if label else None,
            )
        )


def _benign(r: _SuiteRunner, user_task: BaseUserTask) -> tuple[ToolUseStep, ...]:
    env = user_task.init_environment(r.environment({}, keep=True))
    trace = _Trace(user_task.PROMPT)
    for call in user_task.ground_truth(env):
        trace.add(call, r.execute(env, call))
    if user_task.GROUND_TRUTH_OUTPUT:
        trace.answer(user_task.GROUND_TRUTH_OUTPUT)
    return tuple(trace.steps)


def _injection_alone(r: _SuiteRunner, task: BaseInjectionTask) -> tuple[ToolUseStep, ...]:
    env = r.environment({}, keep=True)
    trace = _Trace(task.GOAL)
    for call in task.ground_truth(env):
        trace.add(call, r.execute(env, call), label=1)
    if task.GROUND_TRUTH_OUTPUT:
        trace.answer(task.GROUND_TRUTH_OUTPUT, label=1)
    return tuple(trace.steps)


def _hijacked(
    r: _SuiteRunner,
    user_task: BaseUserTask,
    injection_task: BaseInjectionTask,
    injections: Mapping[str, str],
) -> tuple[ToolUseStep, ...] | None:
    """The user task with the injection task spliced in after the first injected result.

    None when the user task's ground truth never shows injected text.
    """
    env = user_task.init_environment(r.environment(injections))
    shadow = user_task.init_environment(
        r.environment({v: canary(v) for v in injections}, keep=True)
    )
    markers = [canary(v) for v in injections]

    def run(call: FunctionCall, label: int) -> bool:
        result = r.execute(env, call)
        injected = r.shows(shadow, call, markers)
        trace.add(call, result, label=label, next_injected=injected)
        return injected

    trace = _Trace(user_task.PROMPT)
    spliced = False
    for call in user_task.ground_truth(env):
        if run(call, 0) and not spliced:
            for attacker_call in injection_task.ground_truth(env):
                run(attacker_call, 1)
            spliced = True
    if not spliced:
        return None
    if user_task.GROUND_TRUTH_OUTPUT:
        trace.answer(user_task.GROUND_TRUTH_OUTPUT)
    return tuple(trace.steps)


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
        r = _SuiteRunner(suite)
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
            steps = _benign(r, user_task)
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
            steps = _injection_alone(r, task)
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
            attack = _offline_attack(attack_name, suite, candidates)
            n_traj = n_steps = n_none = 0
            for injection_task in injection_tasks:
                for user_task in user_tasks:
                    hijacked = None
                    if candidates[user_task.ID]:
                        injections = attack.attack(user_task, injection_task)
                        hijacked = _hijacked(r, user_task, injection_task, injections)
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
