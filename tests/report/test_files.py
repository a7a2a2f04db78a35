"""`monitor report` from files: `monitor screen` output joined with step labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.report import (
    RecallTable,
    ReportError,
    format_table,
    parse_duration,
    recall_from_files,
    render_report,
)
from tests.report.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def monitor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    return subprocess.run([sys.executable, "-m", "monitor.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def assert_png(path: Path, min_bytes: int = 10_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > min_bytes, f"{path} is only {len(data)} bytes"


@pytest.fixture
def label_records(tmp_path: Path) -> Path:
    """Human labels: one new harmful step, one step relabelled twice, one unknown step;
    the last line as `monitor tail vigil.labels` prints it."""
    recs = [
        {"trajectory_id": "t3", "step_id": "t3-s2", "label": 1, "category": "reward_hacking",
         "origin": "human", "reviewer": "ana"},
        {"trajectory_id": "t1", "step_id": "t1-s3", "label": 1, "category": "exfiltration",
         "origin": "human"},
        {"trajectory_id": "t1", "step_id": "t1-s3", "label": 0, "origin": "human"},
    ]
    path = write_jsonl(tmp_path / "labels.jsonl", recs)
    unknown = {"trajectory_id": "t9", "step_id": "t9-s1", "label": 1, "origin": "human"}
    with path.open("a") as f:
        f.write(f"vigil.labels[0]@3 key=t9 {json.dumps(unknown)}\n")
    return path


def recall(table: RecallTable, origin: str, tier: int) -> tuple[float, float, float]:
    if origin == "all":
        g = table.overall()
    else:
        (g,) = [g for g in table.aggregate(("origin",)) if g.origin == origin]
    p = g.tier(tier).harmful
    assert p.value is not None and p.lower is not None and p.upper is not None
    return p.value, p.lower, p.upper


def test_recall_per_tier_from_dataset_labels_matches_hand_computed_wilson(
        screened: Path, trajectories: Path) -> None:
    table = recall_from_files(screened, [trajectories])
    # harmful steps reached tiers 3, 1, 0 (deployment) and 2 (rollout): 3/4, 2/4, 1/4
    overall = table.overall()
    assert overall.harmful == 4 and overall.benign == 3
    expected = {1: (0.75, 0.3006, 0.9544), 2: (0.5, 0.15, 0.85), 3: (0.25, 0.0456, 0.6994)}
    for tier, want in expected.items():
        assert recall(table, "all", tier) == pytest.approx(want, abs=1e-4)
    assert recall(table, "all", 0) == pytest.approx((1.0, 0.5101, 1.0), abs=1e-4)
    # benign: one of three reached L1 (t2-s3)
    fpr = overall.tier(1).benign
    assert (fpr.caught, fpr.total) == (1, 3)
    assert (fpr.lower, fpr.upper) == pytest.approx((0.0615, 0.7923), abs=1e-4)
    by_stream = {g.stream: g for g in table.aggregate(("stream",))}
    assert set(by_stream) == {"deployment", "rollout"}
    dep = by_stream["deployment"].tier(1).harmful
    assert (dep.caught, dep.total) == (2, 3)
    assert (dep.lower, dep.upper) == pytest.approx((0.2077, 0.9385), abs=1e-4)
    assert {g.origin for g in table.groups} == {"dataset"}
    assert {g.category for g in table.groups} == {"exfiltration", "reward_hacking", "none"}
    # every screened step, labelled or not: tiers 3,0,1 / 1,0,1 / 2,0
    assert table.funnel_steps() == {0: 8, 1: 5, 2: 2, 3: 1}
    assert table.page_precision is None and table.notes == ()


def test_label_records_override_and_add_origins(screened: Path, trajectories: Path,
                                                label_records: Path) -> None:
    table = recall_from_files(screened, [trajectories, label_records])
    origins = {g.origin: g for g in table.aggregate(("origin",))}
    assert set(origins) == {"dataset", "human"}
    human = origins["human"]
    # a step counts once per origin: the human verdict on t3-s2 (tier 0, benign in the
    # dataset) is a harmful step L1 missed; t1-s3 harmful, then benign: the later verdict
    # of the same origin wins, so it is a benign step that reached L1
    assert (human.harmful, human.tier(1).harmful.caught) == (1, 0)
    assert human.tier(1).harmful.upper == pytest.approx(0.7935, abs=1e-4)
    assert (human.benign, human.tier(1).benign.caught) == (1, 1)
    assert recall(table, "dataset", 1) == pytest.approx((0.75, 0.3006, 0.9544), abs=1e-4)
    assert (origins["dataset"].harmful, origins["dataset"].benign) == (4, 3)
    assert recall(table, "all", 1) == pytest.approx((0.6, 0.2307, 0.8824), abs=1e-4)
    assert table.notes == ("1 of 9 labelled steps were not in the screened file",)


def test_a_benign_trajectory_labels_its_steps_and_a_harmful_one_is_noted(
        screened: Path, tmp_path: Path) -> None:
    labels = write_jsonl(tmp_path / "verdicts.jsonl", [
        {"trajectory_id": "t2", "label": 0, "origin": "reviewer"},
        {"trajectory_id": "t3", "label": 1, "origin": "reviewer"},
        {"trajectory_id": "t3", "step_id": "t3-s1", "label": 1, "origin": "reviewer"},
    ])
    table = recall_from_files(screened, [labels])
    (g,) = table.aggregate(("origin",))
    fpr = g.tier(1).benign  # t2's steps reached tiers 1, 0, 1
    assert (g.origin, fpr.caught, fpr.total) == ("reviewer", 2, 3)
    assert (g.harmful, g.tier(2).harmful.caught) == (1, 1)
    assert {x.stream for x in table.groups} == {"unknown"}  # label records carry no stream
    assert table.notes == ("1 trajectory labelled harmful without a step label left out",)


def test_pngs_and_json_are_written(screened: Path, trajectories: Path, label_records: Path,
                                   tmp_path: Path) -> None:
    table = recall_from_files(screened, [trajectories, label_records])
    paths = render_report(table, tmp_path / "out")
    assert [p.name for p in paths] == ["recall.png", "funnel.png", "report.json"]
    for p in paths[:2]:
        assert_png(p)
    doc = json.loads((tmp_path / "out" / "report.json").read_text())
    assert doc["overall"]["tiers"][1]["recall"]["value"] == pytest.approx(0.6)
    assert doc["funnel_steps"] == {"0": 8, "1": 5, "2": 2, "3": 1}
    assert {g["origin"] for g in doc["by_origin"]} == {"dataset", "human"}
    text = format_table(table)
    assert "0.600 [0.231, 0.882]" in text and "L1 5 (62.50%)" in text


def test_empty_table_renders_a_no_data_figure(tmp_path: Path) -> None:
    table = RecallTable(source="nothing", groups=(), funnel=())
    paths = render_report(table, tmp_path)
    for p in paths[:2]:
        assert_png(p, min_bytes=5_000)
    assert "no labelled steps" in format_table(table)


def test_cli_prints_the_table_and_the_paths(screened: Path, trajectories: Path,
                                            label_records: Path, tmp_path: Path) -> None:
    out = monitor("report", "--screened", str(screened), "--labels", str(trajectories),
                  "--labels", str(label_records), "--out", str(tmp_path / "rep"))
    assert out.returncode == 0, out.stderr
    assert "recall per tier" in out.stdout
    assert "0.750 [0.301, 0.954]" in out.stdout  # dataset, L1
    for name in ("recall.png", "funnel.png", "report.json"):
        assert f"wrote {tmp_path / 'rep' / name}" in out.stdout
        assert (tmp_path / "rep" / name).stat().st_size > 0


def test_cli_help_has_examples() -> None:
    out = monitor("report", "--help")
    assert out.returncode == 0
    assert "examples:" in out.stdout and "--prometheus" in out.stdout


def one_sentence_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("monitor report: ")
    return lines[0]


def test_cli_screen_output_without_tier_names_file_and_line(tmp_path: Path,
                                                           trajectories: Path) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [
        {"trajectory_id": "t1", "steps": [{"step_id": "t1-s1", "tier": 1}]},
        {"trajectory_id": "t2", "steps": [{"step_id": "t2-s1", "score": 0.3}]},
    ])
    msg = one_sentence_error(monitor("report", "--screened", str(bad), "--labels",
                                     str(trajectories), "--out", str(tmp_path / "o")))
    assert "bad.jsonl: line 2:" in msg and "'tier'" in msg
    assert not (tmp_path / "o").exists()


def test_cli_label_record_missing_key_names_file_and_line(tmp_path: Path,
                                                         screened: Path) -> None:
    bad = write_jsonl(tmp_path / "labels.jsonl", [
        {"trajectory_id": "t1", "step_id": "t1-s1", "label": 1},
        {"trajectory_id": "t1", "step_id": "t1-s2"},
    ])
    msg = one_sentence_error(monitor("report", "--screened", str(screened), "--labels",
                                     str(bad)))
    assert "labels.jsonl: line 2:" in msg and "'label'" in msg


def test_cli_unmatched_ids_say_how_many(tmp_path: Path, trajectories: Path) -> None:
    other = write_jsonl(tmp_path / "other.jsonl", [
        {"trajectory_id": "x1", "steps": [{"step_id": "x1-s1", "tier": 0},
                                          {"step_id": "x1-s2", "tier": 2}]}])
    msg = one_sentence_error(monitor("report", "--screened", str(other), "--labels",
                                     str(trajectories)))
    assert "none of the 7 labelled steps" in msg and "2 screened steps" in msg
    assert "did not match" in msg or "differ" in msg


def test_missing_file_and_wrong_source_combinations(tmp_path: Path, screened: Path) -> None:
    msg = one_sentence_error(monitor("report", "--screened", str(screened), "--labels",
                                     str(tmp_path / "nope.jsonl")))
    assert "nope.jsonl: no such file" in msg
    one_sentence_error(monitor("report", "--screened", str(screened)))
    one_sentence_error(monitor("report"))
    one_sentence_error(monitor("report", "--prometheus", "http://127.0.0.1:9", "--screened",
                               str(screened)))
    with pytest.raises(ReportError, match="not a duration"):
        parse_duration("an hour")
    assert parse_duration("1h30m") == 5400
