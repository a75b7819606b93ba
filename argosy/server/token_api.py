"""REST routes of API tokens under /api/v1/tokens, admin only: create (the secret is
answered once), list (ids, scopes, expiry, revocation; never a secret or hash), revoke.

    POST   /api/v1/tokens        {"queue": "team-a", "name": "ci", "expires": "30d"}
    GET    /api/v1/tokens
    DELETE /api/v1/tokens/{id}   # 404 unknown id, 409 the server's own admin token

Creating and revoking a token are events (`token_created`, `token_revoked`) that name
the admin who did it.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request

from argosy.server.api import COMMON, Admin, Ctl
from argosy.server.auth import ProtectedTokenError, Tokens
from argosy.server.field_errors import RefusedError, field_errors
from argosy.server.schemas import ErrorBody, TokenCreated, TokenInfo, TokenRequest
from argosy.server.store import Row
from argosy.server.views import iso

router = APIRouter(prefix="/api/v1", responses=COMMON)
FORBIDDEN = {403: {"model": ErrorBody, "description": "Needs an admin token"}}
TokenId = Annotated[str, Path(min_length=1, max_length=32)]


def tokens(request: Request) -> Tokens:
    return request.app.state.tokens


@router.post("/tokens", status_code=201, responses=FORBIDDEN)
async def create_token(body: TokenRequest, ctl: Ctl, who: Admin, request: Request) -> TokenCreated:
    """A new token: admin (no queue) or scoped to one leaf queue, optionally expiring.
    The token itself is in this answer only."""
    tree = ctl.scheduling.sched.tree
    if body.queue is not None and body.queue not in tree.leaves:
        why = tree.leaf_error(body.queue)
        raise HTTPException(422, field_errors(RefusedError(why, "queue")))
    lifetime_s = body.lifetime_s()
    expires_at = None if lifetime_s is None else time.time() + lifetime_s
    token, row = tokens(request).create(
        body.queue, body.name, expires_at=expires_at, actor=who.actor
    )
    return TokenCreated(
        token=token,
        id=row["id"],
        queue=row["queue"],
        name=row["name"],
        expires_at=iso(row["expires_at"]),
    )


@router.get("/tokens", responses=FORBIDDEN)
async def list_tokens(who: Admin, request: Request) -> list[TokenInfo]:
    """Every token, oldest first: id, scope, expiry and revocation, never a secret."""
    now = time.time()
    return [token_info(row, now) for row in tokens(request).rows()]


@router.delete(
    "/tokens/{token_id}",
    responses={
        **FORBIDDEN,
        404: {"model": ErrorBody, "description": "No token with this id"},
        409: {"model": ErrorBody, "description": "The server's own admin token"},
    },
)
async def revoke_token(token_id: TokenId, who: Admin, request: Request) -> TokenInfo:
    """Revoke a token at once (its console sessions end too); revoking it again is a
    no-op that answers the same."""
    try:
        row = tokens(request).revoke(token_id, actor=who.actor)
    except ProtectedTokenError as err:
        raise HTTPException(409, str(err)) from err
    if row is None:
        raise HTTPException(404, f"no token '{token_id}'")
    return token_info(row, time.time())


def token_info(row: Row, now: float) -> TokenInfo:
    if row["revoked_at"] is not None:
        state = "revoked"
    elif row["expires_at"] is not None and row["expires_at"] <= now:
        state = "expired"
    else:
        state = "active"
    return TokenInfo(
        id=row["id"],
        name=row["name"],
        queue=row["queue"],
        state=state,
        created_at=iso(row["created_at"]) or "",
        expires_at=iso(row["expires_at"]),
        revoked_at=iso(row["revoked_at"]),
        created_by=row["created_by"],
    )
