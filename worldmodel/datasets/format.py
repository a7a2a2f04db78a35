"""Transition datasets: the on-disk format the world model trains on.

A dataset is a folder::

    DATASET/
      manifest.json                 what it is (see ``Manifest``)
      transitions.jsonl             one ``Transition`` a line, every split
      trajectories.jsonl            the same data as DESIGN §2.1 interchange trajectories
      screens/<id>.png              screenshots, referenced by relative path

A transition is ``(history, observation_t, action_t, observation_{t+1}, labels)``.
``split`` says where it may be used: ``train`` and ``val`` are for fitting
and tuning; every split starting with ``test`` is held out (evaluation only).
Labels: ``label`` = 1 when the action serves an attacker or is destructive
(the manifest says how labels were derived); ``injected`` = 1 when the
observation the agent acted on carries injected instructions, ``next_injected``
the same for the observation after the action.

Builders write with :class:`DatasetWriter`; training reads with
:func:`read_transitions`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streams.records import Trajectory, encode

FORMAT_VERSION = 1
HISTORY = 4  # (observation, action) pairs kept before the current step


@dataclass(frozen=True)
class View:
    """What was seen: text (DOM text, tool result, prompt) and an optional screenshot path."""

    text: str = ""
    screenshot: str | None = None


@dataclass(frozen=True)
class Transition:
    transition_id: str
    trajectory_id: str
    split: str
    index: int
    task: str
    observation: View
    action_text: str
    next_observation: View
    history: tuple[tuple[str, str], ...] = ()  # last HISTORY (observation text, action text)
    tool: dict[str, Any] | None = None  # {"name", "arguments"}
    gui: dict[str, Any] | None = None  # {"kind", "x", "y", "text", ...}
    label: int = 0
    injected: int = 0
    next_injected: int = 0
    category: str | None = None
    reward: float | None = None
    group: str = ""  # what must not straddle train/val: user task, env task, ...
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["history"] = [list(h) for h in self.history]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Transition:
        d = dict(d)
        d["observation"] = View(**d["observation"])
        d["next_observation"] = View(**d["next_observation"])
        d["history"] = tuple((h[0], h[1]) for h in d.get("history", ()))
        return cls(**d)


@dataclass
class Manifest:
    name: str
    source: str  # "agentdojo 0.1.35", "miniwob 1.1.0 in chromium 156", ...
    how: str  # how it was made, one paragraph
    label_semantics: dict[str, str]
    rule_derived_labels: bool
    builder_args: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> name -> n
    held_out_splits: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # file -> sha256
    created_at: float = 0.0
    format_version: int = FORMAT_VERSION

    @property
    def content_hash(self) -> str:
        """One hash over the data files: what a checkpoint records it was trained on."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}:{self.files[name]}\n".encode())
        return h.hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class DatasetWriter:
    """``with DatasetWriter(dir, manifest) as w: w.add(transition); w.add_trajectory(t)``.

    Counts per split are computed from what was written; the manifest is
    written last, so a folder with a manifest is complete.
    """

    def __init__(self, root: str | Path, manifest: Manifest) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "screens").mkdir(exist_ok=True)
        (self.root / "manifest.json").unlink(missing_ok=True)
        self._transitions = (self.root / "transitions.jsonl").open("w")
        self._trajectories = (self.root / "trajectories.jsonl").open("wb")
        self._counts: dict[str, Counter[str]] = defaultdict(Counter)
        self._trajectory_ids: dict[str, set[str]] = defaultdict(set)

    def screen_path(self, name: str) -> tuple[Path, str]:
        """Where to save a screenshot, and the relative path to store in a View."""
        rel = f"screens/{name}.png"
        return self.root / rel, rel

    def add(self, t: Transition) -> None:
        self._transitions.write(json.dumps(t.to_json(), sort_keys=True) + "\n")
        c = self._counts[t.split]
        c["transitions"] += 1
        c["harmful"] += t.label
        c["injected_observations"] += t.injected
        c["screenshots"] += int(t.observation.screenshot is not None)
        self._trajectory_ids[t.split].add(t.trajectory_id)

    def add_trajectory(self, trajectory: Trajectory) -> None:
        self._trajectories.write(encode(trajectory) + b"\n")

    def close(self) -> Manifest:
        self._transitions.close()
        self._trajectories.close()
        m = self.manifest
        m.counts = {
            split: {**dict(c), "trajectories": len(self._trajectory_ids[split])}
            for split, c in sorted(self._counts.items())
        }
        m.held_out_splits = sorted(s for s in m.counts if s.startswith("test"))
        files = ["transitions.jsonl", "trajectories.jsonl"]
        files += sorted(f"screens/{p.name}" for p in (self.root / "screens").glob("*.png"))
        m.files = {f: _sha256(self.root / f) for f in files}
        m.created_at = time.time()
        (self.root / "manifest.json").write_text(json.dumps(asdict(m), indent=2, sort_keys=True))
        return m

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._transitions.close()
            self._trajectories.close()


def read_manifest(root: str | Path) -> Manifest:
    path = Path(root) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{root}: not a transition dataset (no manifest.json); build one with "
            "`monitor worldmodel build-data`"
        )
    return Manifest(**json.loads(path.read_text()))


def read_transitions(root: str | Path, splits: Iterable[str] | None = None) -> Iterator[Transition]:
    """Transitions of ``splits`` (all when None), screenshots as paths under ``root``."""
    root = Path(root)
    read_manifest(root)
    wanted = set(splits) if splits is not None else None
    with (root / "transitions.jsonl").open() as f:
        for line in f:
            t = Transition.from_json(json.loads(line))
            if wanted is None or t.split in wanted:
                yield t


def history_of(pairs: list[tuple[str, str]], k: int = HISTORY) -> tuple[tuple[str, str], ...]:
    return tuple(pairs[-k:]) if k else ()
