"""`monitor rlhealth` offline: a synthetic run written and read back, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.cli.main import main as monitor_main


def main(argv: list[str]) -> int:
    """``monitor rlhealth ARGV``, in process."""
    return monitor_main(["rlhealth", *argv])


def test_simulate_then_report_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run.jsonl"
    assert main(["--simulate", str(run), "--phi", "1", "--mu", "2"]) == 0
    assert "rewards collapse at 10" in capsys.readouterr().out
    out_json = tmp_path / "report.json"
    assert main(["--file", str(run), "--phi", "1", "--mu", "2", "--out", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "expected phi + (mu - 1)/2 = 1.500" in text
    assert "[drift] off-policy drift" in text and "over J_max" in text
    report = json.loads(out_json.read_text())
    assert report["executions"] == 224 and report["staleness"]["expected"] == 1.5
    assert min(a["version"] for a in report["alerts"] if a["kind"] == "drift") < 10


def test_bad_input_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"execution_id": "e", "call_id": "c", "input_ids": [1], "output_ids": "x"}\n')
    assert main(["--file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("monitor rlhealth: line 1: invalid tito.call record: field 'output_ids'")
    assert main(["--file", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["--file", str(bad), "--mu", "0"]) == 2
    assert "--mu must be >= 1" in capsys.readouterr().err
