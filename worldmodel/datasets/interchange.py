"""What the builders that read interchange trajectories share (ToolEmu, OpenAgentSafety,
StepShield): the shipped files, reading one, one transition per step, the cap on long texts,
the source's provenance, and the whole build of a corpus that makes one domain.

A builder reads a file of DESIGN §2.1 trajectories with :func:`read_trajectories` (every
error is one sentence naming the file and the line), caps its long texts with
:func:`cap_trajectory`, and writes each trajectory with :func:`add_trajectory`: one
:class:`~worldmodel.datasets.format.Transition` per step, then the trajectory itself with
its domain, split and group in ``meta``. A corpus that is one domain and splits train/val by
a group (OpenAgentSafety, StepShield) is described by a :class:`Corpus` and built by
its :meth:`Corpus.build`; ToolEmu, three domains and an option, uses the parts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.records import RecordError, Step, Trajectory, decode
from worldmodel.datasets.agentdojo.trajectories import val_groups
from worldmodel.datasets.format import (
    HISTORY,
    DatasetWriter,
    Manifest,
    Transition,
    View,
    history_of,
)

# ../shared/data beside the repository root, where the shipped source files lie
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
VAL_FRACTION = 0.2  # the share of groups that is val
MAX_CHARS = 20_000  # a text of a transition (and of a trajectory written) at most, by default

# (field, what is wrong) for a trajectory a builder cannot use, None for one it can
Check = Callable[[Trajectory], tuple[str, str] | None]
# a step's (label, category, meta added to the trajectory's)
StepLabel = Callable[[Step], tuple[int, str | None, dict[str, Any]]]


def shipped_source(name: str) -> Path:
    """``../shared/data/<name>/train.jsonl`` beside the checkout."""
    return SHARED_DATA / name / "train.jsonl"


def default_source(env: str, name: str) -> Path:
    """``$<env>`` if set, else the shipped file of ``name`` (:func:`shipped_source`)."""
    return Path(os.environ.get(env) or shipped_source(name))


def read_trajectories(
    path: Path, *, what: str, env: str, builder: str, check: Check | None = None
) -> list[Trajectory]:
    """The trajectories of ``path``, in order. A missing file, a line that is not a valid
    trajectory, or one that ``check`` finds wanting is one :class:`ValueError` (a
    :class:`FileNotFoundError` for the file) naming the file and the line."""
    if not path.is_file():
        raise FileNotFoundError(
            f"no {what} trajectories at {path}: pass the file with --source PATH "
            f"({builder}(source=...)) or set ${env}"
        )
    out: list[Trajectory] = []
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                t = decode(raw, Trajectory, line=n)
                bad = check(t) if check is not None else None
                if bad is not None:
                    raise RecordError("trajectory", bad[1], field=bad[0], line=n)
                out.append(t)
    except RecordError as e:
        raise ValueError(f"{path}: {e}") from None
    return out


def required_meta(types: Mapping[str, type | tuple[type, ...]]) -> Check:
    """A :data:`Check` that each key of ``types`` is in ``meta`` with a value of that type."""

    def check(t: Trajectory) -> tuple[str, str] | None:
        for key, typ in types.items():
            if key not in t.meta:
                return f"meta.{key}", "required key is missing"
            if not isinstance(t.meta[key], typ):
                names = " or ".join(k.__name__ for k in (typ if isinstance(typ, tuple) else (typ,)))
                return f"meta.{key}", f"expected {names}, got {type(t.meta[key]).__name__}"
        return None

    return check


def cap_text(text: str, max_chars: int) -> str:
    """``text`` if at most ``max_chars`` long, else its head and ``[... N characters cut]``."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n[... {len(text) - max_chars} characters cut]"


def _cap_value(value: Any, max_chars: int) -> Any:
    if isinstance(value, str):
        return cap_text(value, max_chars)
    if isinstance(value, dict):
        return {k: _cap_value(v, max_chars) for k, v in value.items()}
    if isinstance(value, list):
        return [_cap_value(v, max_chars) for v in value]
    return value


