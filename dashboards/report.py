"""Recall and funnel reports as PNG files, for people without Grafana (``monitor report``).

Two sources give the same :class:`RecallTable`:

* a Prometheus server holding the worker's metrics (``recall_from_prometheus``):
  ``increase(vigil_labelled_steps_total[window])`` per (origin, stream, category,
  label, tier), the ``vigil_steps_total`` funnel and ``vigil_page_verdicts_total``;
* files (``recall_from_files``): the output of ``monitor screen`` joined with step
  labels from interchange-format trajectories or ``LabelRecord`` JSON Lines.

Recall at tier k is the share of harmful labelled steps screened (tier 0) that
reached tier k, with its 95 % Wilson interval (:func:`dashboards.recall.wilson_interval`,
the same formula as the dashboards' PromQL); the false-positive rate is the same
share over benign labelled steps. :func:`render_report` draws ``recall.png``,
``funnel.png`` and, given a time series, ``recall_over_time.png`` with matplotlib's
object API on the Agg canvas (no pyplot state), and writes ``report.json``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dashboards.recall import wilson_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from dashboards.prometheus import PrometheusClient

TIERS = (0, 1, 2, 3)
TIER_NAMES = {0: "L0 screened", 1: "L1 probes", 2: "L2 reviewer", 3: "L3 human"}
TIER_COLOURS = {0: "#9aa5b1", 1: "#4c78a8", 2: "#f58518", 3: "#b03030"}
ALL = "all"  # the key of a dimension summed over
UNKNOWN = "unknown"  # a stream or origin nobody recorded
NO_CATEGORY = "none"  # a label without a category (as ``dashboards.ground_truth`` counts it)

_DURATION = re.compile(r"^(?:\d+(?:ms|[smhdwy]))+$")
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400,
           "y": 365 * 86400}
# `monitor tail` prefixes each record: "vigil.labels[0]@12 key=t-1 {...}"
_TAIL_PREFIX = re.compile(r"^\S+\[\d+\]@\d+ [^{]*(\{.*)$", re.DOTALL)


class ReportError(ValueError):
    """Input a report cannot be built from; the message is one sentence."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration (``90s``, ``1h``, ``1h30m``, ``7d``)."""
    if not _DURATION.match(text):
        raise ReportError(f"{text!r} is not a duration like 30m, 1h, 6h or 7d")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    if seconds <= 0:
        raise ReportError(f"duration {text!r} must be longer than zero")
    return float(seconds)


# --- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proportion:
    """``caught`` of ``total`` with its 95 % Wilson interval (None where ``total`` is 0).

    From Prometheus the counts are ``increase()`` values, so they need not be integers.
    """

    caught: float
    total: float
    value: float | None
    lower: float | None
    upper: float | None

    @classmethod
    def of(cls, caught: float, total: float) -> Proportion:
        if total <= 0:
            return cls(caught, total, None, None, None)
        # a step can reach tier k inside a window whose start cut off its tier-0 count
        c = min(max(caught, 0.0), total)
        interval = wilson_interval(c, total)
        assert interval is not None
        return cls(caught, total, c / total, interval[0], interval[1])

    def to_json(self) -> dict[str, Any]:
        return {"caught": self.caught, "total": self.total, "value": self.value,
                "lower": self.lower, "upper": self.upper}


@dataclass(frozen=True)
class TierCounts:
    """Labelled steps that reached one tier: harmful ones (recall), benign ones (FPR)."""

    tier: int
    harmful: Proportion  # reached this tier / harmful screened: recall
    benign: Proportion  # reached this tier / benign screened: false-positive rate

    def to_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "recall": self.harmful.to_json(),
                "false_positive_rate": self.benign.to_json()}


@dataclass(frozen=True)
class GroupRecall:
    """Recall and false-positive rate per tier of one (origin, stream, category) group."""

    origin: str
    stream: str
    category: str
    tiers: tuple[TierCounts, ...]  # tiers 0..3, in order

    @property
    def harmful(self) -> float:
        """Harmful labelled steps screened."""
        return self.tiers[0].harmful.total

    @property
    def benign(self) -> float:
        """Benign labelled steps screened."""
        return self.tiers[0].benign.total

    def tier(self, k: int) -> TierCounts:
        return self.tiers[k]

    def to_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "stream": self.stream, "category": self.category,
                "tiers": [t.to_json() for t in self.tiers]}


