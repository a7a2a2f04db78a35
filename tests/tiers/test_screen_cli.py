"""`monitor screen`: the documented output (DESIGN §2.1) on a small real file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.cli.main import main


def _sample(small_agentdojo: Path, out: Path, n: int = 6) -> list[dict]:
    rows = [json.loads(line) for line in (small_agentdojo / "trajectories.jsonl").open()]
    benign = [r for r in rows if r["meta"]["split"] == "val" and r["label"] == 0][: n // 2]
    harmful = [r for r in rows if r["meta"]["split"] == "test_slack" and r["label"] == 1][: n // 2]
    picked = benign + harmful
    out.write_text("".join(json.dumps(r) + "\n" for r in picked))
    return picked


def test_screen_writes_one_documented_line_per_trajectory(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    picked = _sample(small_agentdojo, src)
    assert main(["screen", str(src), "--out", str(dst), "--policy", str(tiny_policy)]) == 0
    lines = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [x["trajectory_id"] for x in lines] == [p["trajectory_id"] for p in picked]
    for line, traj in zip(lines, picked, strict=True):
        assert set(line) == {"trajectory_id", "score", "flagged", "tier", "steps"}
        assert [s["step_id"] for s in line["steps"]] == [s["step_id"] for s in traj["steps"]]
        for s in line["steps"]:
            assert set(s) == {"step_id", "score", "flagged", "tier", "signals"}
            assert 0.0 <= s["score"] <= 1.0 and s["tier"] in (0, 1, 2, 3)
            assert s["flagged"] == (s["tier"] >= 3)  # the policy flags at the paging tier
            assert "wm_harm_post" in s["signals"]  # the results are known offline
        assert line["tier"] == max(s["tier"] for s in line["steps"])
        if any(s["flagged"] for s in line["steps"]):  # a paged step flags its trajectory
            assert line["flagged"]
    assert f"screened {len(picked)} trajectories" in capsys.readouterr().err


def test_screen_names_the_bad_line_before_loading_any_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"trajectory_id": "t", "steps": [{"step_id": "0", "index": 0}]}\n')
    assert main(["screen", str(src), "--policy", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "steps.0.action" in err


def test_screen_without_a_policy_file_says_how_to_make_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "ok.jsonl"
    src.write_text('{"trajectory_id": "t", "steps": [{"step_id": "0", "index": 0, '
                   '"action": {"text": "ls"}}]}\n')
    assert main(["screen", str(src), "--policy", str(tmp_path / "none.json")]) == 2
    assert "monitor calibrate" in capsys.readouterr().err


def test_screening_in_two_worker_processes_gives_the_lines_of_one_in_input_order(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path
) -> None:
    src = tmp_path / "in.jsonl"
    picked = _sample(small_agentdojo, src, n=12)
    out = {}
    for workers in (1, 2):
        dst = tmp_path / f"out{workers}.jsonl"
        assert main(["screen", str(src), "--out", str(dst), "--policy", str(tiny_policy),
                     "--batch-steps", "16", "--workers", str(workers)]) == 0
        out[workers] = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [x["trajectory_id"] for x in out[2]] == [p["trajectory_id"] for p in picked]
    for one, two in zip(out[1], out[2], strict=True):
        assert [s["tier"] for s in two["steps"]] == [s["tier"] for s in one["steps"]]
        assert two["flagged"] == one["flagged"]
        for a, b in zip(one["steps"], two["steps"], strict=True):
            # torch threads differ: bfloat16 kernels sum in another order (1.5e-4 seen on AMX)
            assert b["score"] == pytest.approx(a["score"], abs=1e-3)


def test_adapting_gates_in_several_workers_is_refused_with_the_reason(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    _sample(small_agentdojo, src)
    assert main(["screen", str(src), "--policy", str(tiny_policy), "--adapt",
                 "--workers", "2"]) == 2
    assert "--adapt needs --workers 1" in capsys.readouterr().err


def test_one_bad_line_is_set_aside_and_the_rest_of_the_file_screened(
    small_agentdojo: Path, tiny_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    picked = _sample(small_agentdojo, src, n=4)
    good = src.read_bytes().splitlines(keepends=True)
    truncated = good[1][: len(good[1]) // 2] + b"\n"  # a line cut off mid-write
    surrogate = b'{"trajectory_id": "s", "steps": [{"step_id": "0", "index": 0, ' \
                b'"action": {"text": "hi \xed\xa0\x80"}}]}\n'  # a lone surrogate as raw bytes
    src.write_bytes(good[0] + truncated + good[1] + surrogate + b"".join(good[2:]))
    assert main(["screen", str(src), "--out", str(dst), "--policy", str(tiny_policy)]) == 3
    lines = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [x["trajectory_id"] for x in lines] == [p["trajectory_id"] for p in picked]
    rejects = [json.loads(x) for x in Path(f"{dst}.rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [2, 4]
    assert "not valid JSON" in rejects[0]["error"] and "surrogate" in rejects[1]["error"]
    assert rejects[0]["head"].encode() == truncated.rstrip(b"\n")[:1024]
    assert rejects[0]["bytes"] == len(truncated) - 1
    err = capsys.readouterr().err
    assert "2 line(s) could not be read" in err and "rejected.jsonl" in err
    # --strict: today's stop at the first bad line, nothing screened
    strict = tmp_path / "strict.jsonl"
    assert main(["screen", str(src), "--out", str(strict), "--policy", str(tiny_policy),
                 "--strict"]) == 2
    assert "line 2" in capsys.readouterr().err and not strict.exists()
