"""RL-health bench: throughput of the RL-health stream on TITO records (calls/s).

    python bench/rlhealth_bench.py [--steps 40 --queries 8 --group-size 8]

Two measurements on one synthetic RL run (``monitor.rlhealth.simulate``):

- ``in_process``: TITO JSON bytes → decode → tree assembly → signals, versions,
  alerts and Prometheus metrics (``RLHealthMonitor``): the CPU cost of the
  stream without a broker;
- ``kafka``: the same records published to the embedded Tansu broker, then
  consumed by ``rlhealth_processor`` (decode, assembly, signals, one L0 score
  per execution published, commits after acks), timed from the first poll to
  the last execution observed.

Writes bench/results/rlhealth.json (command, data, figures, machine).

    python bench/rlhealth_bench.py --art [--seeds 5 --clean-seeds 2 --clean-iterations 200]

ART (image / video generation, ``monitor.rlhealth.art_simulate``): for each injected failure
(mask share climbing, endpoint collapse, a gamed reward model) on ``--seeds`` runs, the
detection delay (iterations from onset to the first alert that finds it) and the false
alarms; on ``--clean-seeds`` clean runs of ``--clean-iterations``, every alert is a false
alarm. Diversity is measured with the shipped world model's vision tower, as
``monitor rlhealth`` does by default. Writes bench/results/rlhealth_art.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from bench.machine import machine, write_report  # noqa: E402
from monitor.rlhealth.alerts import AlertConfig  # noqa: E402
from monitor.rlhealth.metrics import RLHealthMetrics  # noqa: E402
from monitor.rlhealth.simulate import simulate_rl_run  # noqa: E402
from monitor.rlhealth.stream import (  # noqa: E402
    RLHealthConfig,
    RLHealthMonitor,
    monitor_records,
    rlhealth_processor,
)
from streams.broker import EmbeddedBroker  # noqa: E402
from streams.config import KafkaSettings, Topics  # noqa: E402
from streams.kafka import KafkaBus  # noqa: E402
from streams.processor import publish_record  # noqa: E402
from streams.records import ExecutionEnd, TitoCall, decode, encode  # noqa: E402
from streams.replay import sniff_kind  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def in_process(payloads: list[bytes], config: RLHealthConfig, repeats: int) -> dict[str, float]:
    import json as _json

    best = float("inf")
    report: dict[str, object] = {}
    for _ in range(repeats):
        monitor = RLHealthMonitor(config, RLHealthMetrics(CollectorRegistry()))
        t0 = time.perf_counter()
        records = (decode(p, sniff_kind(_json.loads(p))) for p in payloads)
        monitor_records(records, monitor)
        best = min(best, time.perf_counter() - t0)
        report = monitor.report()
    calls = sum(1 for p in payloads if b'"call_id"' in p)
    return {
        "seconds": round(best, 3),
        "calls_per_s": round(calls / best, 1),
        "records_per_s": round(len(payloads) / best, 1),
        "executions": report["executions"],  # type: ignore[dict-item]
        "alerts": len(report["alerts"]),  # type: ignore[arg-type]
    }


def through_kafka(
    records: list[TitoCall | ExecutionEnd],
    config: RLHealthConfig,
    executions: int,
    grace_s: float,
) -> dict[str, float]:
    with EmbeddedBroker() as broker:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="bench")
        topics = Topics(**{n: f"bench.{n}" for n in Topics.model_fields})
        bus = KafkaBus(settings)
        bus.ensure_topics(topics.all())
        t0 = time.perf_counter()
        for r in records:
            dest = topics.tito_calls if isinstance(r, TitoCall) else topics.tito_executions
            publish_record(bus, dest, r, key=r.execution_id)
        bus.flush()
        publish_s = time.perf_counter() - t0
        monitor = RLHealthMonitor(config, RLHealthMetrics(CollectorRegistry()))
        proc, _ = rlhealth_processor(bus, topics, monitor, "bench-rl", grace_s=grace_s)
        stop = threading.Event()
        first: list[float] = []
        last: list[float] = []
        inner = monitor.observe

        def observe(tree, now=None):  # type: ignore[no-untyped-def]
            if not first:
                first.append(time.perf_counter())
            out = inner(tree, now)
            last[:] = [time.perf_counter()]
            if monitor.executions >= executions and proc.stats.consumed >= len(records):
                stop.set()
            return out

        monitor.observe = observe  # type: ignore[method-assign]
        polled: list[float] = []
        consumed_all: list[float] = []

        def on_batch(stats) -> None:  # type: ignore[no-untyped-def]
            now = time.perf_counter()
            if not polled:
                polled.append(now)
            if stats.consumed >= len(records) and not consumed_all:
                consumed_all.append(now)

        proc.on_batch = on_batch
        t1 = time.perf_counter()
        stats = proc.run(stop=stop, idle_timeout_s=20)
        wall = time.perf_counter() - t1
        start = polled[0] if polled else t1
        busy = (last[0] if last else time.perf_counter()) - start
        bus.close()
    calls = sum(isinstance(r, TitoCall) for r in records)
    consume_all = (consumed_all[0] if consumed_all else time.perf_counter()) - start
    return {
        "publish_seconds": round(publish_s, 3),
        "consume_all_records_seconds": round(consume_all, 3),
        "last_execution_observed_seconds": round(busy, 3),
        "calls_per_s": round(calls / max(busy - grace_s, consume_all), 1),
        "calls_per_s_including_grace": round(calls / busy, 1),
        "records_per_s": round(len(records) / max(busy - grace_s, consume_all), 1),
        "consumed": stats.consumed,
        "scores_published": stats.produced,
        "dead_lettered": stats.dead_lettered,
        "wall_seconds_incl_group_join": round(wall, 3),
        "grace_s": grace_s,
        "executions_observed": monitor.executions,
    }


def art_detection(args: argparse.Namespace) -> dict[str, object]:
    """Detection delay and false alarms per injected failure kind, and on clean runs."""
    import logging

    from monitor.rlhealth.art import ArtMonitor, vision_embedder
    from monitor.rlhealth.art_simulate import (
        FAILURE_KINDS,
        ArtFailure,
        score_alerts,
        simulate_art_run,
    )
    from monitor.shipped import shipped_dir

    logging.getLogger("monitor.rlhealth.alerts").setLevel(logging.ERROR)
    embed = vision_embedder(shipped_dir() / "worldmodel")
    timing = {"endpoints": 0, "seconds": 0.0}

    def one(failures: tuple[ArtFailure, ...], iterations: int, seed: int) -> dict[str, object]:
        run = simulate_art_run(iterations=iterations, prompts=args.prompts, k=args.k,
                               failures=failures, seed=seed)  # fmt: skip
        monitor = ArtMonitor(embed=embed)
        t0 = time.perf_counter()
        for r in run.records:
            monitor.observe(r)
        monitor.finish()
        timing["seconds"] += time.perf_counter() - t0
        timing["endpoints"] += iterations * args.prompts * args.k
        got = score_alerts(run, monitor.alerts)
        print(seed, [f.kind for f in failures], got, flush=True)
        return got

    per_kind: dict[str, object] = {}
    for kind in FAILURE_KINDS:
        runs = [one((ArtFailure(kind, args.onset),), args.onset + 12, seed)
                for seed in range(args.seeds)]  # fmt: skip
        delays = [r["delays"][kind] for r in runs]  # type: ignore[index]
        found = [d for d in delays if d is not None]
        per_kind[kind] = {
            "runs": len(runs),
            "detected": len(found),
            "delays": delays,
            "max_delay": max(found) if found else None,
            "mean_delay": round(sum(found) / len(found), 2) if found else None,
            "false_alarms": sum(int(r["false_alarms"]) for r in runs),  # type: ignore[call-overload]
        }
    clean = [one((), args.clean_iterations, 100 + seed) for seed in range(args.clean_seeds)]
    return {
        "per_failure": per_kind,
        "clean": {
            "runs": len(clean),
            "iterations": args.clean_iterations,
            "false_alarms": sum(int(r["false_alarms"]) for r in clean),  # type: ignore[call-overload]
            "false_alarm_kinds": sorted({k for r in clean for k in r["false_alarm_kinds"]}),  # type: ignore[attr-defined]
        },
        "monitor_endpoints_per_s": round(timing["endpoints"] / timing["seconds"], 1),
    }


def art_main(args: argparse.Namespace) -> int:
    load_before = os.getloadavg()
    results = art_detection(args)
    report = {
        "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""),
                               *[a.replace(str(ROOT) + "/", "") for a in sys.argv]]),
        "measured": (
            "ART health alerts on simulated runs (monitor.rlhealth.art_simulate: 32x32 PNG "
            "pattern endpoints, three reward models, the trainer's masked updates computed "
            "with the seed's KL proxy and mask): per injected failure, the delay from its "
            "onset to the first alert that finds it (mask: art_mask or art_drift; collapse: "
            "art_collapse on a collapsing prompt; gamed_head: art_reward_divergence on that "
            "head) and false alarms (any other alert, or one before the onset); on clean "
            "runs every alert is false. Endpoint diversity from the shipped world model's "
            "vision tower (vigil/shipped/worldmodel). monitor_endpoints_per_s: the ArtMonitor "
            "(embedding included) over every run, simulation excluded."
        ),
        "data": {"generator": "monitor.rlhealth.art_simulate.simulate_art_run",
                 "prompts": args.prompts, "k": args.k, "onset": args.onset},  # fmt: skip
        "settings": vars(args) | {"out": None},
        "results": results,
        "machine": machine(load_before),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_report(args.out or str(RESULTS / "rlhealth_art.json"), report)
    print(json.dumps(results, indent=2))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-kafka", action="store_true")
    p.add_argument("--grace", type=float, default=3.0, help="stream grace for late calls (s)")
    p.add_argument("--out", default=None, help="default bench/results/rlhealth[_art].json")
    a = p.add_argument_group("--art: image-generation (ART) alerts on simulated runs")
    a.add_argument("--art", action="store_true", help="measure the ART alerts instead")
    a.add_argument("--seeds", type=int, default=5, help="runs per failure kind")
    a.add_argument("--onset", type=int, default=20, help="iteration a failure starts")
    a.add_argument("--clean-seeds", type=int, default=2)
    a.add_argument("--clean-iterations", type=int, default=200)
    a.add_argument("--prompts", type=int, default=8)
    a.add_argument("--k", type=int, default=8, help="endpoints per prompt")
    args = p.parse_args()
    if args.art:
        return art_main(args)
    load_before = os.getloadavg()
    run = simulate_rl_run(
        steps=args.steps, queries=args.queries, group_size=args.group_size,
        collapse_at=args.steps - 4, phi=1, mu=2, seed=0,
    )  # fmt: skip
    payloads = [encode(r) for r in run.records]
    config = RLHealthConfig(alerts=AlertConfig(phi=1, mu=2))
    results: dict[str, object] = {"in_process": in_process(payloads, config, args.repeats)}
    print(json.dumps(results, indent=2), flush=True)
    if not args.no_kafka:
        stream_cfg = RLHealthConfig(
            alerts=AlertConfig(phi=1, mu=2), close_lag=None, close_after_s=5
        )
        results["kafka"] = through_kafka(run.records, stream_cfg, run.executions, args.grace)
    report = {
        "command": shlex.join(
            [
                sys.executable.replace(str(ROOT) + "/", ""),
                *[a.replace(str(ROOT) + "/", "") for a in sys.argv],
            ]
        ),
        "measured": (
            "calls/s of the RL-health stream on TITO records. in_process: JSON bytes -> decode "
            "-> TreeAssembler -> build_tree -> per-execution signals, versions, alerts, "
            "Prometheus metrics (best of repeats). kafka: records pre-published to the embedded "
            "Tansu broker (3 partitions), consumed by rlhealth_processor (decode, "
            "assembly, signals, one L0 score published per execution, commit after ack); timed "
            "from the first polled batch to the last execution observed, so it includes one "
            "grace window (an execution is emitted grace_s after its end record): calls_per_s "
            "divides by max(that - grace_s, time to consume every record); "
            "calls_per_s_including_grace does not subtract it."
        ),
        "data": {
            "generator": "monitor.rlhealth.simulate.simulate_rl_run",
            "steps": run.steps,
            "batch": run.batch,
            "phi": run.phi,
            "mu": run.mu,
            "executions": run.executions,
            "calls": run.calls,
            "records": len(run.records),
            "bytes": sum(len(p) for p in payloads),
            "mean_call_bytes": round(
                sum(len(p) for p in payloads if b'"call_id"' in p) / run.calls, 1
            ),
        },  # fmt: skip
        "settings": vars(args) | {"out": None},
        "results": results,
        "machine": machine(load_before),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_report(args.out or str(RESULTS / "rlhealth.json"), report)
    print(json.dumps(report["results"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
