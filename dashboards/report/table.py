"""The numbers of a recall report: :class:`RecallTable` and :class:`RecallSeries`.

Both sources (:mod:`dashboards.report.from_files`, :mod:`dashboards.report.from_prometheus`)
reduce their input to counts ``reached[origin, stream, category, label, tier]`` and
``funnel[stream, tier, canary]``; :func:`build_table` turns those into a :class:`RecallTable`.
Recall at tier k is the share of harmful labelled steps screened (tier 0) that reached
tier k, with its 95 % Wilson interval (:func:`vigil.metrics.wilson_interval`, the same
formula as the dashboards' PromQL); the false-positive rate is the same share over benign
labelled steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vigil.metrics import wilson_interval

TIERS = (0, 1, 2, 3)
ALL = "all"  # the key of a dimension summed over
UNKNOWN = "unknown"  # a stream or origin nobody recorded
NO_CATEGORY = "none"  # a label without a category (as ``dashboards.ground_truth`` counts it)

_DURATION = re.compile(r"^(?:\d+(?:ms|[smhdwy]))+$")
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400,
           "y": 365 * 86400}


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


def build_table(source: str, reached: Mapping[tuple[str, str, str, int, int], float],
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


# --- over time -------------------------------------------------------------------------------


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

