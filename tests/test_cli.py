"""The `monitor` CLI as a user runs it: a subprocess against the real broker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "monitor" / "data" / "sample_trajectories.jsonl"


def monitor(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "monitor.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=timeout,
    )


def test_help_lists_subcommands_with_examples_and_imports_nothing_heavy() -> None:
    out = monitor("--help")
    assert out.returncode == 0
    for word in ("replay", "tail", "broker", "demo", "examples:", "VIGIL_KAFKA_BOOTSTRAP_SERVERS"):
        assert word in out.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from monitor.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in ('kafka', 'torch', 'transformers', 'numpy', 'pydantic') "
            "if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert probe.stdout.strip() == "[]"


def test_replay_names_the_bad_line_before_touching_a_broker(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = SAMPLE.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["steps"][0]["action"]
    bad.write_text("\n".join([lines[0], json.dumps(broken)]) + "\n")
    out = monitor("replay", str(bad), "--bootstrap-servers", "127.0.0.1:1")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"monitor replay: {bad}: line 2: invalid trajectory record: field 'steps.0.action': "
        "required key is missing"
    )


def test_replay_without_a_broker_says_how_to_get_one() -> None:
    out = monitor("replay", str(SAMPLE))
    assert out.returncode == 2
    assert "VIGIL_KAFKA_BOOTSTRAP_SERVERS" in out.stderr and "monitor broker" in out.stderr
    out = monitor("replay", "/no/such.jsonl")
    assert out.returncode == 2 and "no such file" in out.stderr


@pytest.mark.broker
def test_replay_then_tail_shows_every_step(broker: EmbeddedBroker, unique: str) -> None:
    env = {
        "VIGIL_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "VIGIL_TOPIC_STEPS_DEPLOYMENT": f"{unique}.dep",
        "VIGIL_TOPIC_STEPS_ROLLOUT": f"{unique}.rl",
    }
    out = monitor("replay", str(SAMPLE), env=env)
    assert out.returncode == 0, out.stderr
    assert f"13 records -> {unique}.dep" in out.stdout
    assert f"3 records -> {unique}.rl" in out.stdout
    assert "replaying" in out.stderr  # progress

    tail = monitor("tail", f"{unique}.dep", "--max", "100", "--idle", "3", env=env)
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert len(lines) == 13
    events = [json.loads(line.split(" ", 2)[2]) for line in lines]
    by_traj: dict[str, list[int]] = {}
    for e in events:
        by_traj.setdefault(e["trajectory_id"], []).append(e["step"]["index"])
    assert all(idx == sorted(idx) for idx in by_traj.values()), "steps of a trajectory in order"
    assert sorted(by_traj) == [
        "dep-banking-001",
        "dep-banking-002",
        "dep-workspace-003",
        "dep-workspace-004",
        "gui-miniwob-005",
    ]


@pytest.mark.broker
def test_demo_screens_the_samples_and_pages_as_it_goes(
    tmp_path: Path, tiny_policy: Path, small_agentdojo: Path
) -> None:
    """`monitor demo` on a VIGIL_HOME that holds small prepared defaults (the tiny bundles
    and policy, and an AgentDojo build with its held-out slack split)."""
    import shutil

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "data").mkdir()
    shutil.copy(tiny_policy, home / "models" / "policy.json")
    (home / "data" / "agentdojo").symlink_to(small_agentdojo)
    out = monitor("demo", env={"VIGIL_HOME": str(home)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # the TITO trees, as before
    assert "exec-7f3a: 13 unique calls, 3 leaf trajectories, 18 node occurrences" in out.stdout
    assert "vigil.steps.rollout: 30 records" in out.stdout  # 3 replayed + 27 rebuilt
    assert "vigil.deadletter: 1 records" in out.stdout
    assert "not valid JSON" in out.stdout
    # held-out AgentDojo trajectories screened as they stream, pages as they happen
    assert "held-out AgentDojo trajectories" in out.stdout
    assert "PAGE " in out.stdout and "page.triggered" in out.stdout
    assert "rollout exec-7f3a:" in out.stdout and "vigil.verdicts.rollout: 3 records" in out.stdout
    summary = out.stdout.split("\nsummary:\n", 1)[1]
    screened = int(summary.split()[0])
    assert screened == 120 + 16 + 27  # AgentDojo test_slack, the samples, the rebuilt calls
    assert "pages for" in summary and "recall" in summary
    # canaries from the training split ran through every tier, counted apart from real steps
    assert "injecting canaries" in out.stdout
    assert "of canaries)" in out.stdout
    canary = next(x for x in summary.splitlines() if x.strip().startswith("canary "))
    assert "L1 " in canary and "L3 " in canary
    # the demo waited for the reviewer to finish the canaries too, not only the real steps
    stats = [x for x in out.stdout.splitlines() if "vigil stream: L0 scored" in x][-1]
    real_l2 = int(re.search(r"L2 (\d+)", stats).group(1))  # type: ignore[union-attr]
    reviewed = int(re.search(r"reviewed (\d+)", stats).group(1))  # type: ignore[union-attr]
    harmful_canaries_l2 = int(re.search(r"L2 (\d+)/", canary).group(1))  # type: ignore[union-attr]
    assert reviewed >= real_l2 + harmful_canaries_l2 > real_l2
    # at the end it says where to look, and the files are there
    look = out.stdout.split("\nwhere to look:\n", 1)[1]
    demo = home / "demo"
    for f in ("report/recall.png", "report/funnel.png", "report/report.json",
              "screened.jsonl", "labels.jsonl"):
        assert (demo / f).stat().st_size > 0 and str(demo / f) in look, f
    assert list((demo / "grafana").rglob("*.json")) and str(demo / "grafana") in look
    report = json.loads((demo / "report" / "report.json").read_text())
    assert report, "the report holds the recall figures"


@pytest.mark.broker
def test_broker_command_serves_until_sigterm(unique: str) -> None:
    import signal

    from streams.broker import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "monitor.cli", "broker", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(f"broker ready on 127.0.0.1:{port}")
        env = {"VIGIL_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
        out = monitor("replay", str(SAMPLE), "--topic", f"{unique}.t", env=env)
        assert out.returncode == 0 and "16 records" in out.stdout, out.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
