"""The stream part of ``bench/pipeline_bench.py``: offered load through the real broker.

A producer publishes deployment step events (held-out ``test_slack`` AgentDojo steps, in
trajectory order) at a fixed rate to the embedded Tansu broker; the worker's two screening
stages, each in a thread with its own bus and consumer group as ``monitor stream`` runs them
(L0: ``monitor.stream.screen.ScreenStage``; L1: ``monitor.stream.probe.ProbeStage``, on
``vigil.steps.l0``), score them; a reader on the scores topic measures produce → tier-0 and
produce → tier-1 score latency. Model compute is each stage's own per-tier timing; the
handlers' other work is overhead (the processor loop and the broker are not in it).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def _events(datasets: list[str], n: int) -> list[Any]:
    from streams.records import Trajectory, decode, step_events

    out: list[Any] = []
    loop = 0
    while len(out) < n:
        for d in datasets:
            with (Path(d) / "trajectories.jsonl").open() as f:
                for line in f:
                    obj = json.loads(line)
                    if obj.get("meta", {}).get("split") != "test_slack":
                        continue
                    t = decode(line, Trajectory)
                    tid = f"{t.trajectory_id}#{loop}"
                    t = t.model_copy(update={"trajectory_id": tid, "source": "deployment"})
                    out.extend(step_events(t))
                    if len(out) >= n:
                        return out
        loop += 1
    return out


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None, "max": None}
    a = np.array(xs) * 1000
    return {"p50": round(float(np.percentile(a, 50)), 1),
            "p99": round(float(np.percentile(a, 99)), 1), "max": round(float(a.max()), 1)}


def run_rate(screener: Any, bootstrap: str, datasets: list[str], rate: float, seconds: float,
             tag: str) -> dict[str, Any]:
    from dataclasses import replace

    from monitor.stream.probe import ProbeStage
    from monitor.stream.screen import ScreenStage
    from streams.config import KafkaSettings, Topics
    from streams.kafka import KafkaBus
    from streams.processor import publish_record
    from streams.records import Score, decode

    settings = KafkaSettings(bootstrap_servers=bootstrap, client_id="vigil-bench")
    topics = Topics(**{k: f"{v}.{tag}" for k, v in Topics().model_dump().items()})
    admin = KafkaBus(settings)
    admin.ensure_topics(topics.all())
    events = _events(datasets, int(rate * seconds))
    n = len(events)  # whole trajectories: a few more than rate * seconds
    stop = threading.Event()
    # the two stages of a worker: each its own consumer group, thread and bus
    l0 = replace(screener, timings={})
    l1 = replace(screener, timings={})
    stages: dict[str, Any] = {"screen": ScreenStage(l0, topics, report=lambda _m: None),
              "probe": ProbeStage(l1, topics, report=lambda _m: None)}
    handler_s = {name: 0.0 for name in stages}
    threads = []
    for name, stage in stages.items():
        orig = stage.handle_batch

        def timed(items: Any, _orig: Any = orig, _name: str = name) -> Any:
            t0 = time.perf_counter()
            try:
                return _orig(items)
            finally:
                handler_s[_name] += time.perf_counter() - t0

        stage.handle_batch = timed
        proc = stage.processor(KafkaBus(settings), f"bench-{tag}-{name}", batch_size=64)
        threads.append(threading.Thread(target=lambda p=proc: p.run(stop=stop), daemon=True))
    for t in threads:
        t.start()
    sent: dict[tuple[str, str], float] = {}
    lat: dict[int, list[float]] = {0: [], 1: []}
    reader = KafkaBus(settings).consumer([topics.scores], f"bench-reader-{tag}")
    while not reader.assigned:
        reader.poll(0.2)
    time.sleep(6.0)  # the stages join their groups (Tansu: ~3 s)
    prod = KafkaBus(settings)

    def produce() -> None:
        t0 = time.perf_counter()
        for i, e in enumerate(events):
            due = t0 + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            sent[(e.trajectory_id, e.step.step_id)] = time.time()
            publish_record(prod, topics.steps_deployment, e, key=e.trajectory_id)
            if i % 50 == 0:
                prod.flush()
        prod.flush()

    t_start = time.time()
    pt = threading.Thread(target=produce, daemon=True)
    pt.start()
    got: dict[int, set[tuple[str, str]]] = {0: set(), 1: set()}
    flagged: set[tuple[str, str]] = set()
    last = {0: t_start, 1: t_start}
    deadline = time.time() + seconds + 180
    while (len(got[0]) < n or not flagged <= got[1]) and time.time() < deadline:
        for m in reader.poll(0.2):
            s = decode(m.value, Score)
            k = (s.trajectory_id, s.step_id)
            if s.tier not in got or k in got[s.tier] or k not in sent:
                continue
            got[s.tier].add(k)
            if s.tier == 0 and s.flagged:
                flagged.add(k)
            now = time.time()
            lat[s.tier].append(now - sent[k])
            last[s.tier] = now
    stop.set()
    for t in threads:
        t.join(30)
    reader.close()
    prod.close()
    admin.close()
    model = {"L0": l0.timings.get("L0", 0.0), "L1": l1.timings.get("L1", 0.0)}
    model_s = sum(model.values())
    handled = sum(handler_s.values())
    return {
        "offered_steps_per_s": rate,
        "steps_offered": n,
        "steps_scored_tier0": len(got[0]),
        "steps_passed_to_L1": len(flagged),
        "steps_scored_tier1": len(got[1]),
        "throughput_steps_per_s": {
            "screen_L0": round(len(got[0]) / max(last[0] - t_start, 1e-9), 1),
            "probe_L1_scored": round(len(got[1]) / max(last[1] - t_start, 1e-9), 1)},
        "latency_ms_tier0": _pct(lat[0]),
        "latency_ms_tier1": _pct(lat[1]),
        "model_seconds": {k: round(v, 2) for k, v in model.items()},
        "handler_seconds": {k: round(v, 2) for k, v in handler_s.items()},
        "handler_overhead_share_of_model": round((handled - model_s) / model_s, 3)
        if model_s else None,
        "wall_seconds": round(max(last.values()) - t_start, 1),
    }


def run_stream_bench(policy: str | None, datasets: list[str], rates: list[float],
                     seconds: float) -> dict[str, Any]:
    from monitor.pipeline import load_screener
    from streams.broker import EmbeddedBroker

    screener = load_screener(policy, reviewer=False)
    out: dict[str, Any] = {"rates": [], "measured": __doc__}
    with EmbeddedBroker() as broker:
        for rate in rates:
            r = run_rate(screener, broker.bootstrap_servers, datasets, rate, seconds,
                         f"r{int(rate)}-{int(time.time())}")
            print(json.dumps(r), flush=True)
            out["rates"].append(r)
    return out
