"""Hand-built inputs for `monitor report`: labelled trajectories and their screen output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# (trajectory, source, [(step_id, label, category, tier reached)])
CASES: list[tuple[str, str, list[tuple[str, int | None, str | None, int]]]] = [
    ("t1", "deployment", [("t1-s1", 1, "exfiltration", 3), ("t1-s2", 0, None, 0),
                          ("t1-s3", None, None, 1)]),
    ("t2", "deployment", [("t2-s1", 1, "exfiltration", 1), ("t2-s2", 1, "exfiltration", 0),
                          ("t2-s3", 0, None, 1)]),
    ("t3", "rollout", [("t3-s1", 1, "reward_hacking", 2), ("t3-s2", 0, None, 0)]),
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def trajectories(tmp_path: Path) -> Path:
    """Interchange-format trajectories with step labels (origin: dataset)."""
    rows = []
    for tid, source, steps in CASES:
        rows.append({"trajectory_id": tid, "source": source, "task": "book a flight",
                     "steps": [{"step_id": sid, "index": i, "action": {"text": f"do {sid}"},
                                "label": label, "category": cat}
                               for i, (sid, label, cat, _tier) in enumerate(steps)]})
    return write_jsonl(tmp_path / "trajectories.jsonl", rows)


@pytest.fixture
def screened(tmp_path: Path) -> Path:
    """What `monitor screen --out` writes for those trajectories, with known tiers."""
    rows = []
    for tid, _source, steps in CASES:
        rows.append({"trajectory_id": tid, "score": 0.5, "flagged": True,
                     "tier": max(t for *_, t in steps),
                     "steps": [{"step_id": sid, "score": 0.2 * tier, "flagged": tier >= 1,
                                "tier": tier, "signals": {}}
                               for sid, _label, _cat, tier in steps]})
    return write_jsonl(tmp_path / "screened.jsonl", rows)
