"""Goal alignment on real AgentDojo steps: the most instruction-like passage the agent read
is the injection, never the user's own task, and the steps that pursue the injection read
more like it than like the task (each suite alone, nothing fitted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vigil.metrics import auroc
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


def test_the_l0_scorer_gives_goal_lean_in_unit_range(small_agentdojo: Path,
                                                     steps: list[Transition]) -> None:
    """``goal_lean`` (opt-in L0 signal): in [0, 1], 0 before the agent has read anything
    instruction-like, higher on the steps that pursue an injection."""
    from monitor.calibrate import screen_step_of_transition
    from monitor.scorers import default_signals, scorers_of, tier_signals
    from monitor.scorers.alignment import AlignmentSignals

    scorer = AlignmentSignals.load({})
    got = scorer.score_steps([screen_step_of_transition(t, small_agentdojo) for t in steps])
    lean = np.array([d["goal_lean"] for d in got])
    assert lean.shape == (len(steps),) and ((lean >= 0) & (lean <= 1)).all()
    assert all(v == 0 for v, t in zip(lean, steps, strict=True) if t.index == 0)
    y = np.array([t.label for t in steps])
    assert lean[y == 1].mean() > lean[y == 0].mean()
    assert AlignmentSignals in scorers_of(0) and "goal_lean" in tier_signals(0)
    assert "goal_lean" not in default_signals()[0]  # opt-in: a policy names it
