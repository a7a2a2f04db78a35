"""The trajectory so far: what the screen stage remembers of each trajectory to give a step
its history, and how an escalation's trajectory is cut to fit the bus."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from monitor.screening import HISTORY
from streams.records import Step, StepEvent, Trajectory

ESCALATION_MAX_BYTES = 512 * 1024  # an escalation's trajectory is cut to fit the bus


class TrajectoryHistory:
    """The recent steps of the last ``max_trajectories`` trajectories (LRU), in memory.

    A rollout step names its parent (``meta.parent_step_id``, from the tree
    reconstruction): its history is the chain of its ancestors. Any other step's
    history is the steps of its trajectory that arrived before it.
    """

    def __init__(self, max_trajectories: int = 10_000, max_steps: int = 64) -> None:
        self.max_trajectories = max_trajectories
        self.max_steps = max_steps
        self._steps: OrderedDict[str, OrderedDict[str, tuple[Step, str | None]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._steps)

    def before(
        self, event: StepEvent, pending: Mapping[str, Mapping[str, tuple[Step, str | None]]] = {}
    ) -> list[Step]:
        """The earlier steps of ``event``'s trajectory, oldest first (``pending``: steps of
        the current batch not yet added)."""
        tid = event.trajectory_id
        known: dict[str, tuple[Step, str | None]] = {
            **self._steps.get(tid, {}), **pending.get(tid, {})
        }
        parent = event.meta.get("parent_step_id") if event.meta else None
        if "parent_step_id" in (event.meta or {}):
            chain: list[Step] = []
            while isinstance(parent, str) and parent in known and len(chain) < HISTORY:
                step, parent = known[parent]
                chain.append(step)
            return chain[::-1]
        earlier = [s for s, _ in known.values() if s.step_id != event.step.step_id]
        return earlier[-HISTORY:]

    def add(self, trajectory_id: str, steps: Iterable[tuple[Step, str | None]]) -> None:
        got = self._steps.pop(trajectory_id, None) or OrderedDict()
        for step, parent in steps:
            got.pop(step.step_id, None)
            got[step.step_id] = (step, parent)
        while len(got) > self.max_steps:
            got.popitem(last=False)
        self._steps[trajectory_id] = got
        while len(self._steps) > self.max_trajectories:
            self._steps.popitem(last=False)

    def forget(self, trajectory_id: str) -> None:
        self._steps.pop(trajectory_id, None)


def fit_trajectory(traj: Trajectory, max_bytes: int = ESCALATION_MAX_BYTES) -> Trajectory:
    """``traj`` cut to at most about ``max_bytes`` of JSON, for an escalation record: the
    oldest steps go first, then the texts of what is left are cut (``meta.vigil_cut``
    says so). The step being escalated is always kept."""
    size = len(traj.model_dump_json())
    if size <= max_bytes:
        return traj
    steps = list(traj.steps)
    while len(steps) > 1 and size > max_bytes:
        size -= len(steps[0].model_dump_json())
        steps.pop(0)
    if size > max_bytes:
        texts = max(1, (max_bytes - 4096) // 8)  # task + 3 texts a step, 2 steps' worth

        def cut(text: str) -> str:
            return text if len(text) <= texts else text[:texts] + " [... cut by vigil]"

        fitted = []
        for st in steps:
            upd: dict[str, Any] = {
                "observation": st.observation.model_copy(update={"text": cut(st.observation.text)}),
                "action": st.action.model_copy(update={"text": cut(st.action.text)}),
            }
            if st.result is not None:
                upd["result"] = st.result.model_copy(update={"text": cut(st.result.text)})
            fitted.append(st.model_copy(update=upd))
        steps = fitted
    return traj.model_copy(update={"steps": steps, "task": traj.task[: 4 * max_bytes // 8],
                                   "meta": {**traj.meta, "vigil_cut": True}})
