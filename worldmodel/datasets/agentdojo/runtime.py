"""Running AgentDojo ground truth offline in a suite's own ``FunctionsRuntime``.

:class:`SuiteRunner` holds a suite's environments (loaded once with libyaml,
deep-copied per use) and executes calls as the LLM would see their results;
:func:`run_benign`, :func:`run_injection_alone` and :func:`run_hijacked` record
the three kinds of trajectory as :class:`ToolUseStep` tuples. Injected
observations are found with canary strings on a shadow environment
(:func:`canary`); :func:`offline_attack` instantiates a registered attack with
the injection candidates computed once. Tools that stamp the time read the
suites' own date (:func:`suite_clock`), so a build is reproducible. Nothing here
queries a model.
"""

from __future__ import annotations

import datetime
import json
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.attacks import BaseAttack
from agentdojo.attacks.attack_registry import ATTACKS as ATTACK_REGISTRY
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.default_suites.v1.tools import cloud_drive_client, email_client
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime, TaskEnvironment
from agentdojo.task_suite.task_suite import TaskSuite, read_suite_file, validate_injections

from worldmodel.datasets.agentdojo.trajectories import TARGET_MODEL, ToolUseStep, category_of

_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _json_dump(data: Any) -> str:
    return json.dumps(data, default=str, ensure_ascii=False)


def render_call(call: FunctionCall) -> str:
    """``send_money(recipient='US13...', amount=50.0)``: the call as an agent would write it."""
    return render_action(call.function, call.args)


def render_action(function: str, args: Mapping[str, Any]) -> str:
    """:func:`render_call` from a function name and its arguments."""
    return f"{function}({', '.join(f'{k}={_render_arg(v)}' for k, v in args.items())})"


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


# --- the suites' clock -------------------------------------------------------------

# The suites' calendars say today is 2024-05-15, but AgentDojo stamps a sent email or an
# edited file with the machine's clock. Calls run here read this instant instead, so a
# build is the same byte for byte whenever it runs.
SUITE_NOW = datetime.datetime(2024, 5, 15, 12, 0)
_CLOCKED_TOOLS = (email_client, cloud_drive_client)  # modules whose tools call now()


class _SuiteDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
        return SUITE_NOW.replace(tzinfo=tz)


_SUITE_DATETIME_MODULE = types.SimpleNamespace(**{**vars(datetime), "datetime": _SuiteDatetime})


@contextmanager
def suite_clock() -> Iterator[None]:
    """The tool modules that read the clock see :data:`SUITE_NOW` while this is open."""
    for module in _CLOCKED_TOOLS:
        module.datetime = _SUITE_DATETIME_MODULE  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in _CLOCKED_TOOLS:
            module.datetime = datetime  # type: ignore[attr-defined]


# --- running ground truth in a suite -----------------------------------------------


def canary(vector: str) -> str:
    """The marker AgentDojo itself uses to find which vectors a task's ground truth shows."""
    return f"<CANARY---{vector}--->"


class NamedTarget(BasePipelineElement):
    """Stand-in for the attacked pipeline: attacks read only its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def query(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the AgentDojo builder never queries a model")


class SuiteRunner:
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
        with suite_clock():
            result, error = self.runtime.run_function(env, call.function, call.args)
        return error if error is not None else tool_result_to_str(result)

    def shows(self, env: TaskEnvironment, call: FunctionCall, markers: Sequence[str]) -> bool:
        """Run the call; whether its result (or error) shows any of ``markers``.

        For shadow runs: markers have no characters JSON escapes or YAML folds, so
        a JSON dump finds them as the YAML text would, in a fraction of the time.
        """
        with suite_clock():
            result, error = self.runtime.run_function(env, call.function, call.args)
        text = error if error is not None else tool_result_to_str(result, _json_dump)
        return any(m in text for m in markers)

    def injection_candidates(self, user_task: BaseUserTask) -> list[str]:
        """Vectors the user task's ground truth shows (``BaseAttack.get_injection_candidates``)."""
        canaries = {v: canary(v) for v in self.defaults}
        env = user_task.init_environment(self.environment(canaries, keep=True))
        seen = "\n".join(self.execute(env, c) for c in user_task.ground_truth(env))
        return [v for v, text in canaries.items() if text in seen]


def offline_attack(
    attack: str | type[BaseAttack],
    suite: TaskSuite,
    candidates: Mapping[str, list[str]],
    **kwargs: Any,
) -> BaseAttack:
    """Instantiate an attack (a registered name, or a class) whose injection candidates
    are precomputed; ``kwargs`` go to its constructor after the suite and target.

    AgentDojo computes them per attack by reloading the environment with the
    slow pure-Python YAML loader; the answer is the same for every attack.
    """
    base = ATTACK_REGISTRY[attack] if isinstance(attack, str) else attack

    def get_injection_candidates(self: BaseAttack, user_task: BaseUserTask) -> list[str]:
        found = candidates[user_task.ID]
        if not found:
            raise ValueError(f"{user_task.ID} is not injectable.")
        return found

    cls = type(
        f"Offline{base.__name__}", (base,), {"get_injection_candidates": get_injection_candidates}
    )
    instance: BaseAttack = cls(suite, NamedTarget(TARGET_MODEL), **kwargs)
    return instance


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


def run_benign(r: SuiteRunner, user_task: BaseUserTask) -> tuple[ToolUseStep, ...]:
    env = user_task.init_environment(r.environment({}, keep=True))
    trace = _Trace(user_task.PROMPT)
    for call in user_task.ground_truth(env):
        trace.add(call, r.execute(env, call))
    if user_task.GROUND_TRUTH_OUTPUT:
        trace.answer(user_task.GROUND_TRUTH_OUTPUT)
    return tuple(trace.steps)


def run_injection_alone(r: SuiteRunner, task: BaseInjectionTask) -> tuple[ToolUseStep, ...]:
    env = r.environment({}, keep=True)
    trace = _Trace(task.GOAL)
    for call in task.ground_truth(env):
        trace.add(call, r.execute(env, call), label=1)
    if task.GROUND_TRUTH_OUTPUT:
        trace.answer(task.GROUND_TRUTH_OUTPUT, label=1)
    return tuple(trace.steps)


def run_hijacked(
    r: SuiteRunner,
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
