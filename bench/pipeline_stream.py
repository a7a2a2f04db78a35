"""The stream part of ``bench/pipeline_bench.py``: offered load through the real broker.

A producer publishes deployment step events (held-out ``test_slack`` AgentDojo steps, in
trajectory order) at a fixed rate to the embedded Tansu broker; the worker's screen stage
(L0 + L1, ``monitor.stream.screen.ScreenStage`` in a ``Worker`` thread) scores them; a reader on
the scores topic measures produce → tier-0 score latency. Model compute is the screener's
own per-tier timing; the handler's other work and the processor loop are overhead.
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


def run_rate(screener: Any, bootstrap: str, datasets: list[str], rate: float, seconds: float,
             tag: str) -> dict[str, Any]:
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
    screener.timings.clear()
    handler_s = [0.0]
    stop = threading.Event()
    stage = ScreenStage(screener, topics, report=lambda _m: None)
    orig = stage.handle_batch

    def timed(items: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return orig(items)
        finally:
            handler_s[0] += time.perf_counter() - t0

    stage.handle_batch = timed  # type: ignore[method-assign]
    proc = stage.processor(KafkaBus(settings), f"bench-{tag}", batch_size=64)
    wt = threading.Thread(target=lambda: proc.run(stop=stop), daemon=True)
    wt.start()
    sent: dict[tuple[str, str], float] = {}
    lat: list[float] = []
    reader = KafkaBus(settings).consumer([topics.scores], f"bench-reader-{tag}")
    while not reader.assigned:
        reader.poll(0.2)
    time.sleep(6.0)  # the worker joins its group (Tansu: ~3 s)
    prod = KafkaBus(settings)
    done = threading.Event()

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
        done.set()

    t_start = time.time()
    pt = threading.Thread(target=produce, daemon=True)
    pt.start()
    got: set[tuple[str, str]] = set()
    deadline = time.time() + seconds + 180
    last_score = t_start
    while len(got) < n and time.time() < deadline:
        for m in reader.poll(0.2):
            s = decode(m.value, Score)
            if s.tier != 0:
                continue
            k = (s.trajectory_id, s.step_id)
            if k in got or k not in sent:
                continue
            got.add(k)
            now = time.time()
            lat.append(now - sent[k])
            last_score = now
    stop.set()
    wt.join(30)
    reader.close()
    prod.close()
    admin.close()
    model_s = sum(screener.timings.values())
    a = np.array(lat) * 1000 if lat else np.zeros(1)
    return {
        "offered_steps_per_s": rate,
        "steps_offered": n,
        "steps_scored": len(got),
        "throughput_steps_per_s": round(len(got) / max(last_score - t_start, 1e-9), 1),
        "latency_ms_p50": round(float(np.percentile(a, 50)), 1),
        "latency_ms_p99": round(float(np.percentile(a, 99)), 1),
        "latency_ms_max": round(float(a.max()), 1),
        "model_seconds": {k: round(v, 2) for k, v in screener.timings.items()},
        "handler_seconds": round(handler_s[0], 2),
        "handler_overhead_share_of_model": round((handler_s[0] - model_s) / model_s, 3)
        if model_s
        else None,
        "wall_seconds": round(last_score - t_start, 1),
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
