"""Recall per tier over time, from the reviewers' labels, plotted server-side (matplotlib Agg).

Population: flagged steps of cases a human labelled harmful. A tier "caught" a step
if its score record says ``flagged`` (or, without that, its score reached the
record's ``threshold``). These cases all reached L3, so this is recall *given a
page*: it shows which earlier tiers carried the catch. Recall over all harm,
including what never paged, is computed from the labels topic and canaries by
the dashboards.
"""

from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from monitor.service.models import Alert, Verdict

TIER_NAMES = {0: "L0 world model", 1: "L1 probes", 2: "L2 reviewer"}


@dataclass
class RecallReport:
    days: list[date] = field(default_factory=list)
    recall: dict[int, list[float | None]] = field(default_factory=dict)  # tier -> per day
    caught: dict[int, int] = field(default_factory=dict)  # tier -> total caught
    scored: dict[int, int] = field(default_factory=dict)  # tier -> total with a score
    precision: list[float | None] = field(default_factory=list)  # harmful share of pages
    cases: list[int] = field(default_factory=list)  # labelled cases per day
    harmful_steps: int = 0
    labelled_cases: int = 0
    unpublished: int = 0
    categories: dict[str, int] = field(default_factory=dict)


def _caught(score: dict[str, Any]) -> bool | None:
    if isinstance(score.get("flagged"), bool):
        return bool(score["flagged"])
    if isinstance(score.get("threshold"), int | float) and isinstance(score.get("score"),
                                                                       int | float):
        return bool(score["score"] >= score["threshold"])
    return None


def recall_report(session: Session, *, now: datetime, days: int = 30) -> RecallReport:
    since = now - timedelta(days=days)
    verdicts = session.scalars(
        select(Verdict).where(Verdict.created_at >= since).order_by(Verdict.id)
    ).all()
    latest: dict[int, Verdict] = {}
    for v in verdicts:  # a later verdict on a case corrects an earlier one
        latest[v.page_id] = v
    report = RecallReport(unpublished=sum(v.published_at is None for v in verdicts))
    if not latest:
        return report
    alerts_by_page: dict[int, list[Alert]] = defaultdict(list)
    for a in session.scalars(select(Alert).where(Alert.page_id.in_(list(latest)))):
        alerts_by_page[a.page_id].append(a)

    caught: dict[tuple[int, date], int] = defaultdict(int)
    scored: dict[tuple[int, date], int] = defaultdict(int)
    cases: dict[date, int] = defaultdict(int)
    harmful_cases: dict[date, int] = defaultdict(int)
    tiers: set[int] = set()
    for page_id, v in latest.items():
        day = v.created_at.date()
        cases[day] += 1
        report.labelled_cases += 1
        if not v.harmful:
            continue
        harmful_cases[day] += 1
        report.categories[v.category or "(none)"] = report.categories.get(v.category or "(none)",
                                                                          0) + 1
        for alert in alerts_by_page[page_id]:
            report.harmful_steps += 1
            for s in (alert.details or {}).get("scores") or []:
                tier = s.get("tier") if isinstance(s, dict) else None
                if not isinstance(tier, int) or tier not in TIER_NAMES:
                    continue
                hit = _caught(s)
                if hit is None:
                    continue
                tiers.add(tier)
                scored[tier, day] += 1
                caught[tier, day] += int(hit)
    report.days = sorted(cases)
    for tier in sorted(tiers):
        report.recall[tier] = [
            caught[tier, d] / scored[tier, d] if scored[tier, d] else None for d in report.days
        ]
        report.caught[tier] = sum(caught[tier, d] for d in report.days)
        report.scored[tier] = sum(scored[tier, d] for d in report.days)
    report.precision = [harmful_cases[d] / cases[d] for d in report.days]
    report.cases = [cases[d] for d in report.days]
    return report


def render_png(report: RecallReport) -> bytes:
    """Two panels: recall per tier per day; share of pages labelled harmful, and volume."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import DateFormatter, DayLocator
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    if not report.days:
        top.text(0.5, 0.5, "no labelled cases yet", ha="center", va="center",
                 transform=top.transAxes)
    for tier, values in sorted(report.recall.items()):
        pts = [(d, v) for d, v in zip(report.days, values, strict=True) if v is not None]
        if pts:  # shrinking markers keep tiers that coincide visible
            top.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                     markersize=11 - 3 * tier, linewidth=2,
                     label=TIER_NAMES.get(tier, f"L{tier}"))
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("recall (harmful steps caught)")
    top.set_title("Recall per tier, from reviewer labels")
    top.grid(alpha=0.3)
    if report.recall:
        top.legend(loc="lower left")
    if report.days:
        bottom.bar(report.days, report.cases, width=0.6, color="#c9d6e8", label="labelled cases")
        twin = bottom.twinx()
        twin.plot(report.days, report.precision, color="#b03030", marker="s",
                  label="share labelled harmful")
        twin.set_ylim(-0.02, 1.02)
        twin.set_ylabel("harmful share")
    bottom.set_ylabel("cases")
    bottom.set_xlabel("day (UTC)")
    if report.days:
        first, last = report.days[0], report.days[-1]
        bottom.set_xlim(first - timedelta(days=1), last + timedelta(days=1))
        span = (last - first).days + 2
        bottom.xaxis.set_major_locator(DayLocator(interval=max(1, -(-span // 8))))
        bottom.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
    fig.autofmt_xdate()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
