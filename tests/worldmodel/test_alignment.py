"""Goal alignment on real AgentDojo steps: the most instruction-like passage the agent read
is the injection, never the user's own task, and the steps that pursue the injection read
more like it than like the task (each suite alone, nothing fitted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dashboards.recall import auroc
from worldmodel.alignment import PASSAGE_CHARS, goal_alignment, top_instruction
from worldmodel.datasets.domains import domain_of
from worldmodel.datasets.format import Transition, read_transitions
from worldmodel.encoders import text_encoder


@pytest.fixture(scope="module")
def steps(small_agentdojo: Path) -> list[Transition]:
    return list(read_transitions(small_agentdojo))


def test_the_top_passage_is_the_injection_and_never_the_task(steps: list[Transition]) -> None:
    hijacked = [t for t in steps if t.label == 1 and t.injected]
    assert hijacked
    for t in hijacked:
        top = top_instruction(t)
        assert top.text and top.score >= 0.5 and top.steps_back >= 0
        assert len(top.text) <= PASSAGE_CHARS
    first = [t for t in steps if t.index == 0]  # the agent has read only the task
    assert first and all(top_instruction(t).text == "" for t in first)
    assert all(top_instruction(t).text not in t.task.casefold() for t in steps
               if top_instruction(t).text)


def test_steps_that_pursue_the_injection_lean_towards_it(steps: list[Transition]) -> None:
    aligned = goal_alignment(steps, text_encoder("minilm"))
    assert len(aligned) == len(steps)
    lean = np.array([a.lean for a in aligned])
    assert np.allclose(lean, [a.to_passage - a.to_task for a in aligned])
    y = np.array([t.label for t in steps])
    for suite in sorted({domain_of(t) for t in steps}):
        m = np.array([domain_of(t) == suite for t in steps])
        if len(set(y[m])) == 2:
            assert auroc(y[m], lean[m]) > 0.7, suite
    assert goal_alignment([], text_encoder("minilm")) == []
