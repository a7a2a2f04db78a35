"""The OpenAgentSafety dataset build: interchange trajectories in, a transition dataset out.

:func:`build_openagentsafety` reads OpenAgentSafety runs in the DESIGN §2.1 interchange
format (by default ``../shared/data/openagentsafety/train.jsonl`` beside the checkout, or
``$VIGIL_OPENAGENTSAFETY``) and writes one
:class:`~worldmodel.datasets.format.Transition` per step, plus the trajectories themselves
with their domain, split and group in ``meta``.

**Labels.** The benchmark's LLM judge read each run whole, so every step carries the run's
label (weak: 1 unsafe, the judge said the agent completed or attempted the unsafe
behaviour), with ``meta["label_level"] = "trajectory"`` and ``meta["trajectory_label"]``,
ToolEmu's convention; the judge's own value (-1 to 2), whether the run reached the risk,
the agent model, the task and its unsafe behaviour ride in each step's ``meta``.

**Long texts.** Results can be whole web pages or file dumps (one is over a million
characters), so every text (task, observation, action, result, and each string of a call's
arguments) is cut to its first :data:`MAX_CHARS` (20,000) characters with a
``[... N characters cut]`` marker, in the transitions and in the trajectories written
beside them.

**Domain and splits.** One domain, ``openagentsafety``, held out whole in its fold.
``Transition.group`` is ``f"openagentsafety/{task_id}"`` (up to 4 runs, one a model, share a
task); the lowest-hashing ``val_fraction`` of the tasks is ``val``
(:func:`~worldmodel.datasets.agentdojo.trajectories.val_groups`), the rest ``train``. No
test split.
"""

from __future__ import annotations

from typing import Any

from streams.records import Trajectory
from worldmodel.datasets import interchange
from worldmodel.datasets.interchange import MAX_CHARS

NAME = "openagentsafety"
SOURCE_ENV = "VIGIL_OPENAGENTSAFETY"
SHIPPED_SOURCE = interchange.shipped_source(NAME)

HOW = (
    "OpenAgentSafety runs: OpenHands agents ({models} models) on workplace tasks that hide "
    "a risk, in a simulated company with a shell, Python, a file editor, a browser and "
    "LLM-played colleagues; each run judged whole by the benchmark's LLM judge (gpt-4.1); "
    "read from {source} ({trajectories} trajectories, {tasks} tasks). One transition per "
    "step: the observation (the previous step's result; the first user message for the "
    "first step), the agent's output (its text, then the call), the result (command "
    "output, page text, the colleague's or user's reply; empty for finish). Labels are the "
    "trajectory's, on every step. Every text (task, observation, action, result, each "
    "string of a call's arguments) is cut to its first {max_chars:,} characters with a "
    "'[... N characters cut]' marker, in the transitions and in the trajectories written "
    "beside them ({texts_cut} texts cut). One domain, openagentsafety; train/val by task "
    "(a task's runs together), the lowest-hashing {val:.0%} of the tasks is val; no test "
    "split."
)

LABEL_SEMANTICS = {
    "label": "the trajectory's label on every step (weak; meta.label_level = 'trajectory'): "
    "1 unsafe when the benchmark's LLM judge said 2 (completed the unsafe behaviour) or 1 "
    "(attempted, agreed, started), 0 safe for 0 or -1",
    "meta.trajectory_label": "the same label, named as the trajectory's",
    "meta.judge_label": "the judge's value: 2, 1, 0, or -1 (never reached the risky part)",
    "meta.reached_risk": "false where the judge said -1 (benign traffic, not a refusal)",
    "meta.unsafe_behavior": "the task's checkpoint: the behaviour the judge looked for",
    "injected": "always 0",
    "next_injected": "always 0",
    "category": "always null",
}

CHECK_META = interchange.required_meta(
    {
        "task_id": str,
        "agent_model": str,
        "judge_label": int,
        "reached_risk": bool,
        "unsafe_behavior": str,
    }
)


def _check(t: Trajectory) -> tuple[str, str] | None:
    if t.label is None:
        return "label", "the trajectory is unlabelled (null); this builder needs 0 or 1"
    return CHECK_META(t)


def _step_meta(t: Trajectory) -> dict[str, Any]:
    m = t.meta
    return {
        "label_level": "trajectory",
        "trajectory_label": t.label,
        "judge_label": m["judge_label"],
        "reached_risk": m["reached_risk"],
        "rule_based_score": m.get("rule_based_score"),
        "agent_model": m["agent_model"],
        "task_id": m["task_id"],
        "unsafe_behavior": m["unsafe_behavior"],
    }


CORPUS = interchange.Corpus(
    name=NAME,
    title="OpenAgentSafety",
    env=SOURCE_ENV,
    how=HOW,
    label_semantics=LABEL_SEMANTICS,
    grouping="by meta.task_id (a task's runs never straddle train/val)",
    check=_check,
    groups=lambda trajectories: [t.meta["task_id"] for t in trajectories],
    step_meta=_step_meta,
    counts=lambda t: {"unsafe": int(t.label or 0), "reached_risk": int(t.meta["reached_risk"])},
    distinct=lambda t: {"tasks": t.meta["task_id"], "models": t.meta["agent_model"]},
    max_chars=MAX_CHARS,
)


# $VIGIL_OPENAGENTSAFETY's file if set, else the shipped ../shared/data/openagentsafety/train.jsonl
default_source = CORPUS.default_source
# build_openagentsafety(out_dir, *, source=None, seed=0, val_fraction=0.2, progress=True):
# writes the dataset to out_dir and returns its Manifest (source: default_source())
build_openagentsafety = CORPUS.build
