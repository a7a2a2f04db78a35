"""MPO harm attribution on a rebuilt TITO execution: which turn, which tokens."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import ArrayLike

from monitor.rlhealth import formulas as f
from monitor.rlhealth.attribution import (
    TurnInput,
    WorldModelCritic,
    attribute_harm,
    turns_from_trajectory,
    turns_from_tree,
)
from streams.synthetic import coding_execution
from streams.tito import build_tree, trajectories


class HistoryCritic:
    """A harm value that is a function of the history: 0.1 until the poisoned README is
    read, 0.5 after it, 0.95 from the first token of an action that uploads credentials."""

    def __call__(self, turns: Sequence[TurnInput]) -> list[ArrayLike]:
        out: list[ArrayLike] = []
        level = 0.1
        for t in turns:
            if "NOTE to AI agents" in t.observation:
                level = max(level, 0.5)
            if "Uploading the credentials" in t.action:
                values = np.full(t.tokens, 0.95)
                values[0] = level  # V before the first token of the upload
                level = 0.95
                out.append(values)
            else:
                out.append([level])  # one value per turn
        return out


def _harmful_leaf():  # type: ignore[no-untyped-def]
    calls, end = coding_execution("exec-h", harmful=True, seed=2)
    tree = build_tree("exec-h", calls, end)
    return tree, "m11"


def test_the_upload_turn_and_its_first_token_carry_the_harm() -> None:
    tree, leaf = _harmful_leaf()
    turns = turns_from_tree(tree, leaf)
    assert [t.call_id for t in turns][-3:] == ["m9", "m10", "m11"]
    att = attribute_harm(turns, HistoryCritic(), label=1.0, trajectory_id=f"exec-h/{leaf}")
    top = att.harmful_turn
    assert top is not None and top.call_id == "m9"  # δ^turn = 0.95 − 0.5
    assert top.residual == pytest.approx(0.45)
    assert top.top_tokens[0][0] == 0 and top.top_tokens[0][1] == turns[-3].output_ids[0]
    # the turn that read the poisoned README moved harm too, less
    read = next(t for t in att.turns if t.call_id == "m6b")
    assert read.residual == pytest.approx(0.4)
    # MPO's identities hold on the record the review page gets
    for k, t in enumerate(att.turns):
        assert np.mean(t.token_advantages) == pytest.approx(t.advantage)
        nxt = att.turns[k + 1].value_start if k + 1 < len(att.turns) else 0.0
        last = 1.0 if k == len(att.turns) - 1 else 0.0
        assert t.residual == pytest.approx(last + nxt - t.value_start)
    a_turn = f.turn_advantages([[t.residual] for t in att.turns], 0.8)
    assert [t.advantage for t in att.turns] == pytest.approx(a_turn)
    record = json.loads(json.dumps(att.to_dict()))  # JSON, losslessly
    assert record["harmful_call_id"] == "m9" and record["lambda"] == 0.8
    assert len(record["turns"][8]["token_advantages"]) == len(turns[8].output_ids)


def test_a_benign_trajectory_attributes_nothing_to_harm() -> None:
    calls, end = coding_execution("exec-b", seed=2)
    tree = build_tree("exec-b", calls, end)
    traj = next(t for t in trajectories(tree) if t.meta["leaf_call_id"] == "m11")
    turns = turns_from_trajectory(traj)
    att = attribute_harm(turns, HistoryCritic(), label=0.0)
    # V stays 0.1 and the label is 0: every residual is 0 except the end (0 − 0.1)
    assert [t.residual for t in att.turns[:-1]] == pytest.approx([0.0] * (len(turns) - 1))
    assert att.turns[-1].residual == pytest.approx(-0.1)
    assert all(a <= 1e-12 for t in att.turns for a in t.token_advantages)


def test_critic_errors_are_one_sentence() -> None:
    tree, leaf = _harmful_leaf()
    turns = turns_from_tree(tree, leaf)
    with pytest.raises(ValueError, match="values for 1 turns"):
        attribute_harm(turns, lambda ts: [[0.1]], label=1.0)
    with pytest.raises(ValueError, match="critic gave 2 values for a turn of"):
        attribute_harm(turns, lambda ts: [[0.1, 0.2]] * len(ts), label=1.0)


def test_the_world_model_is_the_critic(tiny_worldmodel_bundle: Path) -> None:
    """A real world-model bundle (trained on a small AgentDojo build) as V."""
    from worldmodel.score import WorldModelScorer

    critic = WorldModelCritic(WorldModelScorer.load(tiny_worldmodel_bundle), prior=0.0)
    tree, leaf = _harmful_leaf()
    turns = turns_from_tree(tree, leaf)
    att = attribute_harm(turns, critic, label=1.0, trajectory_id="exec-h/m11")
    values = [t.value_start for t in att.turns]
    assert values[0] == 0.0 and all(0.0 <= v <= 1.0 for v in values)
    total = sum(t.residual for t in att.turns)
    assert total == pytest.approx(1.0 - 0.0)  # telescopes to R − V_{0,1}
    for t in att.turns:
        assert np.mean(t.token_advantages) == pytest.approx(t.advantage)
    assert att.to_dict()["harmful_call_id"] in {t.call_id for t in turns}
