"""Paging-service bench on loopback: trigger throughput and latency (with dedup hits), and
page-to-notification latency (trigger sent -> signed webhook received).

The service runs as a user runs it (``python -m monitor.service.cli serve``, one uvicorn
process) against a fresh SQLite file and, when the local server answers, a fresh PostgreSQL
database; the load generator and the webhook receiver run in this process, on the same
machine (so they share its CPUs with the service).

    .venv/bin/python bench/paging_bench.py                       # both stores, defaults
    .venv/bin/python bench/paging_bench.py --triggers 10000 --concurrency 32 --stores sqlite

Writes ``bench/results/paging.json``.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monitor.service.auth import provision_store  # noqa: E402

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {"p50_ms": round(percentile(ms, 50), 2), "p90_ms": round(percentile(ms, 90), 2),
            "p99_ms": round(percentile(ms, 99), 2), "max_ms": round(max(ms), 2),
            "mean_ms": round(statistics.fmean(ms), 2)}


def event(tid: str, step: int, steps: int, routing_key: str | None = None) -> dict[str, Any]:
    trajectory = {
        "trajectory_id": tid, "source": "deployment", "task": "bench task: tidy the repo",
        "steps": [{"step_id": f"s{i}", "index": i, "observation": {"text": f"obs {i} " * 8},
                   "action": {"text": f"act {i}", "tool": {"name": "bash",
                                                            "arguments": {"cmd": f"ls {i}"}}}}
                  for i in range(steps)]}
    body: dict[str, Any] = {
        "event_action": "trigger", "dedup_key": f"{tid}/s{step}",
        "payload": {"summary": f"{tid} s{step} flagged", "source": "deployment",
                    "severity": random.choice(["critical", "error", "warning"]),
                    "custom_details": {
                        "trajectory": trajectory, "step_id": f"s{step}",
                        "scores": [{"tier": t, "score": 0.9, "flagged": True} for t in range(3)],
                        "rubric": {"verdict": "harmful", "score": 0.9}}}}
    if routing_key:
        body["routing_key"] = routing_key
    return body


class Receiver:
    """The webhook endpoint: arrival time (monotonic) per trajectory id."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                now = time.monotonic()
                tid = json.loads(body)["page"]["trajectory_id"]
                with receiver.cond:
                    receiver.arrivals.setdefault(tid, now)
                    receiver.cond.notify_all()
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, tid: str, timeout: float = 30) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: tid in self.arrivals, timeout):
                raise TimeoutError(f"no webhook for {tid} within {timeout}s")
            return self.arrivals[tid]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(url: str, port: int, poll_s: float) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    env.update({"VIGIL_PAGING_POLL_INTERVAL_S": str(poll_s),
                "VIGIL_PAGING_SECRET_KEY": "bench-secret-key"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor.service.cli", "serve", "--port", str(port),
         "--database-url", url, "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the paging service did not start")


def bench_store(store: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    issued = provision_store(url, {"bench-producer": "producer", "bench-admin": "admin"})
    producer, admin = issued["bench-producer"], issued["bench-admin"]
    port = free_port()
    proc = start_service(url, port, args.poll_interval)
    base = f"http://127.0.0.1:{port}"
    receiver = Receiver()
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}) as c:
            c.post("/api/v1/channels", json={"name": "bench-hook", "kind": "webhook",
                                             "url": receiver.url,
                                             "secret": "bench-webhook-secret"}).raise_for_status()
            c.post("/api/v1/policies", json={"name": "bench", "levels": [
                {"ack_timeout_s": 3600, "targets": ["bench-hook"]}]}).raise_for_status()

        # 1. throughput: each key is sent 1/(1-dup) times in shuffled order, from C clients
        unique = int(args.triggers * (1 - args.dup_ratio))
        keys = [(f"{store}-t{i // args.steps}", i % args.steps) for i in range(unique)]
        sends = (keys * (args.triggers // unique + 1))[: args.triggers]
        random.Random(7).shuffle(sends)
        bodies = [json.dumps(event(tid, step, args.steps)).encode() for tid, step in sends]
        latencies: list[float] = []
        lock = threading.Lock()
        local = threading.local()
        headers = {"Authorization": f"Bearer {producer}", "Content-Type": "application/json"}

        def send(body: bytes) -> None:
            if not hasattr(local, "client"):
                local.client = httpx.Client(base_url=base, headers=headers, timeout=60)
            t0 = time.perf_counter()
            r = local.client.post("/api/v1/events", content=body)
            dt = time.perf_counter() - t0
            if r.status_code != 202:
                raise RuntimeError(f"trigger refused: {r.status_code} {r.text}")
            with lock:
                latencies.append(dt)

        warm = 100  # warm-up on keys of their own: connections, caches, the first pages
        for i in range(warm):
            send(json.dumps(event(f"{store}-warm{i}", 0, args.steps)).encode())
        latencies.clear()
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(send, bodies))
        elapsed = time.perf_counter() - start
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}) as c:
            pages = c.get("/api/v1/pages", params={"status": "all", "limit": 1}).json()["count"]
        trajectories = len({tid for tid, _ in keys})
        assert pages == trajectories + warm, f"{pages} pages for {trajectories} trajectories"
        pages -= warm

        # 2. page-to-notification: one new page at a time, trigger sent -> webhook received
        notify: list[float] = []
        with httpx.Client(base_url=base, headers=headers) as client:
            for i in range(args.pages):
                tid = f"{store}-n{i}"
                body = json.dumps(event(tid, 0, args.steps, routing_key="bench")).encode()
                t0 = time.monotonic()
                client.post("/api/v1/events", content=body).raise_for_status()
                notify.append(receiver.wait(tid) - t0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        receiver.server.shutdown()
    return {
        "store": store,
        "trigger": {
            "requests": len(bodies), "unique_dedup_keys": unique,
            "dedup_hits": len(bodies) - unique,
            "pages_opened": pages, "body_bytes_mean": round(statistics.fmean(map(len, bodies))),
            "concurrency": args.concurrency, "seconds": round(elapsed, 3),
            "throughput_per_s": round(len(bodies) / elapsed, 1), **summary_ms(latencies)},
        "page_to_notification": {"pages": len(notify), **summary_ms(notify)},
    }


def postgres_database() -> tuple[str, str] | None:
    try:
        import psycopg

        name = f"vigil_bench_{os.getpid()}"
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name, f"postgresql://postgres@127.0.0.1:5432/{name}"
    except Exception as e:  # noqa: BLE001 - no local server: bench SQLite only, say so
        print(f"PostgreSQL not benched: {e}", file=sys.stderr)
        return None


def drop_postgres(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--triggers", type=int, default=3000, help="trigger requests per store")
    p.add_argument("--dup-ratio", type=float, default=0.5,
                   help="share of triggers that repeat a dedup key (redeliveries)")
    p.add_argument("--steps", type=int, default=4, help="flagged steps per trajectory")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent HTTP clients")
    p.add_argument("--pages", type=int, default=200, help="pages for the notification latency")
    p.add_argument("--poll-interval", type=float, default=1.0,
                   help="the service's timer poll (a new page wakes it at once regardless)")
    p.add_argument("--stores", default="sqlite,postgresql")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "paging.json"))
    args = p.parse_args()

    results = []
    stores = args.stores.split(",")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if "sqlite" in stores:
            print("benching sqlite ...", file=sys.stderr)
            results.append(bench_store("sqlite", f"sqlite:///{tmp}/bench.db", args))
        if "postgresql" in stores and (pg := postgres_database()):
            print("benching postgresql ...", file=sys.stderr)
            try:
                results.append(bench_store("postgresql", pg[1], args))
            finally:
                drop_postgres(pg[0])
    report = {
        "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""),
                               *[a.replace(str(ROOT) + "/", "") for a in sys.argv]]),
        "measured": (
            "trigger: POST /api/v1/events on loopback from `concurrency` keep-alive clients; "
            "each dedup key sent 1/(1-dup_ratio) times in shuffled order, several flagged "
            "steps per trajectory (grouped into one page); latency = HTTP round trip; the "
            "service is one uvicorn process (python -m monitor.service.cli serve). "
            "page_to_notification: one new page at a time, from sending the trigger to the "
            "signed webhook arriving at a receiver on loopback."),
        "settings": vars(args) | {"out": None},
        "results": results,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "python": platform.python_version(), "cpu_count": os.cpu_count(),
                    # other work on the machine shares the CPUs with the service and the client
                    "load_average_1m_before": round(load_before[0], 2),
                    "load_average_1m_after": round(os.getloadavg()[0], 2)},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["results"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
