"""Harm attribution across turns and tokens: MPO's credit assignment with a harm critic.

For a trajectory with a terminal harm label ``R`` (1 harmful, 0 benign) and a
critic ``V`` (the world model's harm value of the history, or any model that
scores a history), the attribution is MPO's advantage with harm as the reward:

    δ_{t,i} = r_{t,i} + V_{t,i+1} − V_{t,i}                   token TD residuals
    A_t     = Σ_i δ_{t,i} + λ A_{t+1}             (λ = 0.8)    turn-level GAE
    A_{t,i} = A_t + β (A^intra_{t,i} − mean_i A^intra_t)       mean-preserving split
    A^intra_{t,i} = Σ_{j≥i} λ_intra^{j−i} δ_{t,j}  (λ_intra = 0.95, β = 1)

A positive value moved the trajectory toward harm. :func:`attribute_harm`
returns a :class:`HarmAttribution` whose ``to_dict`` is the JSON the review
page renders: per turn its values, residual and advantage, per token its
advantage, and the turn and tokens that moved it most.

A critic is anything with ``__call__(turns) -> per-turn values``: an array of
``L_t`` values (``V`` at each token boundary of turn ``t``) or a single value
(``V`` at the start of the turn, the same at every boundary inside it).
:class:`WorldModelCritic` is the world model's: ``V`` at the start of turn ``t``
is the harm read from the observed result of turn ``t − 1`` (``harm_post``,
else the pre-execution ``harm_pre``), and ``prior`` before the first turn.

A page (the streaming worker's review stage) carries the attribution of its
trajectory so far with R = 1, the page's own claim: :func:`page_attributions`
(one batched world-model call for a batch of pages) and :func:`harm_attribution`
(one trajectory) return the JSON, or None when the screener has no world model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from monitor.rlhealth import formulas as f
from streams.records import Trajectory
from streams.tito import ExecutionTree

if TYPE_CHECKING:
    from monitor.pipeline import Screener
    from worldmodel.score import WorldModelScorer


@dataclass(frozen=True)
class TurnInput:
    """One assistant turn of a trajectory, as a critic sees it."""

    call_id: str
    role: str
    task: str
    observation: str  # what the agent saw before this turn (new observation only)
    action: str  # the turn's output text
    output_ids: tuple[int, ...]
    result: str | None = None  # what the environment returned, when known

    @property
    def tokens(self) -> int:
        return max(1, len(self.output_ids))


class Critic(Protocol):
    """``V`` for each turn: ``L_t`` token-boundary values, or one value for the turn."""

    def __call__(self, turns: Sequence[TurnInput]) -> Sequence[ArrayLike]: ...


def turns_from_trajectory(trajectory: Trajectory) -> list[TurnInput]:
    """The turns of an interchange trajectory (a rebuilt TITO leaf carries ``output_ids``)."""
    out = []
    for s in trajectory.steps:
        ids = (s.model_extra or {}).get("output_ids") or []
        out.append(
            TurnInput(
                call_id=s.step_id,
                role=s.role,
                task=trajectory.task,
                observation=s.observation.text,
                action=s.action.text,
                output_ids=tuple(int(i) for i in ids),
                result=s.result.text if s.result is not None else None,
            )
        )
    return out


def turns_from_tree(tree: ExecutionTree, leaf_call_id: str) -> list[TurnInput]:
    """The turns on the path from the top of ``leaf_call_id``'s tree down to it."""
    path = tree.path(leaf_call_id)
    task = path[0].call.input_text or ""
    out = []
    for k, node in enumerate(path):
        nxt = path[k + 1].provenance.observation_text if k + 1 < len(path) else None
        out.append(
            TurnInput(
                call_id=node.call_id,
                role=node.role,
                task=task,
                observation=node.provenance.observation_text,
                action=node.provenance.action_text,
                output_ids=tuple(node.call.output_ids),
                result=nxt,
            )
        )
    return out


