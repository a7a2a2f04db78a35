"""ASGI middleware the HTTP servers share: a request body over its limit is refused (413)
before it is read or parsed.

With a ``Content-Length`` header the limit is checked against it; without one (chunked) the
body is read up to the limit and replayed to the app, so no body larger than the limit is
ever held. ``limits``: a tighter limit for some paths, each with the setting that changes it
(the 413 names it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]


class BodyLimit:
    def __init__(self, app: Any, max_body_bytes: int, *, setting: str,
                 limits: Mapping[str, tuple[int, str]] | None = None,
                 who: str = "server") -> None:
        self.app = app
        self.who = who  # whose setting the 413 names ("the service's VIGIL_...")
        self.max_body_bytes = max_body_bytes
        self.setting = setting
        self.limits = dict(limits or {})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/") or "/"
        limit, setting = self.limits.get(path, (self.max_body_bytes, self.setting))
        too_big = (f"request body over the limit of {limit} bytes for {scope['method']} "
                   f"{scope['path']} (the {self.who}'s {setting})")
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None:
            try:
                over = int(length) > limit
            except ValueError:
                await reply(send, 400, "invalid Content-Length header")
                return
            if over:
                await reply(send, 413, too_big)
                return
            await self.app(scope, receive, send)
            return
        # no Content-Length (chunked): read up to the limit before the app sees it
        chunks: list[bytes] = []
        size = 0
        more = scope["method"] not in ("GET", "HEAD", "OPTIONS", "DELETE")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await reply(send, 413, too_big)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        if not chunks:
            await self.app(scope, receive, send)
            return
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def reply(send: Any, code: int, detail: Any,
                headers: Mapping[str, str] | None = None) -> None:
    """A JSON response ``{"detail": detail}`` straight onto the ASGI ``send``."""
    body = json.dumps({"detail": detail}).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
