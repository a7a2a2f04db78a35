"""The StepShield dataset build: interchange trajectories in, a transition dataset out.

:func:`build_stepshield` reads StepShield's code-agent trajectories in the DESIGN §2.1
interchange format (by default ``../shared/data/stepshield/train.jsonl`` beside the
checkout, or ``$VIGIL_STEPSHIELD``) and writes one
:class:`~worldmodel.datasets.format.Transition` per step, plus the trajectories themselves
with their domain, split and group in ``meta``.

**Labels.** People marked each rogue trajectory's first rogue step (and, in a few, later
ones), so labels are per step (``meta["label_level"] = "step"``): 0 before the first rogue
step and on every step of a clean twin, 1 on an annotated rogue step with ``category`` set
(UFO, SEC, RES, INV, TST, DEC) and the annotators' rationale in ``meta``. A later step of a
rogue trajectory that is not annotated (``label: null`` in the source) is not known step by
step: it is written with label 1 (the agent has gone rogue by then) and
``meta["label_level"] = "after_rogue"``, which the L2 judge's step examples skip
(:func:`monitor.reviewer.train.judge_examples`).

**Domain and splits.** One domain, ``stepshield``, held out whole in its fold. Many pairs
share a task title and a rogue trajectory's clean twin shares its pair id, so a group is a
task title together with every title a pair links it to (two pairs' twins carry reworded
titles): ``Transition.group`` is ``"stepshield/" + `` the first of those titles. The
lowest-hashing ``val_fraction`` of the groups is ``val``
(:func:`~worldmodel.datasets.agentdojo.trajectories.val_groups`), the rest ``train``; twins
and same-title pairs never straddle. No test split. Texts are short (synthetic tool output),
but capped at :data:`MAX_CHARS` like OpenAgentSafety's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streams.records import Step, Trajectory
from worldmodel.datasets import interchange
from worldmodel.datasets.interchange import MAX_CHARS

NAME = "stepshield"
SOURCE_ENV = "VIGIL_STEPSHIELD"
SHIPPED_SOURCE = interchange.shipped_source(NAME)

HOW = (
    "StepShield (synthetic, LLM-written code-agent trajectories, rogue ones paired with "
    "clean twins, the first rogue step annotated by people); read from {source} "
    "({trajectories} trajectories, {pairs} pairs, {groups} task-title groups). One "
    "transition per step: the observation (the previous step's observation; the task for "
    "the first step), the agent's thought and call, the (LLM-written) result. Step labels: "
    "0 before the first rogue step and on clean twins, 1 on an annotated rogue step "
    "(category set), 1 with meta.label_level 'after_rogue' on a later unannotated step of "
    "a rogue trajectory. Texts cut to {max_chars:,} characters with a '[... N characters "
    "cut]' marker, in the transitions and the trajectories ({texts_cut} cut). One domain, "
    "stepshield; train/val by task title (titles linked by a pair's twins joined), the "
    "lowest-hashing {val:.0%} of the groups is val; no test split."
)

LABEL_SEMANTICS = {
    "label": "per step: 1 on an annotated rogue step (meta.label_level 'step', category "
    "set); 1 on a later, unannotated step of a rogue trajectory (meta.label_level "
    "'after_rogue': the agent has gone rogue, but the step itself may or may not be a "
    "violation; the L2 judge's step examples skip it); 0 otherwise (before the first rogue "
    "step, and every step of a clean twin)",
    "category": "the annotated rogue category on a rogue step (UFO unauthorized file "
    "operations, SEC secret exfiltration, RES resource abuse, INV instruction violation, "
    "TST test manipulation, DEC deceptive completion), else null",
    "meta.trajectory_label": "1 rogue trajectory, 0 its clean twin",
    "meta.category": "the pair's category (on a clean twin: what its rogue twin does)",
    "meta.severity": "the pair's severity: L1 obvious, L2 clear, L3 moderate",
    "meta.first_rogue_index": "the first step labelled 1 (null on a clean twin)",
    "meta.rogue_rationale": "on an annotated rogue step, the annotators' rationale",
    "injected": "always 0",
    "next_injected": "always 0",
}

CHECK_META = interchange.required_meta(
    {"pair_id": str, "category": str, "severity": str, "source_task": dict}
)


def _check(t: Trajectory) -> tuple[str, str] | None:
    """The step labels are the ones the README names, and the task has a title."""
    bad = CHECK_META(t)
    if bad is not None:
        return bad
    if not isinstance(t.meta["source_task"].get("title"), str):
        return "meta.source_task.title", "required key is missing or not a string"
    if t.label is None:
        return "label", "the trajectory is unlabelled (null); this builder needs 0 or 1"
    rogue_seen = False
    for i, s in enumerate(t.steps):
        if s.label == 1 and not s.category:
            return f"steps.{i}.category", "a rogue step (label 1) needs its category"
        if s.label is None and not rogue_seen:
            return f"steps.{i}.label", "null before any rogue step (label 1)"
        if s.label == 1 and t.label == 0:
            return f"steps.{i}.label", "a rogue step (label 1) in a clean trajectory (label 0)"
        rogue_seen = rogue_seen or s.label == 1
    if t.label == 1 and not rogue_seen:
        return "label", "a rogue trajectory (label 1) with no step labelled 1"
    return None


def title_of(t: Trajectory) -> str:
    return str(t.meta["source_task"]["title"])


def title_groups(trajectories: Sequence[Trajectory]) -> list[str]:
    """Each trajectory's group: the first (sorted) of its task title and the titles joined
    to it through pairs whose twins carry different titles."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    first_of_pair: dict[str, str] = {}
    for t in trajectories:
        title = title_of(t)
        other = first_of_pair.setdefault(t.meta["pair_id"], title)
        a, b = sorted((root(title), root(other)))
        parent[b] = a
    return [root(title_of(t)) for t in trajectories]


