"""The review stage's pages carry the harm attribution of their trajectory when the stage has a
world model; without one (a review-only process), or when attribution fails, they page all
the same, without it. Against the real paging service."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from monitor.demo import PagingServer
from monitor.pipeline import Screener, load_review_screener
from monitor.scorers import WorldModelSignals
from monitor.stream.paging import PagingClient
from monitor.stream.review import ReviewStage
from streams.bus import Message
from streams.config import Topics
from streams.records import Escalation, Trajectory, decode
from worldmodel.score import WorldModelScorer


def _paged_hijacks(dataset: Path, n: int) -> list[Trajectory]:
    """Hijacked AgentDojo trajectories, cut at their first harmful step (what a page carries)."""
    out = []
    for line in (dataset / "trajectories.jsonl").read_text().splitlines():
        t = decode(line, Trajectory)
        k = next((i for i, s in enumerate(t.steps) if s.label == 1), None)
        if t.meta.get("kind") == "hijacked" and k is not None and k > 0:
            out.append(t.model_copy(update={"steps": t.steps[: k + 1], "source": "deployment"}))
    return out[:n]


class BrokenWorldModel:
    def score(self, steps: object) -> list[object]:
        raise RuntimeError("CUDA error: device-side assert triggered")


def test_pages_carry_the_attribution_and_page_without_it_when_there_is_none(
    tiny_policy: Path, tiny_worldmodel_bundle: Path, small_agentdojo: Path, paging: PagingServer
) -> None:
    review_only = load_review_screener(tiny_policy)  # no L0: `monitor stream --role review`
    signals = {s: 0.999 for t in review_only.policy.config.tiers for s in t.signals}
    with_wm = dataclasses.replace(
        review_only, l0=[WorldModelSignals(WorldModelScorer.load(tiny_worldmodel_bundle))])
    broken = dataclasses.replace(review_only, l0=[WorldModelSignals(BrokenWorldModel())])  # type: ignore[arg-type]
    trajectories = _paged_hijacks(small_agentdojo, 4)
    client = PagingClient(paging.url, paging.producer_token)
    said: list[str] = []

    def review(screener: Screener, trajs: list[Trajectory]) -> None:
        stage = ReviewStage(screener, Topics(), paging=client, report=said.append)
        items = []
        for t in trajs:
            e = Escalation(trajectory_id=t.trajectory_id, step_id=t.steps[-1].step_id, tier=2,
                           score=0.9, signals=signals, trajectory=t, source="deployment")
            items.append((e, Message("vigil.escalations", 0, len(items), t.trajectory_id, b"")))
        stage.handle_batch(items)  # type: ignore[arg-type]

    review(with_wm, trajectories[:2])  # two pages of one batch: one world-model call
    review(review_only, trajectories[2:3])
    review(broken, trajectories[3:4])

    details = {a["dedup_key"]: a["details"] for p in paging.pages() for a in p["alerts"]}
    keys = [f"{t.trajectory_id}/{t.steps[-1].step_id}" for t in trajectories]
    assert sorted(details) == sorted(keys), "every step paged, attribution or not"
    for t, key in zip(trajectories[:2], keys[:2], strict=True):
        att = details[key]["attribution"]
        assert att["harmful_call_id"] == t.steps[-1].step_id  # the hijacked step
        assert att["label"] == 1.0 and att["label_source"] == "page"
        assert len(att["turns"]) == len(t.steps)
    assert "attribution" not in details[keys[2]]
    assert "attribution" not in details[keys[3]]
    failed = [m for m in said if "harm attribution failed" in m]
    assert len(failed) == 1 and "device-side assert" in failed[0]
    assert sum(m.startswith("PAGE ") for m in said) == 4
