"""The inline gate's added latency (issue 34): how long a proposed tool call waits for its
L0 + L1 decision, with the default policy (``$VIGIL_HOME``'s, else the shipped one).

    .venv/bin/python bench/gate_bench.py [--calls 400] [--concurrency 20]

Proposals are real steps: each step of ToolEmu's ``train`` trajectories (tools vigil never
trained a model on) as a call proposed after the steps before it. Paths:

* ``in_process``: :meth:`monitor.pipeline.Screener.check_action`, one caller (what the MCP
  proxy, the Agents SDK and LangChain gates and the Claude Code hook run per call);
* ``service``: ``POST /v1/screen`` on ``monitor serve --screen-policy`` (one uvicorn process,
  as a user runs it), ``--concurrency`` callers at once; the service batches what arrives
  together into one model call (:mod:`monitor.service.screen`).

Reports p50/p90/p99 per path and calls per second; the target is p99 <= 50 ms at 20
concurrent callers on a 2-core machine. The load generator shares the CPUs with the service.
Writes ``bench/results/gate.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine, write_report  # noqa: E402
from bench.paging_bench import summary_ms  # noqa: E402

TOOLEMU = ROOT.parent / "shared/data/toolemu/train.jsonl"


def proposals(path: Path, limit: int) -> list[tuple[Any, Any]]:
    """(trajectory so far, proposed action) for each step of the file's trajectories."""
    from streams.records import Trajectory

    out = []
    with path.open() as f:
        for line in f:
            t = Trajectory.model_validate_json(line)
            for i, step in enumerate(t.steps):
                out.append((t.model_copy(update={"steps": list(t.steps[:i])}), step.action))
                if len(out) >= limit:
                    return out
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def in_process(policy: Path, calls: list[tuple[Any, Any]]) -> dict[str, Any]:
    from monitor.pipeline import load_screener

    t0 = time.perf_counter()
    screener = load_screener(policy, reviewer=False, log=lambda _: None)
    screener.check_action(*calls[0])  # warm-up
    load_s = time.perf_counter() - t0
    lat, decisions = [], []
    start = time.perf_counter()
    for trajectory, action in calls:
        t = time.perf_counter()
        decisions.append(screener.check_action(trajectory, action).decision)
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    return {"callers": 1, "calls": len(calls), "calls_per_s": round(len(calls) / wall, 1),
            "load_s": round(load_s, 1), **summary_ms(lat),
            "decisions": {d: decisions.count(d) for d in sorted(set(decisions))}}


def service(policy: Path, calls: list[tuple[Any, Any]], concurrency: int) -> dict[str, Any]:
    import httpx

    from monitor.service.auth import provision_store

    folder = Path(tempfile.mkdtemp(prefix="vigil-gate-"))
    url = f"sqlite:///{folder}/paging.db"
    token = provision_store(url, {"bench": "producer"})["bench"]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_PAGING")}
    env["VIGIL_PAGING_SECRET_KEY"] = "bench-secret-key"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor.service.cli", "serve", "--port", str(port),
         "--database-url", url, "--screen-policy", str(policy), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}"}
    bodies = [{"trajectory": t.model_dump(mode="json", exclude_none=True),
               "action": a.model_dump(mode="json", exclude_none=True)} for t, a in calls]
    try:
        with httpx.Client(timeout=120) as c:
            while True:  # the screener loads before the service answers
                if proc.poll() is not None:
                    raise RuntimeError("the service exited before it served")
                try:
                    if c.post(f"{base}/v1/screen", json=bodies[0],
                              headers=headers).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        load_s = time.perf_counter() - t0
        lat: list[float] = []
        decisions: list[str] = []

        def call(body: dict[str, Any]) -> None:
            t = time.perf_counter()
            r = client.post(f"{base}/v1/screen", json=body, headers=headers)
            lat.append(time.perf_counter() - t)
            r.raise_for_status()
            decisions.append(r.json()["decision"])

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        with httpx.Client(timeout=120, limits=limits) as client, \
                ThreadPoolExecutor(concurrency) as pool:
            start = time.perf_counter()
            list(pool.map(call, bodies))
            wall = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"callers": concurrency, "calls": len(calls),
            "calls_per_s": round(len(calls) / wall, 1), "load_s": round(load_s, 1),
            **summary_ms(lat),
            "decisions": {d: decisions.count(d) for d in sorted(set(decisions))}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", help="default: the policy monitor screen picks")
    ap.add_argument("--data", default=str(TOOLEMU))
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--paths", nargs="+", default=["in_process", "service"])
    ap.add_argument("--out", default=str(ROOT / "bench/results/gate.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    from monitor.defaults import ensure_policy

    policy = ensure_policy(args.policy)
    calls = proposals(Path(args.data), args.calls)
    results: dict[str, Any] = {}
    if "in_process" in args.paths:
        results["in_process"] = in_process(policy, calls)
        print("in_process", json.dumps(results["in_process"]), flush=True)
    if "service" in args.paths:
        results["service"] = service(policy, calls, args.concurrency)
        print("service", json.dumps(results["service"]), flush=True)
    write_report(args.out, {
        "command": shlex.join([sys.executable, *sys.argv]),
        "data": f"{args.data} (first {len(calls)} steps as proposals)",
        "policy": str(policy),
        "target": "p99 <= 50 ms at 20 concurrent callers (issue 34)",
        "results": results,
        "machine": machine(load0),
    })


if __name__ == "__main__":
    main()
