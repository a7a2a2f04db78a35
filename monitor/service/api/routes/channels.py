"""Notification channels: signed webhooks and the console."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response, status
from sqlalchemy import select

from monitor.service import paging
from monitor.service.api import responses
from monitor.service.deps import AdminDep, NowDep, SessionDep
from monitor.service.models import Channel, EscalationLevel, EscalationPolicy
from monitor.service.schemas import ChannelCreate, ChannelPublic

router = APIRouter(prefix="/api/v1/channels", tags=["channels"], responses=responses.AUTH)

ChannelName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")]


@router.get("", response_model=list[ChannelPublic], summary="List channels (secrets are not shown)")
def list_channels(session: SessionDep, _: AdminDep) -> list[ChannelPublic]:
    rows = session.scalars(select(Channel).order_by(Channel.name)).all()
    return [ChannelPublic.model_validate(c) for c in rows]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ChannelPublic,
             responses=responses.CONFLICT, summary="Create a webhook or console channel")
def create_channel(
    body: ChannelCreate, session: SessionDep, _: AdminDep, now: NowDep
) -> ChannelPublic:
    if session.scalar(select(Channel.id).where(Channel.name == body.name)):
        raise paging.Conflict(f"a channel named {body.name!r} exists")
    channel = Channel(name=body.name, kind=body.kind, url=body.url, secret=body.secret,
                      created_at=now)
    session.add(channel)
    session.commit()
    return ChannelPublic.model_validate(channel)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT,
               responses={**responses.NOT_FOUND, **responses.CONFLICT},
               summary="Delete a channel no policy names")
def delete_channel(name: ChannelName, session: SessionDep, _: AdminDep) -> Response:
    channel = session.scalar(select(Channel).where(Channel.name == name))
    if channel is None:
        raise paging.NotFound(f"no channel named {name!r}")
    users = sorted({
        policy
        for policy, targets in session.execute(
            select(EscalationPolicy.name, EscalationLevel.targets).join(EscalationLevel.policy)
        )
        if name in targets
    })
    if users:
        raise paging.Conflict(f"channel {name!r} is named by escalation policy {users[0]!r}")
    session.delete(channel)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
