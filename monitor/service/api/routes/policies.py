"""Escalation policies: ordered levels of on-call channels, an ack timeout each, rounds."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from monitor.service import paging
from monitor.service.api import responses
from monitor.service.deps import AdminDep, NowDep, ReviewerDep, SessionDep
from monitor.service.models import OPEN, Channel, EscalationLevel, EscalationPolicy, Page
from monitor.service.schemas import LevelSpec, PolicyCreate, PolicyPublic, PolicyUpdate

router = APIRouter(prefix="/api/v1/policies", tags=["policies"], responses=responses.AUTH)

PolicyName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")]


def _get(session: Session, name: str) -> EscalationPolicy:
    policy = session.scalar(select(EscalationPolicy).where(EscalationPolicy.name == name))
    if policy is None:
        raise paging.NotFound(f"no escalation policy named {name!r}")
    return policy


def _levels(session: Session, specs: list[LevelSpec]) -> list[EscalationLevel]:
    names = {t for spec in specs for t in spec.targets}
    known = set(session.scalars(select(Channel.name).where(Channel.name.in_(names))))
    for i, spec in enumerate(specs):
        missing = [t for t in spec.targets if t not in known]
        if missing:
            raise paging.Invalid(
                f"level {i + 1} names channel {missing[0]!r}, which does not exist "
                "(create it with POST /api/v1/channels)"
            )
    return [
        EscalationLevel(position=i, ack_timeout_s=spec.ack_timeout_s, targets=list(spec.targets))
        for i, spec in enumerate(specs)
    ]


@router.get("", response_model=list[PolicyPublic], summary="List escalation policies")
def list_policies(session: SessionDep, _: ReviewerDep) -> list[PolicyPublic]:
    rows = session.scalars(select(EscalationPolicy).order_by(EscalationPolicy.name)).all()
    return [PolicyPublic.model_validate(p) for p in rows]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=PolicyPublic,
             responses=responses.CONFLICT, summary="Create an escalation policy")
def create_policy(
    body: PolicyCreate, session: SessionDep, _: AdminDep, now: NowDep
) -> PolicyPublic:
    if session.scalar(select(EscalationPolicy.id).where(EscalationPolicy.name == body.name)):
        raise paging.Conflict(f"an escalation policy named {body.name!r} exists")
    policy = EscalationPolicy(name=body.name, description=body.description, repeat=body.repeat,
                              created_at=now, levels=_levels(session, body.levels))
    session.add(policy)
    session.commit()
    return PolicyPublic.model_validate(policy)


@router.get("/{name}", response_model=PolicyPublic, responses=responses.NOT_FOUND,
            summary="Read an escalation policy")
def read_policy(name: PolicyName, session: SessionDep, _: ReviewerDep) -> PolicyPublic:
    return PolicyPublic.model_validate(_get(session, name))


@router.put("/{name}", response_model=PolicyPublic, responses=responses.NOT_FOUND,
            summary="Replace a policy's levels; open pages continue at their level number")
def update_policy(
    name: PolicyName, body: PolicyUpdate, session: SessionDep, _: AdminDep
) -> PolicyPublic:
    policy = _get(session, name)
    levels = _levels(session, body.levels)
    policy.description, policy.repeat = body.description, body.repeat
    policy.levels.clear()
    session.flush()  # old levels go before new ones take their positions
    policy.levels.extend(levels)
    session.commit()
    return PolicyPublic.model_validate(policy)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT,
               responses={**responses.NOT_FOUND, **responses.CONFLICT},
               summary="Delete a policy no open page uses")
def delete_policy(name: PolicyName, session: SessionDep, _: AdminDep) -> Response:
    policy = _get(session, name)
    in_use = session.scalar(
        select(func.count()).where(Page.policy_id == policy.id, Page.status.in_(OPEN))
    )
    if in_use:
        raise paging.Conflict(f"escalation policy {name!r} has {in_use} open page(s)")
    session.delete(policy)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
