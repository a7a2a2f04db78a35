"""Who am I, and API tokens (admins create and revoke them)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status
from sqlalchemy import select

from monitor.service import auth, paging
from monitor.service.api import responses
from monitor.service.deps import AdminDep, NowDep, PrincipalDep, SessionDep
from monitor.service.models import ApiToken
from monitor.service.schemas import MAX_ID, Me, TokenCreate, TokenCreated, TokenPublic

router = APIRouter(prefix="/api/v1", tags=["auth"], responses=responses.AUTH)


@router.get("/auth/me", response_model=Me, summary="The calling token's name and role")
def read_me(principal: PrincipalDep) -> Me:
    return Me(name=principal.name, role=principal.role)  # type: ignore[arg-type]


@router.get("/tokens", response_model=list[TokenPublic], summary="List API tokens (no secrets)")
def list_tokens(session: SessionDep, _: AdminDep) -> list[TokenPublic]:
    rows = session.scalars(select(ApiToken).order_by(ApiToken.id)).all()
    return [TokenPublic.model_validate(t) for t in rows]


@router.post("/tokens", status_code=status.HTTP_201_CREATED, response_model=TokenCreated,
             summary="Create an API token; the response is the only time it is shown")
def create_token(body: TokenCreate, session: SessionDep, _: AdminDep, now: NowDep) -> TokenCreated:
    row, token = auth.create_token(session, body.name, body.role, now=now)
    session.commit()
    return TokenCreated.model_validate({**TokenPublic.model_validate(row).model_dump(),
                                        "token": token})


@router.delete("/tokens/{token_id}", response_model=TokenPublic, responses=responses.NOT_FOUND,
               summary="Revoke an API token (its browser sessions end too)")
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, _: AdminDep,
    now: NowDep,
) -> TokenPublic:
    row = auth.revoke_token(session, token_id, now=now)
    if row is None:
        raise paging.NotFound(f"no token with id {token_id}")
    session.commit()
    return TokenPublic.model_validate(row)