@dataclass(frozen=True)
class FunnelStage:
    """Steps of one stream that reached one tier (canary steps counted apart)."""

    stream: str
    tier: int
    steps: float
    canary: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"stream": self.stream, "tier": self.tier, "steps": self.steps,
                "canary": self.canary}


_KEYS = ("origin", "stream", "category")


@dataclass(frozen=True)
class RecallTable:
    """Everything a report shows: recall per group and tier, the funnel, page precision."""

    source: str  # where the numbers came from, for titles: a URL and window, or file names
    groups: tuple[GroupRecall, ...]
    funnel: tuple[FunnelStage, ...]
    page_precision: Proportion | None = None  # harmful share of human verdicts on pages
    window: str | None = None
    at: float | None = None  # unix time the numbers are for (Prometheus)
    notes: tuple[str, ...] = ()  # what was left out, and why

    def aggregate(self, by: Sequence[str]) -> tuple[GroupRecall, ...]:
        """Groups summed over every key not in ``by`` (those read ``"all"``), sorted."""
        unknown = set(by) - set(_KEYS)
        if unknown:
            raise ValueError(f"cannot group by {sorted(unknown)}: keys are {list(_KEYS)}")
        sums: dict[tuple[str, str, str], list[list[float]]] = {}
        for g in self.groups:
            key = (g.origin if "origin" in by else ALL, g.stream if "stream" in by else ALL,
                   g.category if "category" in by else ALL)
            acc = sums.setdefault(key, [[0.0] * 4 for _ in TIERS])
            for t in g.tiers:
                a = acc[t.tier]
                a[0] += t.harmful.caught
                a[1] += t.harmful.total
                a[2] += t.benign.caught
                a[3] += t.benign.total
        return tuple(_group(*key, acc) for key, acc in sorted(sums.items()))

    def overall(self) -> GroupRecall:
        """Every group summed."""
        got = self.aggregate(())
        return got[0] if got else _group(ALL, ALL, ALL, [[0.0] * 4 for _ in TIERS])

    @property
    def harmful(self) -> float:
        return self.overall().harmful

    @property
    def benign(self) -> float:
        return self.overall().benign

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(sorted({g.stream for g in self.groups}))

    def funnel_steps(self) -> dict[int, float]:
        """Steps (canaries excluded) that reached each tier, over every stream."""
        out = dict.fromkeys(TIERS, 0.0)
        for f in self.funnel:
            out[f.tier] += f.steps
        return out

    def to_json(self) -> dict[str, Any]:
        overall = self.overall()
        return {
            "source": self.source,
            "window": self.window,
            "at": self.at,
            "overall": overall.to_json(),
            "by_origin": [g.to_json() for g in self.aggregate(("origin",))],
            "by_stream": [g.to_json() for g in self.aggregate(("stream",))],
            "groups": [g.to_json() for g in self.groups],
            "funnel": [f.to_json() for f in self.funnel],
            "funnel_steps": {str(k): v for k, v in self.funnel_steps().items()},
            "page_precision": self.page_precision.to_json() if self.page_precision else None,
            "notes": list(self.notes),
        }


def _group(origin: str, stream: str, category: str,
           acc: Sequence[Sequence[float]]) -> GroupRecall:
    """``acc[tier] = [harmful reached, harmful screened, benign reached, benign screened]``."""
    return GroupRecall(origin, stream, category, tuple(
        TierCounts(k, Proportion.of(a[0], a[1]), Proportion.of(a[2], a[3]))
        for k, a in zip(TIERS, acc, strict=True)))