@dataclass(frozen=True)
class TurnAttribution:
    index: int
    call_id: str
    role: str
    action: str
    value_start: float  # V_{t,1}
    value_next: float  # V_{t+1,1} (0 after the last turn)
    residual: float  # δ^turn_t = 1{t=T} R + V_{t+1,1} − V_{t,1}
    advantage: float  # A_t
    token_advantages: tuple[float, ...]  # A_{t,i}, mean = A_t
    top_tokens: tuple[tuple[int, int, float], ...]  # (position, token id, A_{t,i})


@dataclass(frozen=True)
class HarmAttribution:
    trajectory_id: str
    label: float
    lam: float
    lam_intra: float
    beta: float
    turns: tuple[TurnAttribution, ...]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def harmful_turn(self) -> TurnAttribution | None:
        """The turn whose own step moved the harm value up the most (largest ``δ^turn``)."""
        if not self.turns:
            return None
        return max(self.turns, key=lambda t: t.residual)

    def to_dict(self) -> dict[str, Any]:
        top = self.harmful_turn
        return {
            "trajectory_id": self.trajectory_id,
            "label": self.label,
            "method": "mpo-credit-assignment",
            "lambda": self.lam,
            "lambda_intra": self.lam_intra,
            "beta": self.beta,
            "harmful_turn": None if top is None else top.index,
            "harmful_call_id": None if top is None else top.call_id,
            "turns": [
                {
                    "index": t.index,
                    "call_id": t.call_id,
                    "role": t.role,
                    "action": t.action,
                    "value_start": t.value_start,
                    "value_next": t.value_next,
                    "residual": t.residual,
                    "advantage": t.advantage,
                    "token_advantages": list(t.token_advantages),
                    "top_tokens": [
                        {"position": p, "token_id": tid, "advantage": a}
                        for p, tid, a in t.top_tokens
                    ],
                }
                for t in self.turns
            ],
            **self.params,
        }


def _token_values(v: ArrayLike, length: int) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    if a.size == 1:
        return np.full(length, float(a[0]))
    if a.size != length:
        raise ValueError(f"critic gave {a.size} values for a turn of {length} tokens")
    return a


def attribute_harm(
    turns: Sequence[TurnInput],
    critic: Critic,
    label: float,
    *,
    trajectory_id: str = "",
    lam: float = 0.8,
    lam_intra: float = 0.95,
    beta: float = 1.0,
    top_k: int = 5,
) -> HarmAttribution:
    """Which turn, and which tokens in it, moved the trajectory toward its harm label."""
    if not turns:
        return HarmAttribution(trajectory_id, float(label), lam, lam_intra, beta, ())
    raw = list(critic(turns))
    if len(raw) != len(turns):
        raise ValueError(f"critic gave values for {len(raw)} turns, expected {len(turns)}")
    values = [_token_values(v, t.tokens) for v, t in zip(raw, turns, strict=True)]
    deltas = f.td_residuals(values, float(label))
    a_turn = f.turn_advantages(deltas, lam)
    out = []
    for t, (turn, d) in enumerate(zip(turns, deltas, strict=True)):
        per_token = f.mean_preserving_split(
            float(a_turn[t]), f.intra_turn_trace(d, lam_intra), beta
        )
        order = np.argsort(-per_token, kind="stable")[:top_k]
        ids = turn.output_ids or (0,)
        out.append(
            TurnAttribution(
                index=t,
                call_id=turn.call_id,
                role=turn.role,
                action=turn.action,
                value_start=float(values[t][0]),
                value_next=float(values[t + 1][0]) if t + 1 < len(values) else 0.0,
                residual=float(d.sum()),
                advantage=float(a_turn[t]),
                token_advantages=tuple(float(x) for x in per_token),
                top_tokens=tuple((int(i), int(ids[i]), float(per_token[i])) for i in order),
            )
        )
    return HarmAttribution(trajectory_id, float(label), lam, lam_intra, beta, tuple(out))


