"""The harm attribution a page carries: MPO credit assignment over the paged trajectory, with
the real world model (trained on a small real AgentDojo build) as the critic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from monitor.pipeline import Screener, StepVerdict
from monitor.rlhealth.attribution import harm_attribution, page_attributions
from monitor.scorers import RuleSignals, WorldModelSignals
from monitor.service.schemas import EventCreate
from monitor.stream.paging import page_event
from streams.records import Escalation, Trajectory, decode
from worldmodel.score import WorldModelScorer


def paged_hijacks(dataset: Path, n: int = 4) -> list[Trajectory]:
    """Hijacked AgentDojo trajectories cut at their first harmful step: the trajectory so far
    that a page for that step carries."""
    out = []
    for line in (dataset / "trajectories.jsonl").read_text().splitlines():
        t = decode(line, Trajectory)
        k = next((i for i, s in enumerate(t.steps) if s.label == 1), None)
        if t.meta.get("kind") == "hijacked" and k is not None and k > 0:
            out.append(t.model_copy(update={"steps": t.steps[: k + 1]}))
    assert len(out) >= n, "the small AgentDojo build has hijacked trajectories"
    return out[:n]


class CountingScorer(WorldModelScorer):
    calls = 0

    def score(self, steps):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().score(steps)


def test_a_page_attributes_harm_to_the_hijacked_step(
    tiny_worldmodel_bundle: Path, small_agentdojo: Path
) -> None:
    scorer = CountingScorer.load(tiny_worldmodel_bundle)
    # attribution reads only the world model among the L0 scorers; it never uses the policy
    screener = Screener(policy=None, l0=[RuleSignals(), WorldModelSignals(scorer)])  # type: ignore[arg-type]
    paged = paged_hijacks(small_agentdojo)
    atts = page_attributions(screener, paged)
    assert CountingScorer.calls == 1, "one batched world-model call for the pages of a batch"
    for traj, att in zip(paged, atts, strict=True):
        assert att is not None
        assert json.loads(json.dumps(att, allow_nan=False)) == att  # JSON, finite, lossless
        hijack = traj.steps[-1]
        assert hijack.label == 1 and hijack.action.tool is not None
        assert (att["harmful_call_id"], att["harmful_turn"]) == (
            hijack.step_id, len(traj.steps) - 1)
        assert att["step_id"] == hijack.step_id and att["trajectory_id"] == traj.trajectory_id
        assert (att["label"], att["label_source"], att["method"]) == (
            1.0, "page", "mpo-credit-assignment")
        assert (att["lambda"], att["lambda_intra"], att["beta"]) == (0.8, 0.95, 1.0)
        turns = att["turns"]
        assert [t["call_id"] for t in turns] == [s.step_id for s in traj.steps]
        assert turns[0]["value_start"] == 0.0  # the prior before the first turn
        for t in turns:
            assert all(math.isfinite(t[k]) for k in ("advantage", "residual", "value_start"))
            assert 0.0 <= t["value_start"] <= 1.0
            # the per-token split is mean-preserving
            assert np.mean(t["token_advantages"]) == pytest.approx(t["advantage"])
            top = t["top_tokens"][0]
            assert set(top) == {"position", "token_id", "advantage"}
        # the residuals telescope to R − V before the first turn
        assert sum(t["residual"] for t in turns) == pytest.approx(1.0)
        harmful = turns[att["harmful_turn"]]
        assert harmful["residual"] == max(t["residual"] for t in turns) > 0
    # one trajectory alone gives the same record (up to float batching in the model)
    alone = harm_attribution(screener, paged[0])
    assert alone is not None and alone["harmful_call_id"] == atts[0]["harmful_call_id"]
    assert [t["advantage"] for t in alone["turns"]] == pytest.approx(
        [t["advantage"] for t in atts[0]["turns"]], abs=1e-5)
    # the page event carries it, and the paging service's schema takes it
    event = page_event(_escalation(paged[0]), _verdict(paged[0]), [0.5, 0.5, 0.5],
                       attribution=atts[0])
    assert event.payload is not None
    assert (event.payload.custom_details.model_extra or {})["attribution"] == atts[0]
    # and what goes over the wire validates on the service's side
    EventCreate.model_validate(event.model_dump(mode="json", by_alias=True, exclude_unset=True))


def test_without_a_world_model_there_is_no_attribution(small_agentdojo: Path) -> None:
    traj = paged_hijacks(small_agentdojo, 1)[0]
    review_only = Screener(policy=None, l0=())  # type: ignore[arg-type]
    assert harm_attribution(review_only, traj) is None
    assert harm_attribution(Screener(policy=None, l0=[RuleSignals()]), traj) is None  # type: ignore[arg-type]
    event = page_event(_escalation(traj), _verdict(traj), [0.5, 0.5, 0.5])
    assert event.payload is not None
    assert "attribution" not in (event.payload.custom_details.model_extra or {})


def _escalation(t: Trajectory) -> Escalation:
    return Escalation(trajectory_id=t.trajectory_id, step_id=t.steps[-1].step_id, tier=2,
                      score=0.9, trajectory=t, source="deployment")


def _verdict(t: Trajectory) -> StepVerdict:
    return StepVerdict(t.trajectory_id, t.steps[-1].step_id, tier=3, score=0.9, flagged=True,
                       signals={"wm_harm_post": 0.8}, gate_scores=(0.9, 0.8, 0.7))
