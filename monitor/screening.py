"""What every tier sees of a step, and the protocols the tiers implement.

A :class:`ScreenStep` is one agent step with the context to judge it: the
trajectory's task and the steps before it (oldest first). The stream worker,
``monitor screen`` and ``POST /v1/screen`` all build these, so every tier sees
a step the same way wherever it came from.

Signals are named ``<scorer>_<what>`` (``wm_harm_pre``, ``probe_harm``,
``rv_fbeta``, ``rule_destructive``); each is "higher = more likely harmful"
and most are probabilities. The tier policy (``monitor.tiers``) combines them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streams.records import Source, Step, StepEvent, Trajectory

if TYPE_CHECKING:
    from probes.capture import ProbeStep
    from worldmodel.features import StepInput

HISTORY = 4  # earlier (observation, action) pairs a scorer is shown, as in training


@dataclass(frozen=True)
class ScreenStep:
    """One step to screen, with its trajectory context."""

    trajectory_id: str
    task: str
    step: Step
    history: tuple[Step, ...] = ()  # earlier steps of the same trajectory, oldest first
    source: Source = "deployment"
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def step_id(self) -> str:
        return self.step.step_id

    @property
    def key(self) -> str:
        """``trajectory_id/step_id``: the dedup key of a page for this step."""
        return f"{self.trajectory_id}/{self.step.step_id}"

    def history_pairs(self, k: int = HISTORY) -> tuple[tuple[str, str], ...]:
        pairs = [(s.observation.text, s.action.text) for s in self.history]
        return tuple(pairs[-k:]) if k else ()

    def to_worldmodel(self) -> StepInput:
        """The world model's view: the same fields ``worldmodel.features.step_input`` reads."""
        from worldmodel.datasets.format import View
        from worldmodel.features import StepInput

        s = self.step
        nxt = None
        if s.result is not None:
            nxt = View(text=s.result.text, screenshot=s.result.screenshot)
        gui = s.action.gui.model_dump(exclude_none=True) if s.action.gui else None
        return StepInput(
            task=self.task,
            observation=View(text=s.observation.text, screenshot=s.observation.screenshot),
            action_text=s.action.text,
            gui=gui,
            history=self.history_pairs(),
            next_observation=nxt,
        )

    def to_probe(self) -> ProbeStep:
        """The probes' view; activations a record carries (``meta.activations``) ride along."""
        from probes.capture import ProbeStep

        acts = self.step.model_extra.get("activations") if self.step.model_extra else None
        acts = acts or self.meta.get("activations")
        layers = model = pooling = None
        if isinstance(acts, Mapping) and "layers" in acts:
            layers = {int(k): v for k, v in acts["layers"].items()}
            model, pooling = acts.get("model_id"), acts.get("pooling")
        return ProbeStep(
            task=self.task,
            observation=self.step.observation.text,
            action=self.step.action.text,
            history=self.history_pairs(),
            step_id=self.key,
            activations=layers,
            activations_model=model,
            activations_pooling=pooling,
        )

    def trajectory_so_far(self) -> Trajectory:
        """The trajectory up to and including this step (DESIGN §2.1), for the next tier."""
        return Trajectory(
            trajectory_id=self.trajectory_id,
            source=self.source,
            task=self.task,
            steps=[*self.history, self.step],
            meta=dict(self.meta),
        )

    @classmethod
    def from_trajectory_so_far(cls, trajectory: Trajectory) -> ScreenStep:
        """The last step of ``trajectory``, with the ones before it as history."""
        if not trajectory.steps:
            raise ValueError(f"trajectory {trajectory.trajectory_id!r} has no steps")
        return cls(
            trajectory_id=trajectory.trajectory_id,
            task=trajectory.task,
            step=trajectory.steps[-1],
            history=tuple(trajectory.steps[:-1]),
            source=trajectory.source,
            meta=trajectory.meta,
        )


def screen_steps_of(trajectory: Trajectory) -> list[ScreenStep]:
    """Every step of a whole trajectory, each with the steps before it as history."""
    steps = trajectory.steps
    return [
        ScreenStep(
            trajectory_id=trajectory.trajectory_id,
            task=trajectory.task,
            step=s,
            history=tuple(steps[max(0, i - HISTORY) : i]),
            source=trajectory.source,
            meta=trajectory.meta,
        )
        for i, s in enumerate(steps)
    ]


def screen_step_of(event: StepEvent, history: Sequence[Step] = ()) -> ScreenStep:
    """A streamed step event, with the earlier steps of its trajectory the worker has seen."""
    return ScreenStep(
        trajectory_id=event.trajectory_id,
        task=event.task,
        step=event.step,
        history=tuple(history[-HISTORY:]),
        source=event.source,
        meta=event.meta,
    )


class Scorer(Protocol):
    """A tier's model: steps in, named signals out (one dict a step, same order).

    A scorer may leave out a signal it cannot compute for a step (``wm_harm_post``
    before the action has run); the policy treats a missing signal as unknown.
    """

    @property
    def name(self) -> str:
        """What the scorer is (``worldmodel``, ``rules``, ...)."""
        ...

    @property
    def signals(self) -> tuple[str, ...]:
        """Every signal name this scorer can produce."""
        ...

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]: ...


def absolute_screens(traj: Trajectory, base: Path) -> Trajectory:
    """``traj`` with its screenshot paths made absolute (a file's are relative to its folder,
    ``base``)."""

    def fix(obs: Any) -> Any:
        shot = obs.screenshot if obs is not None else None
        if not shot or shot.startswith("data:") or Path(shot).is_absolute():
            return obs
        return obs.model_copy(update={"screenshot": str(base / shot)})

    if not any(
        s.observation.screenshot or (s.result and s.result.screenshot) for s in traj.steps
    ):
        return traj
    steps = [
        s.model_copy(update={"observation": fix(s.observation), "result": fix(s.result)})
        for s in traj.steps
    ]
    return traj.model_copy(update={"steps": steps})
