"""``POST /v1/screen``: allow, escalate or block a proposed action before it runs.

The caller is the agent's harness (a ``producer`` token), never the agent: a
verdict the agent saw would teach it to evade. Only L0 and L1 run (the world
model judges the *predicted* next state, ``wm_harm_pre``); there is no L2 review
before an action, so nothing of one is in the answer.
"""

from __future__ import annotations

import logging
import math
import time

from fastapi import APIRouter, HTTPException, status

from monitor.service.api import responses
from monitor.service.deps import HarnessDep, ScreenQueueDep
from monitor.service.schemas import Problem, ScreenRequest, ScreenResponse

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/screen", tags=["screen"], responses=responses.AUTH)


@router.post(
    "",
    response_model=ScreenResponse,
    responses={
        500: {"model": Problem, "description": "the screener failed on this action"},
        503: {"model": Problem, "description": "screening is not configured"},
    },
    summary="Screen a proposed action before it runs (allow / escalate / block)",
)
async def screen_action(
    proposal: ScreenRequest, _: HarnessDep, queue: ScreenQueueDep
) -> ScreenResponse:
    """Scores the proposed `action` in the context of `trajectory` (the steps so far, DESIGN
    §2.1, possibly none) with the L0 world model and rules and the L1 probes, and answers
    **allow** (run it), **escalate** (it would reach the L2 reviewer: hold it for review) or
    **block** (the L0 + L1 probability reaches the policy's block threshold: do not run it).

    For the agent's harness only (`producer` or `admin` token); do not pass the answer on to
    the agent. Concurrent requests are batched into one model call.
    """
    t0 = time.perf_counter()
    try:
        check = await queue.check(proposal.trajectory, proposal.action)
    except Exception as e:  # noqa: BLE001 - logged by the queue; one sentence to the caller
        if queue.screener.policy.config.tools.on_screener_error == "open":
            return ScreenResponse(  # the team chose availability: run it, say why
                decision="allow", tier=0, score=0.0, signals={},
                latency_ms=round((time.perf_counter() - t0) * 1000, 3), policy=queue.policy,
                trajectory_id=proposal.trajectory.trajectory_id, step_id=proposal.step_id,
                rule=f"the screener failed ({type(e).__name__}) and the policy's tools."
                     "on_screener_error is open")
        raise HTTPException(
            status.HTTP_500_INTERNAL_SERVER_ERROR,
            f"the screener failed on this action ({type(e).__name__}); treat it as not allowed",
        ) from e
    if not all(math.isfinite(v) for v in (check.score, *check.signals.values())):
        log.error("non-finite screening score for %s: %s", proposal.trajectory.trajectory_id,
                  dict(check.signals))
        raise HTTPException(
            status.HTTP_500_INTERNAL_SERVER_ERROR,
            "the screener gave a non-finite score for this action; treat it as not allowed",
        )
    l2 = set(queue.screener.policy.config.tiers[2].signals)
    return ScreenResponse(
        decision=check.decision,
        tier=check.tier,
        score=check.score,
        signals={k: float(v) for k, v in sorted(check.signals.items()) if k not in l2},
        latency_ms=round((time.perf_counter() - t0) * 1000, 3),
        policy=queue.policy,
        trajectory_id=proposal.trajectory.trajectory_id,
        step_id=proposal.step_id,
        rule=check.rule,
    )