class WorldModelCritic:
    """The world model's harm value as MPO's critic (one value per turn).

    ``V_{t,1}`` is the harm of the state before turn ``t``: ``prior`` for the
    first turn, then the harm the world model reads from turn ``t − 1``'s
    observed result (``harm_post``), or predicts for it before it runs
    (``harm_pre``) when the result is unknown.
    """

    def __init__(self, scorer: WorldModelScorer, prior: float = 0.0) -> None:
        self.scorer = scorer
        self.prior = prior

    def __call__(self, turns: Sequence[TurnInput]) -> list[ArrayLike]:
        return self.values_many([turns])[0]

    def values_many(self, trajectories: Sequence[Sequence[TurnInput]]) -> list[list[ArrayLike]]:
        """The values of several trajectories' turns with one batched call of the world model."""
        from worldmodel.datasets.format import View
        from worldmodel.features import StepInput

        steps: list[StepInput] = []
        spans: list[tuple[int, int]] = []
        for turns in trajectories:
            start = len(steps)
            history: list[tuple[str, str]] = []
            for t in turns[:-1]:  # the last turn's own harm is no turn's V
                steps.append(
                    StepInput(
                        task=t.task,
                        observation=View(text=t.observation),
                        action_text=t.action,
                        history=tuple(history),
                        next_observation=View(text=t.result) if t.result is not None else None,
                    )
                )
                history.append((t.observation, t.action))
            spans.append((start, len(steps)))
        scores = self.scorer.score(steps) if steps else []
        out: list[list[ArrayLike]] = []
        for turns, (a, b) in zip(trajectories, spans, strict=True):
            values: list[ArrayLike] = [self.prior] if turns else []
            values += [s.harm for s in scores[a:b]]
            out.append(values)
        return out


# --- attribution of a page ------------------------------------------------------------------


def world_model_of(screener: Screener) -> WorldModelScorer | None:
    """The world model among ``screener``'s L0 scorers (None: a review-only screener)."""
    from monitor.scorers import WorldModelSignals

    for scorer in screener.l0:
        if isinstance(scorer, WorldModelSignals):
            return scorer.scorer
    return None


def page_attributions(
    screener: Screener, trajectories: Sequence[Trajectory], *, max_token_values: int = 16_384
) -> list[dict[str, Any] | None]:
    """The harm attribution of each paged trajectory (the trajectory so far, ending at the
    paged step), with one batched call of the world model: the ``attribution`` of the page's
    ``custom_details``. The label is the page's claim, R = 1 (``label_source: "page"``).

    A trajectory of more than ``max_token_values`` tokens keeps each turn's values and top
    tokens but not every token's advantage (``token_advantages`` null,
    ``token_advantages_omitted`` true), so the page stays small.

    All None when ``screener`` has no world model. Raises ValueError when a value is not
    finite (the paging service stores only finite numbers).
    """
    scorer = world_model_of(screener)
    if scorer is None or not trajectories:
        return [None for _ in trajectories]
    critic = WorldModelCritic(scorer)
    turns = [turns_from_trajectory(t) for t in trajectories]
    values = critic.values_many(turns)
    out: list[dict[str, Any] | None] = []
    for traj, ts, vs in zip(trajectories, turns, values, strict=True):
        att = attribute_harm(ts, lambda _ts, vs=vs: vs, 1.0, trajectory_id=traj.trajectory_id)
        record = att.to_dict()
        record.update(
            step_id=traj.steps[-1].step_id if traj.steps else None,
            label_source="page",
            critic="world model harm value: harm_post of the previous turn, else harm_pre",
        )
        bad = [t["index"] for t in record["turns"]
               if not all(np.isfinite([t["advantage"], t["residual"], t["value_start"],
                                       *t["token_advantages"]]))]
        if bad:
            raise ValueError(
                f"the harm attribution of {traj.trajectory_id} is not finite at turn {bad[0]}"
            )
        if sum(len(t["token_advantages"]) for t in record["turns"]) > max_token_values:
            for t in record["turns"]:
                t["token_advantages"] = None
            record["token_advantages_omitted"] = True
        out.append(record)
    return out


def harm_attribution(screener: Screener, trajectory: Trajectory) -> dict[str, Any] | None:
    """:func:`page_attributions` of one trajectory: its JSON, or None without a world model."""
    return page_attributions(screener, [trajectory])[0]
