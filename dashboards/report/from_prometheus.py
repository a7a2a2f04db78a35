"""Recall from a Prometheus server holding the worker's metrics (``monitor report --prometheus``).

``increase(vigil_labelled_steps_total[window])`` per (origin, stream, category, label,
tier), the ``vigil_steps_total`` funnel and ``vigil_page_verdicts_total`` give a
:class:`~dashboards.report.table.RecallTable`; a range query of the first gives a
:class:`~dashboards.report.table.RecallSeries`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from dashboards.report.table import (
    NO_CATEGORY,
    TIERS,
    UNKNOWN,
    Proportion,
    RecallPoint,
    RecallSeries,
    RecallTable,
    ReportError,
    build_table,
    parse_duration,
)

if TYPE_CHECKING:
    from dashboards.prometheus import PrometheusClient


def _tier(value: str | None) -> int | None:
    try:
        t = int(value or "")
    except ValueError:
        return None
    return t if t in TIERS else None


def _label(value: str | None) -> int | None:
    return {"0": 0, "1": 1}.get(value or "")


def recall_from_prometheus(client: PrometheusClient, window: str = "1h",
                           at: float | None = None) -> RecallTable:
    """Recall per tier over the ``window`` ending ``at`` (default: now), from the metrics.

    Counts are ``increase()`` over the window, so they are extrapolated to its edges and
    need not be integers; recall is their ratio, as on the dashboards.
    """
    parse_duration(window)
    when = time.time() if at is None else at
    rows = client.query(
        "sum by (origin, stream, category, label, tier) "
        f"(increase(vigil_labelled_steps_total[{window}]))", at=when)
    reached: dict[tuple[str, str, str, int, int], float] = defaultdict(float)
    for r in rows:
        m = r["metric"]
        tier, label, v = _tier(m.get("tier")), _label(m.get("label")), float(r["value"][1])
        if tier is None or label is None or not math.isfinite(v):
            continue
        reached[m.get("origin") or UNKNOWN, m.get("stream") or UNKNOWN,
                m.get("category") or NO_CATEGORY, label, tier] += v
    funnel: dict[tuple[str, int, bool], float] = defaultdict(float)
    for r in client.query(f"sum by (stream, tier, canary) (increase(vigil_steps_total[{window}]))",
                          at=when):
        m = r["metric"]
        tier, v = _tier(m.get("tier")), float(r["value"][1])
        if tier is not None and math.isfinite(v):
            funnel[m.get("stream") or UNKNOWN, tier, m.get("canary") == "true"] += v
    # max, not sum: every paging-service instance reports the same database (dashboards.promql)
    verdicts = {r["metric"].get("verdict", ""): float(r["value"][1]) for r in client.query(
        f"max by (verdict) (increase(vigil_page_verdicts_total[{window}]))", at=when)}
    total = sum(v for v in verdicts.values() if math.isfinite(v))
    precision = Proportion.of(verdicts.get("harmful", 0.0), total) if total > 0 else None
    notes = [] if rows else [f"no vigil_labelled_steps_total samples in the {window} window"]
    return build_table(f"{client.url}, last {window}", reached, funnel, page_precision=precision,
                  window=window, at=when, notes=tuple(notes))


def recall_over_time(client: PrometheusClient, start: float, end: float, step: float,
                     window: str = "1h") -> RecallSeries:
    """Recall per origin and tier at each ``step`` from ``start`` to ``end`` (range query)."""
    parse_duration(window)
    if end <= start or step <= 0:
        raise ReportError(f"a time range needs start < end and a positive step, got start "
                          f"{start:.0f}, end {end:.0f}, step {step:g}")
    rows = client.query_range(
        f'sum by (origin, tier) (increase(vigil_labelled_steps_total{{label="1"}}[{window}]))',
        start, end, step)
    counts: dict[tuple[str, float], dict[int, float]] = defaultdict(dict)
    for r in rows:
        origin, tier = r["metric"].get("origin") or UNKNOWN, _tier(r["metric"].get("tier"))
        if tier is None:
            continue
        for t, v in r["values"]:
            if math.isfinite(float(v)):
                counts[origin, float(t)][tier] = float(v)
    points = []
    for (origin, t), by_tier in sorted(counts.items()):
        total = by_tier.get(0, 0.0)
        if total <= 0:
            continue
        for tier in TIERS:
            points.append(RecallPoint(origin, tier, t, Proportion.of(by_tier.get(tier, 0.0),
                                                                     total)))
    return RecallSeries(window, start, end, step, tuple(points))
