"""What the case page shows, computed from a page's alerts (each carries the trajectory so
far, the flagged step, tier scores, the L2 rubric verdict and, from a worker with a world
model, the harm attribution of the trajectory: ``monitor.rlhealth.attribution``). A step
of a generated-media rollout (``monitor.rlhealth.art_steps``) also shows what it generated:
the thumbnail, the prompt and the rewards by reward model."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from monitor.service.models import Alert, Page

_IMAGE = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+$")


def image_src(value: Any) -> str | None:
    """Only inline images are shown: an agent's screenshot path must not make the reviewer's
    browser fetch anything."""
    return value if isinstance(value, str) and _IMAGE.match(value) else None


@dataclass
class StepView:
    step_id: str
    index: int
    role: str
    observation_text: str
    observation_image: str | None
    observation_path: str | None
    action_text: str
    tool: str | None
    gui: str | None
    result_text: str | None
    result_image: str | None
    result_path: str | None
    media: MediaView | None = None  # a generated image or video (an ART endpoint)
    flagged: bool = False
    dedup_key: str | None = None
    scores: list[dict[str, Any]] = field(default_factory=list)
    rubric: dict[str, Any] | None = None
    harm_residual: float | None = None  # set on the step the attribution names


# --- generated media -----------------------------------------------------------------------


@dataclass
class MediaView:
    """What an ART endpoint step generated: the step's result thumbnail, its prompt, and the
    score of every reward model."""

    kind: str
    prompt: str
    image: str | None  # the thumbnail, when it is an inline image
    image_text: str | None  # anything else the producer sent for it: shown as text
    rewards: list[tuple[str, float]]
    reward: float | None  # the scalar R the trainer used
    facts: list[tuple[str, str]]  # run, prompt id, policy version, endpoint, seed, ref


# --- harm attribution ----------------------------------------------------------------------

# what the page reads of ``custom_details.attribution`` (a producer may send anything:
# whatever does not fit this shows no section, never an error page)
_Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


class _Media(_Lenient):  # what the page reads of a step's ``media`` (art_steps)
    kind: str = Field(default="image", max_length=20)
    run_id: str | None = None
    prompt_id: str | None = None
    policy_version: int | None = None
    endpoint: int | None = Field(default=None, ge=0)
    endpoints: int | None = Field(default=None, ge=1)
    ref: str | None = None
    seed: int | None = None
    rewards: dict[str, _Finite] = Field(default_factory=dict, max_length=64)
    reward: _Finite | None = None


class _TopToken(_Lenient):
    position: int = Field(ge=0)
    token_id: int
    advantage: _Finite


class _Turn(_Lenient):
    index: int = Field(ge=0)
    call_id: str
    role: str = "main"
    action: str = ""
    value_start: _Finite = 0.0
    value_next: _Finite = 0.0
    residual: _Finite
    advantage: _Finite
    top_tokens: list[_TopToken] = Field(default_factory=list, max_length=64)
    token_advantages: list[_Finite] | None = None


class _Attribution(_Lenient):
    turns: list[_Turn] = Field(min_length=1, max_length=2000)
    label: _Finite = 1.0
    label_source: str | None = None
    critic: str | None = None
    lam: _Finite = Field(default=0.8, alias="lambda")
    lam_intra: _Finite = Field(default=0.95, alias="lambda_intra")
    beta: _Finite = 1.0
    harmful_turn: int | None = None
    step_id: str | None = None


@dataclass
class TokenView:
    position: int
    token_id: int
    advantage: float
    text: str | None  # the token as text, where the trajectory's step allows it


@dataclass
class AttributionTurnView:
    index: int
    call_id: str
    role: str
    action: str
    value_start: float
    residual: float
    advantage: float
    harmful: bool
    anchor: str | None  # the step's id when the step is on the page
    turn_level: bool  # the step on the page carries no token ids: the turn is one unit
    tokens: int | None  # output tokens of the step, when the page knows them
    top_tokens: list[TokenView]
    uniform: float | None  # every token of the turn has this advantage (nothing stands out)
    advantage_bar: tuple[float, float]  # (negative, positive) half-widths in %
    residual_bar: tuple[float, float]


@dataclass
class AttributionView:
    """Which turn, and which tokens in it, moved the trajectory toward harm (DESIGN §5)."""

    step_id: str | None
    label: float
    label_source: str | None
    critic: str | None
    lam: float
    lam_intra: float
    beta: float
    turns: list[AttributionTurnView]

    @property
    def harmful(self) -> AttributionTurnView:
        return next(t for t in self.turns if t.harmful)


def _bar(x: float, scale: float) -> tuple[float, float]:
    w = round(50.0 * min(1.0, abs(x) / scale), 1) if scale > 0 else 0.0
    return (w, 0.0) if x < 0 else (0.0, w)


def _uniform(values: list[float] | None) -> float | None:
    """The one value of a turn whose tokens all have the same advantage (more than one)."""
    if not values or len(values) < 2 or max(values) - min(values) > 1e-9:
        return None
    return values[0]


def _token_texts(step: dict[str, Any] | None) -> tuple[list[int] | None, list[str] | None]:
    """The step's output token ids, and a text per token where it can be told exactly:
    ``output_tokens`` (one string a token), or an output text of one word a token."""
    if step is None:
        return None, None
    ids = step.get("output_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return None, None
    pieces = step.get("output_tokens")
    if isinstance(pieces, list) and len(pieces) == len(ids) and all(
            isinstance(x, str) for x in pieces):
        return ids, pieces
    text = step.get("output_text")
    if not isinstance(text, str):
        action = step.get("action")
        text = action.get("text") if isinstance(action, dict) else None
    words = text.split() if isinstance(text, str) else []
    return ids, (words if len(words) == len(ids) else None)


def attribution_view(
    value: Any, steps: dict[str, dict[str, Any]] | None = None
) -> AttributionView | None:
    """The attribution section of a case, or None when ``value`` is absent or malformed.
    ``steps``: the raw steps of the trajectory on the page, by id (links and token text)."""
    if not isinstance(value, dict):
        return None
    try:
        a = _Attribution.model_validate(value)
    except (ValidationError, TypeError, ValueError):
        return None
    steps = steps or {}
    top = a.harmful_turn
    if top is None or not 0 <= top < len(a.turns):  # the turn with the largest residual
        top = max(range(len(a.turns)), key=lambda k: a.turns[k].residual)
    scale = max(max(abs(t.advantage), abs(t.residual)) for t in a.turns)
    turns = []
    for k, t in enumerate(a.turns):
        step = steps.get(t.call_id)
        ids, texts = _token_texts(step)
        tokens = []
        for tok in t.top_tokens[:10]:
            exact = (ids is not None and tok.position < len(ids)
                     and ids[tok.position] == tok.token_id)
            tokens.append(TokenView(tok.position, tok.token_id, tok.advantage,
                                    texts[tok.position] if exact and texts else None))
        action = t.action
        if not action and step is not None and isinstance(step.get("action"), dict):
            action = str(step["action"].get("text", ""))
        turns.append(AttributionTurnView(
            index=t.index, call_id=t.call_id, role=t.role,
            action=" ".join(action.split())[:120],
            value_start=t.value_start, residual=t.residual, advantage=t.advantage,
            harmful=k == top, anchor=t.call_id if step is not None else None,
            turn_level=step is not None and ids is None,
            tokens=len(ids) if ids is not None else None,
            top_tokens=tokens,
            uniform=_uniform(t.token_advantages) if ids is not None else None,
            advantage_bar=_bar(t.advantage, scale), residual_bar=_bar(t.residual, scale),
        ))
    return AttributionView(a.step_id, a.label, a.label_source, a.critic, a.lam, a.lam_intra,
                           a.beta, turns)


@dataclass
class TrajectoryView:
    trajectory_id: str
    task: str
    source: str
    steps: list[StepView]
    flagged_steps: list[str]
    attribution: AttributionView | None = None


@dataclass
class LooseAlert:
    """An alert without a trajectory (an RL-health signal, a generic event)."""

    alert: Alert
    details_json: str
    scores: list[dict[str, Any]]
    rubric: dict[str, Any] | None
    attribution: AttributionView | None = None


@dataclass
class CaseView:
    trajectories: list[TrajectoryView]
    loose: list[LooseAlert]


def _path(value: Any) -> str | None:
    return value if isinstance(value, str) and value and image_src(value) is None else None


def media_view(step: dict[str, Any], task: str) -> MediaView | None:
    """The generated-media section of a step, or None when it has no (well-formed) ``media``;
    the prompt is the call's ``prompt`` argument, else the trajectory's task."""
    try:
        m = _Media.model_validate(step.get("media"))
    except (ValidationError, TypeError, ValueError):
        return None
    result = step.get("result")
    shot = result.get("screenshot") if isinstance(result, dict) else None
    tool = (step.get("action") or {}).get("tool")
    args = tool.get("arguments") if isinstance(tool, dict) else None
    prompt = args.get("prompt") if isinstance(args, dict) else None
    endpoint = None
    if m.endpoint is not None:
        endpoint = f"{m.endpoint + 1}" + (f" of {m.endpoints}" if m.endpoints else "")
    facts = [(name, str(v)) for name, v in (
        ("Run", m.run_id), ("Prompt id", m.prompt_id), ("Policy version", m.policy_version),
        ("Endpoint", endpoint), ("Seed", m.seed), ("Full " + m.kind, m.ref)) if v is not None]
    return MediaView(
        kind=m.kind,
        prompt=prompt if isinstance(prompt, str) else task,
        image=image_src(shot),
        image_text=_path(shot),
        rewards=sorted(m.rewards.items()),
        reward=m.reward,
        facts=facts,
    )


def _step_view(step: dict[str, Any], task: str) -> StepView:
    obs = step.get("observation") or {}
    action = step.get("action") or {}
    result = step.get("result") or None
    tool = action.get("tool")
    gui = action.get("gui")
    return StepView(
        step_id=str(step.get("step_id", "")),
        index=int(step.get("index", 0)),
        role=str(step.get("role", "main")),
        observation_text=str(obs.get("text", "")),
        observation_image=image_src(obs.get("screenshot")),
        observation_path=_path(obs.get("screenshot")),
        action_text=str(action.get("text", "")),
        tool=(f"{tool.get('name')}({json.dumps(tool.get('arguments', {}), ensure_ascii=False)})"
              if isinstance(tool, dict) else None),
        gui=(json.dumps(gui, ensure_ascii=False) if isinstance(gui, dict) else None),
        result_text=str(result.get("text", "")) if isinstance(result, dict) else None,
        result_image=image_src(result.get("screenshot")) if isinstance(result, dict) else None,
        result_path=_path(result.get("screenshot")) if isinstance(result, dict) else None,
        media=media_view(step, task) if "media" in step else None,
    )


def _scores(details: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [s for s in details.get("scores") or [] if isinstance(s, dict)]
    return sorted(rows, key=lambda s: s.get("tier", 0))


def case_view(page: Page) -> CaseView:
    by_trajectory: dict[str, list[Alert]] = {}
    loose: list[LooseAlert] = []
    for alert in page.alerts:
        details = alert.details or {}
        if isinstance(details.get("trajectory"), dict) and alert.trajectory_id:
            by_trajectory.setdefault(alert.trajectory_id, []).append(alert)
        else:
            loose.append(LooseAlert(alert, json.dumps(details, indent=2, ensure_ascii=False),
                                    _scores(details), details.get("rubric"),
                                    attribution_view(details.get("attribution"))))
    views = []
    for tid, alerts in by_trajectory.items():
        # the longest trajectory-so-far is the most complete view (ties: the newest)
        latest = max(alerts, key=lambda a: (len(a.details["trajectory"].get("steps", [])), a.id))
        t = latest.details["trajectory"]
        task = str(t.get("task", ""))
        steps = [_step_view(s, task) for s in t.get("steps", []) if isinstance(s, dict)]
        index = {s.step_id: s for s in steps}
        flagged = []
        for alert in alerts:
            view = index.get(alert.step_id or "")
            if view is None:
                continue
            view.flagged = True
            view.dedup_key = alert.dedup_key
            view.scores = _scores(alert.details)
            view.rubric = alert.details.get("rubric")
            flagged.append(view.step_id)
        # the attribution of the trajectory shown, else of the newest alert that has one
        raw = {str(s.get("step_id", "")): s for s in t.get("steps", []) if isinstance(s, dict)}
        attribution = None
        for alert in sorted(alerts, key=lambda a: (a is not latest, -a.id)):
            attribution = attribution_view(alert.details.get("attribution"), raw)
            if attribution is not None:
                break
        if attribution is not None and attribution.harmful.anchor in index:
            index[attribution.harmful.call_id].harm_residual = attribution.harmful.residual
        views.append(TrajectoryView(tid, task, str(t.get("source", "")), steps, flagged,
                                    attribution))
    return CaseView(views, loose)


def age(since: datetime, now: datetime) -> str:
    s = max(0, int((now - since).total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
