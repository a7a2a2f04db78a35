"""Checks the builders that read a file of interchange trajectories share (ToolEmu,
OpenAgentSafety, StepShield): a transition carries its step, a malformed line is refused."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from monitor.cli.main import main
from streams.records import Trajectory, read_jsonl
from worldmodel.datasets.format import HISTORY, Manifest, Transition, read_transitions
from worldmodel.datasets.interchange import cap_text

Built = tuple[Path, Manifest, list[Transition]]  # the folder, its manifest, its transitions


def read_source(path: Path, prefix: str) -> dict[str, Trajectory]:
    """The trajectories of ``path`` by the id the builder gives them (``prefix`` + theirs)."""
    return {f"{prefix}{t.trajectory_id}": t for t in read_jsonl(path, Trajectory)}


def build_into(
    tmp_path_factory: pytest.TempPathFactory, build: Callable[..., Manifest], source: Path
) -> Built:
    """``build`` run on ``source`` into a fresh folder."""
    out = tmp_path_factory.mktemp("built")
    manifest = build(out, source=source, progress=False)
    return out, manifest, list(read_transitions(out))


def by_trajectory(transitions: list[Transition]) -> dict[str, list[Transition]]:
    """Each trajectory's transitions, in step order."""
    out: dict[str, list[Transition]] = defaultdict(list)
    for t in sorted(transitions, key=lambda t: t.index):
        out[t.trajectory_id].append(t)
    return dict(out)


def assert_holds_its_step(t: Transition, traj: Trajectory, max_chars: int | None = None) -> None:
    """``t`` holds its step's texts (cut at ``max_chars``), call and history, and the task."""

    def cut(text: str) -> str:
        return text if max_chars is None else cap_text(text, max_chars)

    step = traj.steps[t.index]
    assert t.task == cut(traj.task)
    assert t.observation.text == cut(step.observation.text)
    assert t.action_text == cut(step.action.text)
    assert t.next_observation.text == cut(step.result.text if step.result else "")
    if step.action.tool is None:
        assert t.tool is None
    else:
        assert t.tool is not None and t.tool["name"] == step.action.tool.name
        if max_chars is None:
            assert t.tool == step.action.tool.model_dump()
    earlier = [(cut(s.observation.text), cut(s.action.text)) for s in traj.steps[: t.index]]
    assert list(t.history) == earlier[-HISTORY:]
    assert t.injected == 0


# how -> (what it does to the parsed line, None: cut it short; what the refusal then says)
Break = tuple[Callable[[dict[str, Any]], object] | None, str]
COMMON_BREAKS: dict[str, Break] = {
    "not json": (None, "not valid JSON"),
    "no action": (
        lambda d: d["steps"][0].pop("action"),
        "'steps.0.action': required key is missing",
    ),
    "step label 2": (lambda d: d["steps"][0].update(label=2), "'steps.0.label': input should be"),
}


def assert_refused_naming_line_2(
    build: Callable[..., object],
    name: str,
    source: Path,
    how: Break,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A copy of ``source``'s first 3 lines with the second broken ``how`` is refused in one
    sentence naming the file, line 2 and what is wrong: by ``build`` (the Python API) and by
    ``monitor worldmodel build-data NAME`` (exit status 2, one line on stderr)."""
    change, expected = how
    with source.open() as f:
        lines = [next(f).rstrip("\n") for _ in range(3)]
    if change is None:
        lines[1] = lines[1][: len(lines[1]) // 2]
    else:
        d = json.loads(lines[1])
        change(d)
        lines[1] = json.dumps(d)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(ValueError) as caught:
        build(out, source=bad, progress=False)
    message = str(caught.value)
    assert message.startswith(f"{bad}: line 2: ") and expected in message
    assert "\n" not in message and not (out / "manifest.json").exists()

    cmd = ["worldmodel", "build-data", name, "--source", str(bad), "--out", str(out)]
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{bad}: line 2: " in err[0] and expected in err[0]
