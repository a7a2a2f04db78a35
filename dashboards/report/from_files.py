"""Recall from files (``monitor report --screened``): screened steps joined with labels.

The screened steps are the output of ``monitor screen --out``; the labels come from
interchange-format trajectories (each step's ``label`` and ``category``) and/or
``LabelRecord`` JSON Lines, as written or as ``monitor tail vigil.labels`` prints them.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboards.report.table import (
    NO_CATEGORY,
    TIERS,
    UNKNOWN,
    RecallTable,
    ReportError,
    build_table,
)

# `monitor tail` prefixes each record: "vigil.labels[0]@12 key=t-1 {...}"
_TAIL_PREFIX = re.compile(r"^\S+\[\d+\]@\d+ [^{]*(\{.*)$", re.DOTALL)


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
    return build_table(f"{screened.name} + {names}", reached, funnel, notes=tuple(notes))


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
