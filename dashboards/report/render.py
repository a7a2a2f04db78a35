"""A recall report drawn and written: PNG figures, ``report.json`` and a plain-text table.

:func:`render_report` draws ``recall.png``, ``funnel.png`` and, given a time series,
``recall_over_time.png`` with matplotlib's object API on the Agg canvas (no pyplot
state), and writes ``report.json``; :func:`format_table` is the text the CLI prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from dashboards.report.table import (
    ALL,
    TIERS,
    GroupRecall,
    Proportion,
    RecallSeries,
    RecallTable,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TIER_NAMES = {0: "L0 screened", 1: "L1 probes", 2: "L2 reviewer", 3: "L3 human"}
TIER_COLOURS = {0: "#9aa5b1", 1: "#4c78a8", 2: "#f58518", 3: "#b03030"}


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=13, color="#555555",
            transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _count(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 or x >= 100 else f"{x:.1f}"


def _subtitle(table: RecallTable) -> str:
    parts = [table.source]
    if table.window is not None:
        parts.append(f"counts: increase() over {table.window}, extrapolated to the window")
    if table.at is not None:
        parts.append(datetime.fromtimestamp(table.at, tz=UTC).strftime("%Y-%m-%d %H:%M UTC"))
    if table.page_precision is not None and table.page_precision.value is not None:
        p = table.page_precision
        parts.append(f"page precision {p.value:.0%} [{p.lower:.0%}, {p.upper:.0%}] "
                     f"({_count(p.caught)}/{_count(p.total)} verdicts)")
    return " · ".join(parts)


def _recall_bars(ax: Axes, groups: Sequence[GroupRecall], key: str) -> None:
    groups = [g for g in groups if g.harmful > 0]
    width = 0.8 / len(TIERS)
    for j, tier in enumerate(TIERS):
        xs, ys, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            p = g.tier(tier).harmful
            assert p.value is not None and p.lower is not None and p.upper is not None
            xs.append(i + (j - (len(TIERS) - 1) / 2) * width)
            ys.append(p.value)
            lo.append(p.value - p.lower)
            hi.append(p.upper - p.value)
        ax.bar(xs, ys, width * 0.92, yerr=[lo, hi], capsize=3, color=TIER_COLOURS[tier],
               label=TIER_NAMES[tier], error_kw={"elinewidth": 1, "ecolor": "#333333"})
        for x, g in zip(xs, groups, strict=True):
            p = g.tier(tier).harmful
            ax.text(x, 1.04, f"{_count(p.caught)}/{_count(p.total)}", ha="center",
                    va="bottom", fontsize=7, rotation=90 if len(groups) > 3 else 0)
    ax.set_xticks(range(len(groups)), [getattr(g, key) for g in groups])
    ax.set_ylim(0, 1.22)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("recall (harmful steps reaching the tier)")
    ax.set_xlabel(key)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)


def render_recall(table: RecallTable, path: Path) -> Path:
    """``recall.png``: recall per tier with Wilson error bars, by origin (and by stream)."""
    by_stream = len({g.stream for g in table.groups if g.harmful > 0}) > 1
    fig = _figure(10, 9 if by_stream else 5.5)
    axes = fig.subplots(2 if by_stream else 1, 1, squeeze=False)[:, 0]
    fig.suptitle("Recall per tier (95 % Wilson intervals; labels: caught/harmful screened)",
                 fontsize=12)
    if table.harmful <= 0:
        _empty(axes[0], "no labelled harmful steps in\n" + table.source)
    else:
        _recall_bars(axes[0], table.aggregate(("origin",)), "origin")
        axes[0].set_title("by origin of the label", fontsize=10)
        if by_stream:
            _recall_bars(axes[1], table.aggregate(("stream",)), "stream")
            axes[1].set_title("by stream", fontsize=10)
    fig.supxlabel(_subtitle(table), fontsize=8, color="#555555")
    fig.savefig(path, format="png")
    return path


def render_funnel(table: RecallTable, path: Path) -> Path:
    """``funnel.png``: steps reaching L0 → L3 (log scale), harmful and benign apart."""
    fig = _figure(9, 5.5)
    ax = fig.subplots()
    overall = table.overall()
    series: list[tuple[str, str, list[float]]] = []
    steps = table.funnel_steps()
    if steps[0] > 0:
        series.append(("all steps", "#9aa5b1", [steps[k] for k in TIERS]))
    if overall.harmful > 0:
        series.append(("labelled harmful", "#b03030",
                       [overall.tier(k).harmful.caught for k in TIERS]))
    if overall.benign > 0:
        series.append(("labelled benign", "#4c78a8",
                       [overall.tier(k).benign.caught for k in TIERS]))
    fig.suptitle("Escalation funnel: steps reaching each tier (share of L0 above the bars)",
                 fontsize=12)
    if not series:
        _empty(ax, "no screened steps in\n" + table.source)
    else:
        width = 0.8 / len(series)
        top = max(max(v) for _, _, v in series)
        for j, (name, colour, values) in enumerate(series):
            xs = [k + (j - (len(series) - 1) / 2) * width for k in TIERS]
            ys = [v if v > 0 else math.nan for v in values]
            ax.bar(xs, ys, width * 0.92, color=colour, label=name)
            for x, v in zip(xs, values, strict=True):
                share = v / values[0] if values[0] > 0 else 0.0
                text = f"{_count(v)}\n{share:.1%}" if v > 0 else "0"
                ax.text(x, max(v, 0.6), text, ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylim(0.5, top * 4)
        ax.set_xticks(list(TIERS), [TIER_NAMES[k] for k in TIERS])
        ax.set_ylabel("steps (log scale)")
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.legend(loc="upper right", fontsize=9)
    fig.supxlabel(_subtitle(table), fontsize=8, color="#555555")
    fig.savefig(path, format="png")
    return path


def render_recall_over_time(series: RecallSeries, path: Path) -> Path:
    """``recall_over_time.png``: recall per tier over time, one panel per origin."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    origins = series.origins or (ALL,)
    fig = _figure(10, 1.0 + 3.0 * len(origins))
    axes = fig.subplots(len(origins), 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(f"Recall per tier over time (each point: the {series.window} before it; "
                 "bands: 95 % Wilson)", fontsize=12)
    if not series.points:
        _empty(axes[0], f"no labelled harmful steps between\n"
               f"{_utc(series.start)} and {_utc(series.end)}")
    for ax, origin in zip(axes, origins, strict=True):
        if not series.points:
            break
        for tier in TIERS[1:]:
            line = series.line(origin, tier)
            ts = [datetime.fromtimestamp(p.time, tz=UTC) for p in line]
            ys = [p.recall.value for p in line]
            ax.plot(ts, ys, color=TIER_COLOURS[tier], label=TIER_NAMES[tier], linewidth=1.8,
                    marker="o" if len(line) < 30 else None, markersize=3)
            ax.fill_between(ts, [p.recall.lower for p in line],  # type: ignore[arg-type]
                            [p.recall.upper for p in line],  # type: ignore[arg-type]
                            color=TIER_COLOURS[tier], alpha=0.15, linewidth=0)
        ax.set_ylim(-0.02, 1.05)
        ax.set_ylabel("recall")
        ax.set_title(f"origin: {origin}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize=8, ncols=3)
    axes[-1].set_xlabel("time (UTC)")
    locator = AutoDateLocator(tz=UTC)
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(ConciseDateFormatter(locator, tz=UTC))
    fig.savefig(path, format="png")
    return path


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def render_report(table: RecallTable, out_dir: Path,
                  series: RecallSeries | None = None) -> list[Path]:
    """Write ``recall.png``, ``funnel.png``, ``recall_over_time.png`` (with a series) and
    ``report.json`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [render_recall(table, out / "recall.png"), render_funnel(table, out / "funnel.png")]
    doc = table.to_json()
    if series is not None:
        paths.append(render_recall_over_time(series, out / "recall_over_time.png"))
        doc["recall_over_time"] = series.to_json()
    (out / "report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    paths.append(out / "report.json")
    return paths



# --- text ------------------------------------------------------------------------------------


def _interval(p: Proportion) -> str:
    if p.value is None:
        return "-"
    return f"{p.value:.3f} [{p.lower:.3f}, {p.upper:.3f}]"


def format_table(table: RecallTable) -> str:
    """Recall and false-positive rate per tier as a plain-text table."""
    head = f"{'origin':<10} {'stream':<11} {'category':<20} {'n':>7}"
    lines = [f"recall per tier (95 % Wilson interval), {table.source}"]
    origins = table.aggregate(("origin",))
    for title, attr in (("harmful steps: recall", "harmful"),
                        ("benign steps: false-positive rate", "benign")):
        rows = [g for g in table.groups if getattr(g, attr) > 0]
        if not rows:
            continue
        for o in origins:  # an origin's total, where it has several groups
            if sum(g.origin == o.origin for g in rows) > 1:
                rows.append(o)
        if len({g.origin for g in rows}) > 1:
            rows.append(table.overall())
        lines += ["", title,
                  (head + "".join(f"  {TIER_NAMES[k]:<22}" for k in TIERS[1:])).rstrip()]
        for g in rows:
            cells = "".join(f"  {_interval(getattr(g.tier(k), attr)):<22}" for k in TIERS[1:])
            lines.append(f"{g.origin:<10} {g.stream:<11} {g.category[:20]:<20} "
                         f"{_count(getattr(g, attr)):>7}{cells}".rstrip())
    if not table.groups:
        lines.append("no labelled steps")
    steps = table.funnel_steps()
    if steps[0] > 0:
        lines += ["", "funnel: " + "  ".join(
            f"L{k} {_count(steps[k])}" + (f" ({steps[k] / steps[0]:.2%})" if k else "")
            for k in TIERS)]
    p = table.page_precision
    if p is not None and p.value is not None:
        lines.append(f"page precision: {_interval(p)} ({_count(p.caught)}/{_count(p.total)} "
                     "verdicts harmful)")
    lines += [f"note: {n}" for n in table.notes]
    return "\n".join(lines)