def cap_trajectory(t: Trajectory, max_chars: int) -> tuple[Trajectory, int]:
    """``t`` with the task, each step's observation, action and result texts and each
    string in a call's arguments cut to ``max_chars`` (:func:`cap_text`), and how many of
    those texts (arguments not counted) were cut."""
    texts = [t.task]
    for s in t.steps:
        texts += [s.observation.text, s.action.text, s.result.text if s.result else ""]
    steps = []
    for s in t.steps:
        update: dict[str, Any] = {
            "observation": s.observation.model_copy(
                update={"text": cap_text(s.observation.text, max_chars)}
            )
        }
        tool = s.action.tool
        if tool is not None:
            tool = tool.model_copy(update={"arguments": _cap_value(tool.arguments, max_chars)})
        update["action"] = s.action.model_copy(
            update={"text": cap_text(s.action.text, max_chars), "tool": tool}
        )
        if s.result is not None:
            update["result"] = s.result.model_copy(
                update={"text": cap_text(s.result.text, max_chars)}
            )
        steps.append(s.model_copy(update=update))
    cut = sum(len(x) > max_chars for x in texts)
    return t.model_copy(update={"task": cap_text(t.task, max_chars), "steps": steps}), cut


def prefixed(trajectory_id: str, prefix: str) -> str:
    """``trajectory_id`` under ``prefix`` (``toolemu/``, ...), unless it already is."""
    return trajectory_id if trajectory_id.startswith(prefix) else f"{prefix}{trajectory_id}"


def transitions_of(
    t: Trajectory,
    *,
    trajectory_id: str,
    split: str,
    group: str,
    meta: dict[str, Any],
    step_label: StepLabel | None = None,
) -> list[Transition]:
    """One transition per step of ``t``: its label, category and added meta from
    ``step_label`` (None: every step carries the trajectory's label, no category)."""
    out: list[Transition] = []
    pairs: list[tuple[str, str]] = []
    for i, s in enumerate(t.steps):
        tool = s.action.tool
        label, category, extra = (
            step_label(s) if step_label is not None else (int(t.label or 0), None, {})
        )
        out.append(
            Transition(
                transition_id=f"{trajectory_id}/{i}",
                trajectory_id=trajectory_id,
                split=split,
                index=i,
                task=t.task,
                observation=View(text=s.observation.text),
                action_text=s.action.text,
                next_observation=View(text=s.result.text if s.result else ""),
                history=history_of(pairs),
                tool={"name": tool.name, "arguments": dict(tool.arguments)} if tool else None,
                label=label,
                category=category,
                group=group,
                meta={**meta, **extra} if extra else meta,
            )
        )
        pairs.append((s.observation.text, s.action.text))
    return out


def add_trajectory(
    writer: DatasetWriter,
    t: Trajectory,
    *,
    trajectory_id: str,
    split: str,
    group: str,
    domain: str,
    meta: dict[str, Any],
    step_label: StepLabel | None = None,
) -> list[Transition]:
    """Write ``t``'s transitions (``meta`` and the domain on each step, see
    :func:`transitions_of`) and ``t`` itself, renamed ``trajectory_id``, with its domain,
    split and group added to its ``meta``; return the transitions."""
    transitions = transitions_of(
        t,
        trajectory_id=trajectory_id,
        split=split,
        group=group,
        meta={"domain": domain, **meta},
        step_label=step_label,
    )
    for tr in transitions:
        writer.add(tr)
    writer.add_trajectory(
        t.model_copy(
            update={
                "trajectory_id": trajectory_id,
                "meta": {**t.meta, "domain": domain, "split": split, "group": group},
            }
        )
    )
    return transitions


