"""The pre-execution check behind ``POST /v1/screen``: one model call at a time, batched.

Model calls are CPU-bound, so requests never run them side by side (they would
oversubscribe the cores). Requests that arrive while a batch is running wait
and go together into the next one: one batched call per tier
(:meth:`monitor.pipeline.Screener.check_actions`), in a worker thread, so the
event loop keeps serving the rest of the API.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

if TYPE_CHECKING:
    from monitor.pipeline import ActionCheck, Screener
    from streams.records import Action, Trajectory

log = logging.getLogger(__name__)


def policy_hash(screener: Screener) -> str:
    """A short content hash of the screener's calibrated policy (same policy, same hash)."""
    text = json.dumps(screener.policy.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class _Pending:
    trajectory: Trajectory
    action: Action
    done: asyncio.Future[ActionCheck]


@dataclass
class ScreenQueue:
    """Runs :meth:`check` requests through ``screener``, ``max_batch`` at most per call."""

    screener: Screener
    max_batch: int = 16
    policy: str = ""
    batches: int = 0  # model calls made so far
    _pending: list[_Pending] = field(default_factory=list)
    _drainer: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.policy = self.policy or policy_hash(self.screener)

    async def check(self, trajectory: Trajectory, action: Action) -> ActionCheck:
        """The screener's answer for one proposed action (waits for a batch slot)."""
        done: asyncio.Future[ActionCheck] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(trajectory, action, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="vigil-screen-batches")
        return await done

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: len(batch)]
            batch = [p for p in batch if not p.done.done()]  # the client went away
            if batch:
                await self._run(batch)

    async def _run(self, batch: list[_Pending]) -> None:
        self.batches += 1
        try:
            got = await run_in_threadpool(
                self.screener.check_actions, [(p.trajectory, p.action) for p in batch]
            )
        except Exception as e:  # noqa: BLE001 - delivered to the waiting requests
            if len(batch) > 1:  # one bad proposal must not fail the others: run them alone
                for p in batch:
                    await self._run([p])
                return
            log.exception("screening a proposed action failed")
            if not batch[0].done.done():
                batch[0].done.set_exception(e)
            return
        for p, check in zip(batch, got, strict=True):
            if not p.done.done():
                p.done.set_result(check)
