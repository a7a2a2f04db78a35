"""The page event is one model: what the worker builds is what the paging service validates,
and an event the service would refuse is refused before it is sent."""

from __future__ import annotations

import pytest

from dashboards.canary import CANARY_KEY
from monitor.pipeline import StepVerdict
from monitor.service.schemas import EventCreate
from monitor.stream.paging import PageRejected, page_event
from streams.records import Action, Escalation, Observation, Step, ToolCall, Trajectory


def _trajectory(tid: str = "deploy-7", **meta: object) -> Trajectory:
    step = Step(step_id="s2", index=1, observation=Observation(text="inbox"),
                action=Action(text="", tool=ToolCall(name="send_money",
                                                     arguments={"iban": "XX00", "amount": 9})))
    return Trajectory(trajectory_id=tid, task="pay the rent", steps=[step],
                      meta={"execution_id": "ex-1", **meta})


def _page(traj: Trajectory, **kw: object) -> EventCreate:
    esc = Escalation(trajectory_id=traj.trajectory_id, step_id="s2", tier=2, score=0.9,
                     trajectory=traj, source="deployment")
    v = StepVerdict(traj.trajectory_id, "s2", tier=3, score=0.93, flagged=True,
                    signals={"wm_harm_post": 0.8, "probe_harm": float("nan")},
                    gate_scores=(0.9, 0.8, 0.7))
    return page_event(esc, v, [0.5, 0.6, 0.65], **kw)  # type: ignore[arg-type]


def test_the_page_event_is_what_the_service_takes() -> None:
    event = _page(_trajectory())
    assert event.dedup_key == "deploy-7/s2" and event.event_action == "trigger"
    assert event.payload is not None
    d = event.payload.custom_details
    assert (d.trajectory_id, d.step_id, d.execution_id) == ("deploy-7", "s2", "ex-1")
    assert [s.tier for s in d.scores] == [0, 1, 2] and d.scores[2].flagged
    assert d.scores[2].signals == {"wm_harm_post": 0.8}  # NaN never goes on the wire
    assert "send_money" in event.payload.summary
    wire = event.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert EventCreate.model_validate(wire) == EventCreate.model_validate(wire)
    back = EventCreate.model_validate(wire)
    assert back.payload is not None and back.payload.custom_details.trajectory == _trajectory()


def test_an_event_the_service_would_refuse_is_a_page_rejected() -> None:
    with pytest.raises(PageRejected, match="at most 255 characters"):
        _page(_trajectory("t" * 300))  # the dedup key is at most 255 characters
    with pytest.raises(PageRejected, match="canar"):
        _page(_trajectory(**{CANARY_KEY: {"canary_id": "c1", "instance": "i"}}))