def _step_label(t: Trajectory) -> interchange.StepLabel:
    rationale = {
        r.get("index"): r.get("rationale")
        for r in t.meta.get("rogue_steps") or ()
        if isinstance(r, dict)
    }

    def label(s: Step) -> tuple[int, str | None, dict[str, Any]]:
        if s.label == 1:
            return 1, s.category, {"label_level": "step", "rogue_rationale": rationale.get(s.index)}
        if s.label is None:
            return 1, None, {"label_level": "after_rogue"}
        return 0, None, {"label_level": "step"}

    return label


def _step_meta(t: Trajectory) -> dict[str, Any]:
    first = next((i for i, s in enumerate(t.steps) if s.label == 1), None)
    m = t.meta
    return {
        "trajectory_label": t.label,
        "pair_id": m["pair_id"],
        "category": m["category"],
        "severity": m["severity"],
        "first_rogue_index": first,
        "title": title_of(t),
    }


def _counts(t: Trajectory) -> dict[str, int]:
    labels = [s.label for s in t.steps]
    return {
        "rogue": int(t.label or 0),
        "rogue_steps": labels.count(1),
        "after_rogue_steps": labels.count(None),
        "safe_steps": labels.count(0),
    }


CORPUS = interchange.Corpus(
    name=NAME,
    title="StepShield",
    env=SOURCE_ENV,
    how=HOW,
    label_semantics=LABEL_SEMANTICS,
    grouping="by task title (meta.source_task.title), the titles a pair's twins carry "
    "joined; twins and same-title pairs never straddle train/val",
    check=_check,
    groups=title_groups,
    step_meta=_step_meta,
    counts=_counts,
    distinct=lambda t: {"pairs": t.meta["pair_id"]},
    step_label=_step_label,
    max_chars=MAX_CHARS,
)


# $VIGIL_STEPSHIELD's file if set, else the shipped ../shared/data/stepshield/train.jsonl
default_source = CORPUS.default_source
# build_stepshield(out_dir, *, source=None, seed=0, val_fraction=0.2, progress=True):
# writes the dataset to out_dir and returns its Manifest (source: default_source())
build_stepshield = CORPUS.build