def source_note(path: Path) -> dict[str, Any]:
    """The ``source`` block of the ``manifest.json`` beside the file, where there is one."""
    try:
        note = json.loads((path.parent / "manifest.json").read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return {}
    return note if isinstance(note, dict) else {}


def origin_of(note: Mapping[str, Any]) -> str:
    """`` (repo commit)`` from a :func:`source_note`, empty where it names no repository."""
    return f" ({note['repo']} {str(note.get('commit', ''))[:7]})" if "repo" in note else ""


def builder_args(
    path: Path,
    note: Mapping[str, Any],
    *,
    seed: int,
    val_fraction: float,
    max_chars: int | None = None,
) -> dict[str, Any]:
    """What every such build records in ``builder_args``: the source (path, sha256, origin),
    the seed, the val share, the history length and the cap on texts (where there is one)."""
    args = {
        "source": str(path),
        "source_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "source_origin": dict(note),
        "seed": seed,
        "val_fraction": val_fraction,
        "history": HISTORY,
    }
    return args if max_chars is None else {**args, "max_chars": max_chars}


def report(name: str, out_dir: str | Path, manifest: Manifest, t0: float, more: str) -> None:
    """The one line on stderr a build ends with: what it wrote per split, ``more``, time."""
    totals = ", ".join(
        f"{s} {c['trajectories']}/{c['transitions']}" for s, c in manifest.counts.items()
    )
    print(
        f"{name}: wrote {out_dir} (trajectories/transitions: {totals}; {more}) "
        f"in {time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
    )


@dataclass(frozen=True)
class Corpus:
    """A source of interchange trajectories that makes one domain, and what its build keeps
    of each trajectory; :meth:`build` writes its dataset."""

    name: str  # the dataset's name, its one domain and its trajectory ids' prefix
    title: str  # what messages and the manifest's source call it
    env: str  # the variable that names the source file
    how: str  # the manifest's paragraph, formatted by :meth:`build`
    label_semantics: dict[str, str]
    grouping: str  # what a group (what never straddles train/val) is, in words
    check: Check  # what a trajectory needs beyond the interchange format
    groups: Callable[[Sequence[Trajectory]], list[str]]  # each trajectory's group
    step_meta: Callable[[Trajectory], dict[str, Any]]  # on each of its steps
    counts: Callable[[Trajectory], dict[str, int]]  # added up per split and domain
    distinct: Callable[[Trajectory], dict[str, str]]  # distinct values counted likewise
    step_label: Callable[[Trajectory], StepLabel] | None = None  # None: the trajectory's
    max_chars: int = MAX_CHARS

    @property
    def prefix(self) -> str:
        return f"{self.name}/"

    def default_source(self) -> Path:
        """``$<env>`` if set, else the shipped ``../shared/data/<name>/train.jsonl``."""
        return default_source(self.env, self.name)

    def build(
        self,
        out_dir: str | Path,
        *,
        source: str | Path | None = None,
        seed: int = 0,
        val_fraction: float = VAL_FRACTION,
        progress: bool = True,
    ) -> Manifest:
        """Write this corpus's transition dataset to ``out_dir`` from ``source`` (default:
        :meth:`default_source`) and return its manifest.

        Every text is cut to ``max_chars`` (:func:`cap_trajectory`); the lowest-hashing
        ``val_fraction`` of the groups is ``val``
        (:func:`~worldmodel.datasets.agentdojo.trajectories.val_groups`), the rest ``train``.
        ``how`` is formatted with ``source`` (the file's name), ``max_chars``, ``val``
        (the fraction) and the domain's counts (``trajectories``, ``transitions``,
        ``texts_cut``, ``groups`` and those of ``counts`` and ``distinct``).
        """
        t0 = time.perf_counter()
        path = Path(source) if source is not None else self.default_source()
        trajectories = read_trajectories(
            path,
            what=self.title,
            env=self.env,
            builder=f"build_{self.name}",
            check=self.check,
        )
        groups = [self.prefix + g for g in self.groups(trajectories)]
        val = val_groups(sorted(set(groups)), seed=seed, val_fraction=val_fraction)
        note = source_note(path)
        manifest = Manifest(
            name=self.name,
            source=f"{self.title}{origin_of(note)}, {path.name}",
            how="",
            label_semantics=self.label_semantics,
            rule_derived_labels=False,
        )
        tally: dict[str, Counter[str]] = defaultdict(Counter)  # split or domain -> counts
        seen: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        with DatasetWriter(out_dir, manifest) as writer:
            for source_t, group in zip(trajectories, groups, strict=True):
                t, cut = cap_trajectory(source_t, self.max_chars)
                split = "val" if group in val else "train"
                add_trajectory(
                    writer,
                    t,
                    trajectory_id=prefixed(t.trajectory_id, self.prefix),
                    split=split,
                    group=group,
                    domain=self.name,
                    meta=self.step_meta(t),
                    step_label=self.step_label(t) if self.step_label else None,
                )
                for key in (split, self.name):
                    tally[key].update(
                        trajectories=1, transitions=len(t.steps), texts_cut=cut, **self.counts(t)
                    )
                    for name, value in {"groups": group, **self.distinct(t)}.items():
                        seen[key][name].add(value)
            written = {
                key: {**dict(c), **{n: len(v) for n, v in sorted(seen[key].items())}}
                for key, c in sorted(tally.items())
            }
            manifest.how = self.how.format(
                source=path.name, max_chars=self.max_chars, val=val_fraction, **written[self.name]
            )
            manifest.builder_args = {
                **builder_args(
                    path, note, seed=seed, val_fraction=val_fraction, max_chars=self.max_chars
                ),
                "grouping": self.grouping,
                "splits": {k: v for k, v in written.items() if k != self.name},
                "domains": {self.name: written[self.name]},
                "val_groups": sorted(g.removeprefix(self.prefix) for g in val),
            }
        if progress:
            report(self.name, out_dir, manifest, t0, f"domain {self.name}")
        return manifest