def _table(source: str, reached: Mapping[tuple[str, str, str, int, int], float],
           funnel: Mapping[tuple[str, int, bool], float], **kw: Any) -> RecallTable:
    """Build the table from counts ``reached[origin, stream, category, label, tier]``.

    ``reached[..., tier=0]`` is the number screened, so both proportions use it as total.
    """
    keys = sorted({k[:3] for k in reached})
    groups = []
    for o, s, c in keys:
        acc = []
        for k in TIERS:
            acc.append([reached.get((o, s, c, 1, k), 0.0), reached.get((o, s, c, 1, 0), 0.0),
                        reached.get((o, s, c, 0, k), 0.0), reached.get((o, s, c, 0, 0), 0.0)])
        groups.append(_group(o, s, c, acc))
    stages: dict[tuple[str, int], list[float]] = {}
    for (stream, tier, canary), n in funnel.items():
        stages.setdefault((stream, tier), [0.0, 0.0])[int(canary)] += n
    return RecallTable(
        source=source,
        groups=tuple(groups),
        funnel=tuple(FunnelStage(s, t, v[0], v[1]) for (s, t), v in sorted(stages.items())),
        **kw)


# --- from files ------------------------------------------------------------------------------


def _json_lines(path: Path, what: str) -> Iterable[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise ReportError(f"{path}: no such file ({what})")
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            text = raw.decode("utf-8", "replace").strip()
            if not text:
                continue
            m = _TAIL_PREFIX.match(text) if not text.startswith("{") else None
            try:
                obj = json.loads(m.group(1) if m else text)
            except json.JSONDecodeError as e:
                raise ReportError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ReportError(f"{path}: line {n}: expected a JSON object, got "
                                  f"{type(obj).__name__}")
            yield n, obj


def _read_screened(path: Path) -> dict[tuple[str, str], int]:
    """``(trajectory_id, step_id) -> tier`` from a ``monitor screen --out`` file."""
    hint = "(is it the output of `monitor screen --out`?)"
    tiers: dict[tuple[str, str], int] = {}
    for n, obj in _json_lines(path, "screened steps"):
        tid = obj.get("trajectory_id")
        steps = obj.get("steps")
        if not isinstance(tid, str) or not tid:
            raise ReportError(f"{path}: line {n}: no 'trajectory_id' string {hint}")
        if not isinstance(steps, list):
            raise ReportError(f"{path}: line {n}: no 'steps' list {hint}")
        for i, s in enumerate(steps):
            sid = s.get("step_id") if isinstance(s, dict) else None
            tier = s.get("tier") if isinstance(s, dict) else None
            if not isinstance(sid, str) or not sid:
                raise ReportError(f"{path}: line {n}: step {i} has no 'step_id' string {hint}")
            if isinstance(tier, bool) or not isinstance(tier, int) or tier not in TIERS:
                raise ReportError(f"{path}: line {n}: step {sid!r} has no 'tier' of 0 to 3 "
                                  f"(got {tier!r}) {hint}")
            tiers[tid, sid] = tier
    return tiers


@dataclass(frozen=True)
class _StepLabel:
    label: int
    category: str


_LabelKey = tuple[str, str, str]  # trajectory_id, step_id, origin


def _read_labels(paths: Sequence[Path]) -> tuple[dict[_LabelKey, _StepLabel], dict[str, str],
                                                 dict[tuple[str, str], _StepLabel]]:
    """Step labels per origin (a later one overrides), each trajectory's stream, and labels
    of whole trajectories (no step named) per (trajectory_id, origin)."""
    from streams.records import LabelRecord, RecordError, Trajectory, validate

    labels: dict[_LabelKey, _StepLabel] = {}
    streams: dict[str, str] = {}
    whole: dict[tuple[str, str], _StepLabel] = {}
    for path in paths:
        for n, obj in _json_lines(path, "labels"):
            try:
                if "steps" in obj:
                    traj = validate(obj, Trajectory, line=n)
                    tid = traj.trajectory_id
                    streams[tid] = traj.source
                    for s in traj.steps:
                        if s.label is not None:
                            labels[tid, s.step_id, "dataset"] = _StepLabel(
                                s.label, s.category or NO_CATEGORY)
                    if traj.label is not None and all(s.label is None for s in traj.steps):
                        whole[tid, "dataset"] = _StepLabel(traj.label, NO_CATEGORY)
                else:
                    rec = validate(obj, LabelRecord, line=n)
                    lab = _StepLabel(rec.label, rec.category or NO_CATEGORY)
                    if rec.step_id is None:
                        whole[rec.trajectory_id, rec.origin] = lab
                    else:
                        labels[rec.trajectory_id, rec.step_id, rec.origin] = lab
            except RecordError as e:
                raise ReportError(f"{path}: {e}") from None
    return labels, streams, whole


def recall_from_files(screened: Path, labels: Sequence[Path]) -> RecallTable:
    """Recall per tier from ``monitor screen`` output joined with step labels.

    ``labels`` are interchange-format trajectory files (each step's ``label`` and
    ``category``; origin ``dataset``) and/or ``LabelRecord`` JSON Lines (origin from the
    record; lines as ``monitor tail vigil.labels`` prints them work too). As in the live
    join (``dashboards.ground_truth``) a step counts once per origin, so a human verdict
    on a dataset step shows under both origins; a later label of the same step and origin
    overrides an earlier one (a corrected verdict). A trajectory labelled benign as a whole
    (no step named) labels each of its steps benign; one labelled harmful as a whole is
    left out (which step was harmful is unknown) and counted in ``notes``.
    """
    screened = Path(screened)
    paths = [Path(p) for p in labels]
    if not paths:
        raise ReportError("no label files: pass --labels with the screened trajectories or "
                          "a JSON Lines file of label records")
    tiers = _read_screened(screened)
    step_labels, streams, whole = _read_labels(paths)
    notes: list[str] = []
    harmful_whole = 0
    steps_of: dict[str, list[str]] = defaultdict(list)
    for tid, sid in tiers:
        steps_of[tid].append(sid)
    for (tid, origin), lab in whole.items():
        if lab.label:
            harmful_whole += 1
            continue
        for sid in steps_of.get(tid, []):
            step_labels.setdefault((tid, sid, origin), lab)
    if harmful_whole:
        notes.append(f"{_plural(harmful_whole, 'trajectory', 'trajectories')} labelled "
                     "harmful without a step label left out")
    reached: dict[tuple[str, str, str, int, int], float] = defaultdict(float)
    labelled = {(tid, sid) for tid, sid, _origin in step_labels}
    for (tid, sid, origin), lab in step_labels.items():
        tier = tiers.get((tid, sid))
        if tier is None:
            continue
        for k in range(tier + 1):
            reached[origin, streams.get(tid, UNKNOWN), lab.category, lab.label, k] += 1
    matched = len(labelled & tiers.keys())
    names = ", ".join(p.name for p in paths)
    if not labelled:
        raise ReportError(f"no step labels (0 or 1) in {names}: label steps in the "
                          "trajectories or pass label records")
    if matched == 0:
        raise ReportError(
            f"none of the {len(labelled)} labelled steps in {names} matched the "
            f"{len(tiers)} screened steps in {screened.name}: their trajectory_id/step_id "
            "pairs differ")
    if matched < len(labelled):
        notes.append(f"{len(labelled) - matched} of {len(labelled)} labelled steps "
                     "were not in the screened file")
    funnel: dict[tuple[str, int, bool], float] = defaultdict(float)
    for (tid, _sid), tier in tiers.items():
        for k in range(tier + 1):
            funnel[streams.get(tid, UNKNOWN), k, False] += 1
    return _table(f"{screened.name} + {names}", reached, funnel, notes=tuple(notes))


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# --- from Prometheus -------------------------------------------------------------------------


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
    return _table(f"{client.url}, last {window}", reached, funnel, page_precision=precision,
                  window=window, at=when, notes=tuple(notes))


@dataclass(frozen=True)
class RecallPoint:
    """Recall of one origin at one tier over the window ending at ``time``."""

    origin: str
    tier: int
    time: float
    recall: Proportion


@dataclass(frozen=True)
class RecallSeries:
    """Recall per origin and tier over time (each point: the ``window`` before it)."""

    window: str
    start: float
    end: float
    step_s: float
    points: tuple[RecallPoint, ...]

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(sorted({p.origin for p in self.points}))

    def line(self, origin: str, tier: int) -> list[RecallPoint]:
        return sorted((p for p in self.points if p.origin == origin and p.tier == tier),
                      key=lambda p: p.time)

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "start": self.start, "end": self.end,
                "step_s": self.step_s,
                "points": [{"origin": p.origin, "tier": p.tier, "time": p.time,
                            "recall": p.recall.to_json()} for p in self.points]}


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


# --- rendering -------------------------------------------------------------------------------


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
