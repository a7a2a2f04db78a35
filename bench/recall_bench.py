"""Recall you can see, measured: canary and label recall through a live stream, and the cost.

    python bench/recall_bench.py                       # default policy ($VIGIL_HOME)
    python bench/recall_bench.py --trajectories 120 --canary-rate 0.05

Two parts, written to ``bench/results/recall.json`` (command, data, figures, machine):

* **join**: the recall stage's label/score join and the worker's metric updates, in
  process, on synthetic records (records/s; microseconds a step).
* **stream**: the embedded Tansu broker, the worker's screen stage (L0 + L1 of the default
  policy) and its recall stage, with canaries from the *training* split injected at
  ``--canary-rate``, over held-out AgentDojo deployments (``test_attacks`` and
  ``test_slack``, evaluation only: nothing is fitted or tuned here). Debian's Prometheus
  scrapes the worker; the figures are read back through PromQL (``dashboards.promql``),
  and ``monitor report`` renders its PNGs from the same Prometheus into
  ``bench/results/recall_report/``. The stream stops at L1, so "reached L2" means
  "escalated to the reviewer" (the reviewer's own recall is in ``pipeline.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine, write_report  # noqa: E402
from streams.broker import free_port  # noqa: E402


def bench_join(n_steps: int) -> dict[str, Any]:
    """LabelJoin + WorkerMetrics on ``n_steps`` synthetic steps (3 scores and a label each)."""
    from prometheus_client import CollectorRegistry

    from dashboards.ground_truth import LabelJoin
    from dashboards.metrics import WorkerMetrics
    from streams.records import LabelRecord, Score

    rng = random.Random(0)
    records: list[Any] = []
    for i in range(n_steps):
        tid, sid = f"t{i // 5}", f"s{i % 5}"
        reached = rng.choice((0, 0, 0, 1, 1, 2, 3))
        for t in range(min(reached, 2) + 1):
            records.append(Score(trajectory_id=tid, step_id=sid, tier=t, score=0.5,
                                 flagged=reached > t))
        records.append(LabelRecord(trajectory_id=tid, step_id=sid, label=rng.choice((0, 1)),
                                   origin="dataset", category="financial"))
    metrics = WorkerMetrics(CollectorRegistry())
    join = LabelJoin(metrics)
    t0 = time.perf_counter()
    for r in records:
        if isinstance(r, Score):
            join.on_score(r)
        else:
            join.on_label(r)
    join_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_steps):  # what the screen stage adds per step
        metrics.steps.labels(stream="deployment", tier="0", canary="false").inc()
        metrics.tier_latency.labels(tier="0").observe(0.004)
        metrics.step_latency.labels(stage="screen").observe(0.2)
    metric_s = time.perf_counter() - t0
    return {"records": len(records), "join_records_per_s": round(len(records) / join_s),
            "metrics_us_per_step": round(1e6 * metric_s / n_steps, 2)}


def _held_out(path: Path, n: int, seed: int) -> list[Any]:
    from streams.records import Trajectory, read_jsonl

    got = [t.model_copy(update={"source": "deployment"})
           for t in read_jsonl(path / "trajectories.jsonl", Trajectory)
           if t.meta.get("split") in ("test_attacks", "test_slack")]
    random.Random(seed).shuffle(got)
    return got[:n]


def bench_stream(args: argparse.Namespace) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, start_http_server

    import vigil.paths
    from dashboards import promql
    from dashboards.ground_truth import reached_counts
    from dashboards.metrics import WorkerMetrics
    from dashboards.prometheus import LocalPrometheus
    from dashboards.report import recall_from_prometheus, recall_over_time, render_report
    from monitor.defaults import ensure_default_canaries
    from monitor.pipeline import load_screener
    from monitor.stream.build import build_worker
    from monitor.stream.runner import WorkerConfig
    from streams.broker import EmbeddedBroker
    from streams.config import KafkaSettings, Topics
    from streams.kafka import KafkaBus
    from streams.processor import publish_record
    from streams.records import step_events
    from vigil.metrics import wilson_interval

    data = vigil.paths.dataset("agentdojo")
    trajectories = _held_out(data, args.trajectories, args.seed)
    canary_path = ensure_default_canaries(log=print)
    screener = load_screener(args.policy, reviewer=False)
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    port = free_port()
    start_http_server(port, addr="127.0.0.1", registry=registry)
    topics = Topics(**{k: f"{v}.bench" for k, v in Topics().model_dump().items()})
    with EmbeddedBroker() as broker, LocalPrometheus([f"127.0.0.1:{port}"],
                                                     scrape_interval_s=1.0) as prom:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers,
                                 client_id="vigil-bench")
        bus = KafkaBus(settings)
        bus.ensure_topics(topics.all())
        stop = threading.Event()
        worker = build_worker(WorkerConfig(topics=topics, roles=("screen", "probe", "recall"),
                                           group="bench", batch_size=64, stats_every_s=1e9),
                              lambda: KafkaBus(settings), screener=screener, stop=stop,
                              report=lambda _m: None, metrics=metrics,
                              canary_rate=args.canary_rate, canaries=canary_path)
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        prom.wait_for('vigil_steps_total{tier="0"}', timeout_s=60)
        time.sleep(2)  # the zero series scraped before the first step
        sent = 0
        t_start = time.time()
        for t in trajectories:
            for e in step_events(t):
                publish_record(bus, topics.steps_deployment, e, key=e.trajectory_id)
                sent += 1
        bus.flush()
        deadline = time.monotonic() + args.timeout
        while worker.stats.steps < sent and time.monotonic() < deadline:
            time.sleep(0.5)
        t_real = time.time() - t_start
        time.sleep(5)  # the last canaries, the recall stage, two more scrapes
        stop.set()
        runner.join(60)
        time.sleep(2)
        window = f"{int(time.time() - t_start) + 30}s"
        c = prom.client
        from_prom = {
            origin: [c.value(promql.reached_share(k, window, origin=origin)) for k in (1, 2)]
            for origin in ("canary", "dataset")}
        fpr = [c.value(promql.reached_share(k, window, label="0", origin="dataset"))
               for k in (1, 2)]
        table = recall_from_prometheus(c, window=window)
        series = recall_over_time(c, t_start, time.time(), 5.0, window="60s")
        out_dir = Path(args.report_dir)
        paths = render_report(table, out_dir, series)
        bus.close()
    counts = reached_counts(metrics)
    benign = reached_counts(metrics, label=0)

    def rows(row: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"screened": row[0]}
        for k in (1, 2):
            ci = wilson_interval(row[k], row[0])
            out[f"reached_L{k}"] = row[k]
            out[f"recall_L{k}"] = round(row[k] / row[0], 4) if row[0] else None
            out[f"wilson95_L{k}"] = [round(x, 4) for x in ci] if ci else None
        return out

    return {
        "steps_sent": sent,
        "steps_screened": worker.stats.steps,
        "canary_steps_screened": worker.stats.canaries,
        "seconds": round(t_real, 1),
        "steps_per_s_with_canaries_and_metrics": round(
            (worker.stats.steps + worker.stats.canaries) / t_real, 1),
        "recall_harmful": {o: rows(r) for o, r in sorted(counts.items())},
        "benign_reaching": {o: rows(r) for o, r in sorted(benign.items())},
        "promql_recall_L1_L2": from_prom,
        "promql_benign_rate_L1_L2": fpr,
        "report_files": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
                         for p in paths],
        "model_seconds": {k: round(v, 1) for k, v in screener.timings.items()},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trajectories", type=int, default=80, help="held-out trajectories")
    p.add_argument("--canary-rate", type=float, default=0.05)
    p.add_argument("--policy", default=None, help="default: $VIGIL_HOME/models/policy.json")
    p.add_argument("--join-steps", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "recall.json"))
    p.add_argument("--report-dir", default=str(ROOT / "bench" / "results" / "recall_report"))
    args = p.parse_args()
    load_before = os.getloadavg()
    results = {"join": bench_join(args.join_steps), "stream": bench_stream(args)}
    report = {
        "command": "python bench/recall_bench.py " + " ".join(sys.argv[1:]),
        "measured": "recall per tier from canaries (training split) and dataset labels "
                    "(held-out test_attacks + test_slack) through a live stream (L0+L1 of the "
                    "default policy, Tansu, Prometheus), and the cost of the join and metrics",
        "data": {"held_out_splits": ["test_attacks", "test_slack"],
                 "canaries_from": "train split of $VIGIL_HOME/data/agentdojo"},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "report_dir")},
        "results": results,
        "machine": machine(load_before),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_report(args.out, report)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
