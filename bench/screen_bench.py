"""Batch screening speed and memory: ``monitor screen`` on real files (issue 18).

    python bench/screen_bench.py [--review-steps 300] [--big-mb 0]

Writes bench/results/screen.json. Each case runs ``monitor screen FILE --out OUT`` as a
user would (a subprocess, the default policy: ``$VIGIL_HOME``'s, else the shipped one) and
reports steps per second after the models loaded (the time to the first output line is
reported apart), and the peak resident memory of the process and its workers (VmRSS summed,
sampled every 0.25 s); ``--cases`` reruns some cases and keeps the others' figures:

* ``test_slack``: the held-out AgentDojo ``test_slack`` trajectories (from
  ``$VIGIL_HOME/data/agentdojo``), through L1 (``--no-review``) and, on the first
  ``--review-steps`` steps' trajectories, through L2 (the local judge); through L1 also
  with ``--workers 2``;
* ``toolemu``: ``../shared/data/toolemu/train.jsonl``, through L1 and through L2;
* ``openagentsafety_L2``: long-step traffic (OpenHands runs, median step 1.8 kB of JSON),
  the ``val`` trajectories of ``$VIGIL_HOME/data/openagentsafety``, through L2 (issue 32's
  target: 20 steps a second);
* ``big`` (``--big-mb N``): the slack file repeated with fresh ids up to N MB, through L1
  (memory must not grow with the file).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine, tree_rss_mb, write_report  # noqa: E402


def _write_slack(out: Path, max_steps: int | None = None, corpus: str = "agentdojo",
                 split: str = "test_slack") -> int:
    import vigil.paths

    src = vigil.paths.dataset(corpus) / "trajectories.jsonl"
    steps = 0
    with src.open() as f, out.open("w") as w:
        for line in f:
            obj = json.loads(line)
            if obj.get("meta", {}).get("split") != split:
                continue
            if max_steps is not None and steps >= max_steps:
                break
            w.write(line if line.endswith("\n") else line + "\n")
            steps += len(obj["steps"])
    return steps


def _grow(src: Path, out: Path, mb: float) -> int:
    """``src`` repeated with fresh trajectory ids until ``out`` reaches ``mb`` megabytes."""
    lines = src.read_text().splitlines()
    size, loop, steps = 0, 0, 0
    with out.open("w") as w:
        while size < mb * 1e6:
            for line in lines:
                obj = json.loads(line)
                obj["trajectory_id"] = f"{obj['trajectory_id']}#{loop}"
                s = json.dumps(obj) + "\n"
                w.write(s)
                size += len(s)
                steps += len(obj["steps"])
            loop += 1
    return steps


def _run(name: str, path: Path, steps: int, *extra: str, work: Path) -> dict[str, Any]:
    out = work / f"{name}.screened.jsonl"  # never next to the input (it may be shared data)
    cmd = [sys.executable, "-m", "monitor.cli", "screen", str(path), "--out", str(out), *extra]
    t0 = time.perf_counter()
    log = work / f"{name}.log"
    with log.open("w") as errf:
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=errf)
        first, peak_mb = None, 0.0
        while proc.poll() is None:
            if first is None and out.exists() and out.stat().st_size > 0:
                first = time.perf_counter() - t0  # the first output line: models loaded
            peak_mb = max(peak_mb, tree_rss_mb(proc.pid) or 0.0)
            time.sleep(0.25)
    took = time.perf_counter() - t0
    err = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: monitor screen failed:\n{err[-3000:]}")
    first = first if first is not None else took
    r = {"file": str(path), "file_mb": round(path.stat().st_size / 1e6, 1), "steps": steps,
         "args": list(extra), "seconds": round(took, 1),
         "seconds_to_first_line": round(first, 1),
         "steps_per_s_after_first_line": round(steps / max(took - first, 1e-9), 1),
         "steps_per_s_overall": round(steps / took, 1),
         "peak_rss_mb": round(peak_mb, 0),
         "summary": next((x for x in err.splitlines() if x.startswith("screened ")), None)}
    print(name, json.dumps(r), flush=True)
    out.unlink(missing_ok=True)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--review-steps", type=int, default=300)
    p.add_argument("--big-mb", type=float, default=0.0)
    p.add_argument("--work", default="/tmp/vigil-screen-bench")
    p.add_argument("--cases", nargs="+", metavar="CASE",
                   help="run only these cases (the others keep their earlier figures): "
                   "test_slack_L1 test_slack_L1_workers2 toolemu_L1 toolemu_L2 test_slack_L2 "
                   "openagentsafety_L2 big_L1")
    args = p.parse_args()
    want = set(args.cases or ["test_slack_L1", "test_slack_L1_workers2", "toolemu_L1",
                              "toolemu_L2", "test_slack_L2", "openagentsafety_L2", "big_L1"])
    load = os.getloadavg()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    slack = work / "test_slack.jsonl"
    n_slack = _write_slack(slack)
    reviewed = work / "test_slack_head.jsonl"
    n_reviewed = _write_slack(reviewed, args.review_steps)
    oas = work / "openagentsafety_val.jsonl"
    n_oas = _write_slack(oas, corpus="openagentsafety", split="val")
    toolemu = ROOT.parent / "shared" / "data" / "toolemu" / "train.jsonl"
    n_toolemu = sum(len(json.loads(x)["steps"]) for x in toolemu.open())
    result = ROOT / "bench" / "results" / "screen.json"
    cases: dict[str, Any] = json.loads(result.read_text())["cases"] if result.exists() else {}
    runs = {
        "test_slack_L1": (slack, n_slack, "--no-review"),
        "test_slack_L1_workers2": (slack, n_slack, "--no-review", "--workers", "2"),
        "toolemu_L1": (toolemu, n_toolemu, "--no-review"),
        "toolemu_L2": (toolemu, n_toolemu),
        "test_slack_L2": (reviewed, n_reviewed),
        "openagentsafety_L2": (oas, n_oas),
    }
    for name, (path, steps, *extra) in runs.items():
        if name in want:
            cases[name] = _run(name, path, steps, *extra, work=work)
    if args.big_mb and "big_L1" in want:
        big = work / "big.jsonl"
        n_big = _grow(slack, big, args.big_mb)
        cases["big_L1"] = _run("big_L1", big, n_big, "--no-review", work=work)
        big.unlink()
    report = {"bench": "screen", "command": shlex.join([sys.executable, *sys.argv]),
              "measured": __doc__, "cases": cases, "machine": machine(load)}
    write_report(result, report)


if __name__ == "__main__":
    main()
