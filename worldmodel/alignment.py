"""Whose goal does the action serve: the user's task, or an instruction the agent read?

An injected instruction does not only supply values (:mod:`worldmodel.provenance`): it sets
the agent a goal, and the steps that pursue it often use no injected value at all (reading
every channel before posting them to the attacker's site). What such a step does is closer
in meaning to the injected passage than to the task. Per step:

* the **most instruction-like passage** the agent has read before acting (the newest
  observation and the history, :func:`top_instruction`; the passage with its neighbour
  before and two after, casefolded, at most :data:`PASSAGE_CHARS`), its instruction-likeness
  (:func:`worldmodel.provenance.instruction_likeness` of the passage) and how many steps back;
* the cosine similarity of the action (its call text, underscores read as spaces) to that
  passage and to the task, in a sentence encoder's space (:func:`goal_alignment`).

``passage - task`` separates harmful from benign steps on each AgentDojo training suite taken
alone (banking 0.85, travel 0.94, workspace 0.96 step AUROC on a 1,500-step sample, the
all-MiniLM-L6-v2 encoder) with nothing fitted: it is a reading of the step, not a model of
the suites. The judge is shown it in words (:func:`monitor.reviewer.judge.evidence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from worldmodel.provenance import ProvenanceStep, _source

PASSAGE_CHARS = 400
ACTION_CHARS = 300
TASK_CHARS = 400


@dataclass(frozen=True)
class Instruction:
    """The most instruction-like passage the agent read: ``text`` (empty when nothing it
    read has an instruction cue), its ``score`` in (0, 1] and ``steps_back`` (-1: none)."""

    text: str = ""
    score: float = 0.0
    steps_back: int = -1


def top_instruction(step: Any) -> Instruction:
    """The most instruction-like passage of what the agent read before ``step``'s action
    (a ``ScreenStep``, a ``Transition`` or a :class:`~worldmodel.provenance.ProvenanceStep`);
    an empty one when no passage has any instruction cue. The user's task is not something
    the agent read: a source that is the task, or a passage the task holds, is skipped."""
    ps = ProvenanceStep.of(step)
    task = _source(ps.task).norm
    best = Instruction()
    for text, back in ps.sources:
        if not text:
            continue
        src = _source(text)  # cached: a source recurs at every later step
        if src.norm == task:
            continue  # the task shown as the first observation: the user's, not read
        for i, score in enumerate(src.scores):
            if score > best.score and src.passages[i] not in task:
                best = Instruction(" ".join(src.passages[max(0, i - 1) : i + 3])[:PASSAGE_CHARS],
                                   score, back)
    return best


@dataclass(frozen=True)
class Alignment:
    """The action's similarity to the most instruction-like passage and to the task."""

    instruction: Instruction
    to_passage: float
    to_task: float

    @property
    def lean(self) -> float:
        """``to_passage - to_task``: > 0 when the action reads more like the passage."""
        return self.to_passage - self.to_task


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)


def goal_alignment(steps: Sequence[Any], encoder: Any) -> list[Alignment]:
    """:class:`Alignment` of each step; ``encoder``: anything with ``encode(texts) ->
    (n, d) array`` (:func:`worldmodel.encoders.text_encoder`), called three times, batched."""
    if not steps:
        return []
    ps = [ProvenanceStep.of(s) for s in steps]
    tops = [top_instruction(p) for p in ps]
    actions = _unit(encoder.encode([p.action_text.replace("_", " ")[:ACTION_CHARS] or "nothing"
                                    for p in ps]))
    tasks = _unit(encoder.encode([p.task[:TASK_CHARS] or "nothing" for p in ps]))
    passages = _unit(encoder.encode([t.text or "nothing" for t in tops]))
    to_p, to_t = (actions * passages).sum(1), (actions * tasks).sum(1)
    return [Alignment(t, float(a), float(b)) for t, a, b in zip(tops, to_p, to_t, strict=True)]
