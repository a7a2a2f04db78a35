"""Error responses the routes declare in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

from monitor.service.schemas import Problem, ValidationProblem

AUTH: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "malformed request (e.g. a body that is not JSON)"},
    401: {"model": Problem, "description": "no token, or an unknown or revoked one"},
    403: {"model": Problem, "description": "the token's role may not do this"},
    422: {"model": ValidationProblem, "description": "the request does not validate"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such item"}
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": Problem, "description": "conflicts with the current state"}
}
BAD_REQUEST: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "refused, with the reason"}
}
