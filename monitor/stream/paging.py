"""The paging client: a tier-3 step as a page event, sent to the paging service.

The event is :class:`monitor.service.schemas.EventCreate`, the very model the service
validates ``POST /api/v1/events`` with, so the worker cannot send what the service would
refuse for its shape: an event that does not validate here is a :class:`PageRejected`
(a bad record), as a 400/422 from the service is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from monitor.service.schemas import CaseDetails, EventCreate, EventPayload, TierScore
from monitor.stream.stats import clip01, finite
from streams.processor import RetryLater
from streams.records import Escalation

if TYPE_CHECKING:
    from monitor.pipeline import StepVerdict


class PagingUnavailable(RetryLater):  # noqa: N818 - a RetryLater
    """The paging service did not take the page (unreachable, 5xx, auth): retry the batch."""


class PageRejected(ValueError):
    """The page is invalid (refused by the event schema here or by the service, HTTP 400/422):
    a bad record."""


@dataclass(frozen=True)
class PagingClient:
    """Triggers pages through the paging service's HTTP API (``POST /api/v1/events``)."""

    url: str
    token: str
    timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5

    def trigger(self, event: EventCreate) -> str:
        """Send one trigger event; return the service's message ("page opened", "deduplicated")."""
        import httpx

        endpoint = self.url.rstrip("/") + "/api/v1/events"
        headers = {"Authorization": f"Bearer {self.token}"}
        body = event.model_dump(mode="json", by_alias=True, exclude_unset=True)
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = httpx.post(endpoint, json=body, headers=headers, timeout=self.timeout_s)
            except httpx.HTTPError as e:
                last = f"cannot reach the paging service at {self.url}: {type(e).__name__}: {e}"
                continue
            if r.status_code in (200, 201, 202):
                return str(r.json().get("message", "accepted"))
            detail = _detail(r)
            if r.status_code in (400, 422):
                raise PageRejected(f"the paging service refused the page: {detail}")
            last = f"the paging service answered HTTP {r.status_code}: {detail}"
            if r.status_code in (401, 403, 404):
                break  # configuration: waiting a few seconds will not help; the batch waits
        raise PagingUnavailable(last)


def _detail(r: Any) -> str:
    try:
        return str(r.json().get("detail"))[:300]
    except ValueError:
        return str(r.text)[:300]


def page_event(
    escalation: Escalation,
    v: StepVerdict,
    thresholds: Sequence[float],
    *,
    attribution: Mapping[str, Any] | None = None,
) -> EventCreate:
    """The trigger event of a tier-3 step: dedup key ``trajectory_id/step_id`` (docs/service.md);
    ``attribution``: the harm attribution of the trajectory so far, when there is one.
    Raises :class:`PageRejected` when the event does not validate."""
    traj = escalation.trajectory
    assert traj is not None
    step = traj.steps[-1]
    a = step.action
    what = f"{a.tool.name}({', '.join(map(str, a.tool.arguments))})" if a.tool else a.text
    what = " ".join(what.split())[:160]
    signals = finite(v.signals)
    scores = [
        TierScore(
            tier=k,
            score=clip01(p),
            threshold=float(thresholds[k]),
            flagged=bool(v.tier > k),
            signals=signals if k == len(v.gate_scores) - 1 else {},
        )
        for k, p in enumerate(v.gate_scores)
    ]
    extra: dict[str, Any] = {}
    if attribution is not None:
        extra["attribution"] = dict(attribution)
    eid = traj.meta.get("execution_id")
    try:
        details = CaseDetails(
            trajectory=traj,
            trajectory_id=traj.trajectory_id,
            execution_id=eid if isinstance(eid, str) and eid else None,
            step_id=step.step_id,
            scores=scores,
            rubric=v.review.to_dict() if v.review is not None else None,
            **extra,
        )
        return EventCreate(
            event_action="trigger",
            dedup_key=f"{traj.trajectory_id}/{step.step_id}",
            payload=EventPayload(
                summary=f"{traj.trajectory_id} step {step.step_id}: {what} "
                f"(harm {v.score:.2f}, L3)"[:1024],
                source=escalation.source,
                severity="critical",
                custom_details=details,
            ),
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first.get("loc", ()))) or "event"
        raise PageRejected(f"the page event is invalid: {where}: {first.get('msg')}") from None
