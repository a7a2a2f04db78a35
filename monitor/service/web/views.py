"""What the case page shows, computed from a page's alerts (each carries the trajectory so
far, the flagged step, tier scores and the L2 rubric verdict)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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
    flagged: bool = False
    dedup_key: str | None = None
    scores: list[dict[str, Any]] = field(default_factory=list)
    rubric: dict[str, Any] | None = None


@dataclass
class TrajectoryView:
    trajectory_id: str
    task: str
    source: str
    steps: list[StepView]
    flagged_steps: list[str]


@dataclass
class LooseAlert:
    """An alert without a trajectory (an RL-health signal, a generic event)."""

    alert: Alert
    details_json: str
    scores: list[dict[str, Any]]
    rubric: dict[str, Any] | None


@dataclass
class CaseView:
    trajectories: list[TrajectoryView]
    loose: list[LooseAlert]


def _path(value: Any) -> str | None:
    return value if isinstance(value, str) and value and image_src(value) is None else None


def _step_view(step: dict[str, Any]) -> StepView:
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
                                    _scores(details), details.get("rubric")))
    views = []
    for tid, alerts in by_trajectory.items():
        # the longest trajectory-so-far is the most complete view (ties: the newest)
        latest = max(alerts, key=lambda a: (len(a.details["trajectory"].get("steps", [])), a.id))
        t = latest.details["trajectory"]
        steps = [_step_view(s) for s in t.get("steps", []) if isinstance(s, dict)]
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
        views.append(TrajectoryView(tid, str(t.get("task", "")), str(t.get("source", "")),
                                    steps, flagged))
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
