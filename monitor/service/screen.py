"""The pre-execution check behind ``POST /v1/screen``: one model call at a time, batched.

Model calls are CPU-bound, so requests never run them side by side (they would
oversubscribe the cores). Requests that arrive while a batch is running wait
and go together into the next one, in arrival order: one batched call per tier
(:meth:`monitor.pipeline.Screener.check_actions`), in a worker thread, so the
event loop keeps serving the rest of the API.

A batch holds at most ``max_batch`` requests and ``batch_chars`` characters of
text the models read (:func:`text_chars`; a request over that runs alone, once
the smaller ones that were waiting with it have gone). With the body limit and
the models' own cut of each text, a model call's cost is bounded, and a small
request waits for the call in flight, not for every large request queued before it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import deque
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


READ_CHARS = 16 * 1024  # of one text, about what the models read (the world model's
# pieces: 32 of 400 characters, ``worldmodel.features.chunks``; its whole-text embedding
# and the probe read less), so a longer text costs no more


def text_chars(trajectory: Trajectory, action: Action) -> int:
    """The cost of a screening request in characters the models read: of the task, every
    step's observation, action and result, and the proposed action, each up to
    ``READ_CHARS``."""
    texts = [trajectory.task, action.text]
    for s in trajectory.steps:
        texts += [s.observation.text, s.action.text, s.result.text if s.result else ""]
    return sum(min(len(t), READ_CHARS) for t in texts)


@dataclass
class _Pending:
    trajectory: Trajectory
    action: Action
    done: asyncio.Future[ActionCheck]
    chars: int
    passed_over: bool = False  # a call went without it once (it was too large): next time it goes


@dataclass
class ScreenQueue:
    """Runs :meth:`check` requests through ``screener``: per model call at most ``max_batch``
    requests and ``batch_chars`` characters of text (a larger request runs alone)."""

    screener: Screener
    max_batch: int = 16
    batch_chars: int = 128 * 1024
    policy: str = ""
    batches: int = 0  # model calls made so far
    _pending: deque[_Pending] = field(default_factory=deque)
    _drainer: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.policy = self.policy or policy_hash(self.screener)

    async def check(self, trajectory: Trajectory, action: Action) -> ActionCheck:
        """The screener's answer for one proposed action (waits for a batch slot)."""
        done: asyncio.Future[ActionCheck] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(trajectory, action, done, text_chars(trajectory, action)))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="vigil-screen-batches")
        return await done

    async def _drain(self) -> None:
        while self._pending:
            batch = self._next_batch()
            if batch:
                await self._run(batch)

    @property
    def waiting(self) -> int:
        """Requests waiting for a model call."""
        return len(self._pending)

    def _next_batch(self) -> list[_Pending]:
        """The waiting requests that go into the next model call, oldest first: each that fits
        in the room left of ``batch_chars``. One that does not is passed over once, so that
        small requests do not wait behind large ones; the next call then starts with the
        oldest passed-over request, alone if it fills the room (nothing waits for ever)."""
        batch: list[_Pending] = []
        left: deque[_Pending] = deque()
        chars = 0
        for _ in range(2):  # a second look only when every request was passed over
            while self._pending and len(batch) < self.max_batch:
                p = self._pending.popleft()
                if p.done.done():  # the client went away
                    continue
                if chars + p.chars <= self.batch_chars or (not batch and p.passed_over):
                    batch.append(p)
                    chars += p.chars
                else:
                    p.passed_over = True
                    left.append(p)
            self._pending.extendleft(reversed(left))
            left.clear()
            if batch or not self._pending:
                break
        return batch

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
