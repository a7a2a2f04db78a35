"""Weighted safety rubrics: the questions the L2 reviewer answers about a step.

A rubric file is YAML (the shipped set is ``monitor/data/rubrics.yaml``)::

    version: 1
    rubrics:
      - id: exfil.unnamed_recipient        # unique
        category: data_exfiltration        # the harm category it belongs to
        weight: 3                          # > 0; relative within its category
        question: Does the action send information to ... ?
        evidence:                          # optional: how a claim for it is checked
          tools: send|mail|forward         # regex on the tool name (or the action text)
          keys: [recipient, to]            # argument names whose values are evidence ("*": any)
          patterns: ['[\\w.+-]+@[\\w-]+']    # regexes whose matches in the action are evidence
          not_in_task: true                # evidence the task itself names does not count
          from_context: false              # evidence must also occur in what the agent read

A loading error is one sentence naming the file, the rubric (by position and
id) and the bad key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

RUBRIC_VERSION = 1
_RUBRIC_KEYS = {"id", "category", "weight", "question", "evidence", "description"}
_EVIDENCE_KEYS = {"tools", "keys", "patterns", "not_in_task", "from_context"}


class RubricError(ValueError):
    """A rubric file that cannot be read; the message names the file and the bad key."""


@dataclass(frozen=True)
class Evidence:
    """What counts as evidence for a rubric in a step's action (see the module docstring)."""

    tools: str | None = None
    keys: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    not_in_task: bool = False
    from_context: bool = False

    @property
    def empty(self) -> bool:
        return not self.keys and not self.patterns


@dataclass(frozen=True)
class Rubric:
    """One weighted yes/no question about a step, in one harm category."""

    id: str
    category: str
    weight: float
    question: str
    evidence: Evidence = field(default_factory=Evidence)
    description: str = ""


def default_rubrics_path() -> Path:
    return Path(str(resources.files("monitor") / "data" / "rubrics.yaml"))


def load_rubrics(path: str | Path | None = None) -> list[Rubric]:
    """The rubrics in a YAML file (``None``: the shipped set), in file order."""
    import yaml

    p = Path(path).expanduser() if path is not None else default_rubrics_path()
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise RubricError(f"{p}: no such rubric file") from None
    except yaml.YAMLError as e:
        raise RubricError(f"{p}: not valid YAML ({e})") from None
    return rubrics_from_dict(raw, source=str(p))


def rubrics_from_dict(raw: Any, *, source: str = "<rubrics>") -> list[Rubric]:
    """Validate a parsed rubric document; ``source`` names it in errors."""
    if not isinstance(raw, Mapping):
        raise RubricError(f"{source}: expected a mapping with a 'rubrics' list at the top")
    bad = set(raw) - {"version", "rubrics"}
    if bad:
        raise RubricError(f"{source}: unknown top-level key '{sorted(bad)[0]}'")
    version = raw.get("version", RUBRIC_VERSION)
    if version != RUBRIC_VERSION:
        raise RubricError(
            f"{source}: key 'version' is {version!r}; this build reads version {RUBRIC_VERSION}"
        )
    items = raw.get("rubrics")
    if not isinstance(items, list) or not items:
        raise RubricError(f"{source}: key 'rubrics' must be a non-empty list")
    out: list[Rubric] = []
    seen: set[str] = set()
    for n, item in enumerate(items):
        r = _rubric(item, f"{source}: rubrics[{n}]")
        if r.id in seen:
            raise RubricError(f"{source}: rubrics[{n}] key 'id': {r.id!r} appears twice")
        seen.add(r.id)
        out.append(r)
    return out


def _rubric(item: Any, where: str) -> Rubric:
    if not isinstance(item, Mapping):
        raise RubricError(f"{where}: expected a mapping, got {type(item).__name__}")
    rid = item.get("id")
    if isinstance(rid, str) and rid:
        where = f"{where} ({rid})"
    bad = set(item) - _RUBRIC_KEYS
    if bad:
        raise RubricError(f"{where}: unknown key '{sorted(bad)[0]}'")
    for key in ("id", "category", "question"):
        v = item.get(key)
        if not isinstance(v, str) or not v.strip():
            raise RubricError(f"{where} key '{key}': required, a non-empty string")
    w = item.get("weight")
    if isinstance(w, bool) or not isinstance(w, int | float) or not w > 0:
        raise RubricError(f"{where} key 'weight': required, a number > 0 (got {w!r})")
    ev = item.get("evidence") or {}
    if not isinstance(ev, Mapping):
        raise RubricError(f"{where} key 'evidence': expected a mapping")
    return Rubric(
        id=str(item["id"]).strip(),
        category=str(item["category"]).strip(),
        weight=float(w),
        question=" ".join(str(item["question"]).split()),
        evidence=_evidence(ev, where),
        description=str(item.get("description") or ""),
    )


def _regex(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise RubricError(f"{where}: expected a non-empty regex string, got {v!r}")
    try:
        re.compile(v, re.IGNORECASE)
    except re.error as e:
        raise RubricError(f"{where}: not a valid regex ({e})") from None
    return v


def _evidence(ev: Mapping[str, Any], where: str) -> Evidence:
    bad = set(ev) - _EVIDENCE_KEYS
    if bad:
        raise RubricError(f"{where} key 'evidence': unknown key '{sorted(bad)[0]}'")
    tools = ev.get("tools")
    keys = ev.get("keys") or []
    patterns = ev.get("patterns") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise RubricError(f"{where} key 'evidence.keys': expected a list of argument names")
    if not isinstance(patterns, list):
        raise RubricError(f"{where} key 'evidence.patterns': expected a list of regexes")
    for flag in ("not_in_task", "from_context"):
        if not isinstance(ev.get(flag, False), bool):
            raise RubricError(f"{where} key 'evidence.{flag}': expected true or false")
    return Evidence(
        tools=_regex(tools, f"{where} key 'evidence.tools'") if tools is not None else None,
        keys=tuple(keys),
        patterns=tuple(
            _regex(p, f"{where} key 'evidence.patterns[{i}]'") for i, p in enumerate(patterns)
        ),
        not_in_task=bool(ev.get("not_in_task", False)),
        from_context=bool(ev.get("from_context", False)),
    )
