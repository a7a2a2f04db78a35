"""The live parts of ``bench/pipeline_bench.py``: a ``monitor stream`` worker process on the
embedded broker, fed a shifted stream at a fixed rate.

The stream is the training suites' validation trajectories (the traffic calibration saw)
followed by the held-out ``test_slack`` trajectories (tools the models never saw), each
trajectory whole and in order, looped with fresh ids for as long as the run lasts. The
worker runs the screen and probe stages (``--role screen probe``), once with the calibrated
thresholds and once with ``--adapt`` (live gates over a window of scores). Harm is rare in
real traffic: a hijacked trajectory is kept with probability ``harm_keep`` (0.1). The screen stage
injects canaries (``--canary-rate``) as a deployment would. A reader on the scores topic
takes each step's tier-0 and tier-1 verdicts; per phase the bench reports the benign share
that reached L1 and L2 (all of the phase, and its second half, after the gates saw its
traffic), the recall of the harmful steps, produce → score latency, and the worker's
resident memory (``/proc/PID/status`` VmRSS, the worker process alone) every ``rss_every_s``.

Run long (``--part soak``) it is the soak: the same worker at a rate two cores sustain,
RSS sampled every 10 s, growth measured from the end of warm-up to the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import rss_mb  # noqa: E402


def _trajectories(datasets: list[str], split: str) -> list[Any]:
    from streams.records import Trajectory, decode

    out = []
    for d in datasets:
        with (Path(d) / "trajectories.jsonl").open() as f:
            for line in f:
                if json.loads(line).get("meta", {}).get("split") == split:
                    out.append(decode(line, Trajectory))
    return out


def _phase_events(trajs: list[Any], n: int, phase: str,
                  harm_keep: float) -> Iterator[tuple[str, Any]]:
    """``n`` step events of ``trajs`` (whole trajectories, looped with fresh ids); a
    hijacked trajectory is kept with probability ``harm_keep`` (harm is rare in traffic)."""
    from streams.records import step_events

    rng = np.random.default_rng(0)
    sent, loop = 0, 0
    while sent < n:
        for t in trajs:
            if t.harmful and rng.random() >= harm_keep:
                continue
            t = t.model_copy(update={"trajectory_id": f"{phase}/{t.trajectory_id}#{loop}",
                                     "source": "deployment"})
            for e in step_events(t):
                yield phase, e
                sent += 1
            if sent >= n:
                return
        loop += 1


def _gate_metrics(port: int) -> dict[str, float | None]:
    """``vigil_gate_threshold`` of the worker, ``"L1 live": 0.93``, at the end of the run."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float | None] = {}
    for line in text.splitlines():
        if line.startswith("vigil_gate_threshold{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:
                                                         line.index("}")].split(","))
            key = f"{labels['gate'].strip(chr(34))} {labels['kind'].strip(chr(34))}"
            v = float(line.rsplit(" ", 1)[1])
            out[key] = v if np.isfinite(v) else None  # NaN: no ceiling yet
    return out


def _pct(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None}
    a = np.array(xs) * 1000
    return {"p50": round(float(np.percentile(a, 50)), 1),
            "p99": round(float(np.percentile(a, 99)), 1)}


def run_live(policy: str | None, bootstrap: str, datasets: list[str], *, rate: float,
             phases: list[tuple[str, str, int]], adapt_window: int | None,
             canary_rate: float = 0.05, harm_keep: float = 0.1, rss_every_s: float = 10.0,
             tag: str = "live", drain_s: float = 240.0) -> dict[str, Any]:
    """One worker process, one run of the shifted stream. ``phases``: (name, split, steps)."""
    from streams.config import KafkaSettings, Topics
    from streams.kafka import KafkaBus
    from streams.processor import publish_record
    from streams.records import Score, decode

    settings = KafkaSettings(bootstrap_servers=bootstrap, client_id="vigil-bench")
    topics = Topics(**{k: f"{v}.{tag}" for k, v in Topics().model_dump().items()})
    admin = KafkaBus(settings)
    admin.ensure_topics(topics.all())
    env = dict(os.environ)
    env.update({f"VIGIL_TOPIC_{k.upper()}": v for k, v in topics.model_dump().items()})
    from streams.broker import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "monitor.cli", "stream", "--role", "screen", "probe",
           "--group", f"bench-{tag}", "--bootstrap-servers", bootstrap,
           "--canary-rate", str(canary_rate), "--metrics-port", str(port)]
    if policy:
        cmd += ["--policy", policy]
    if adapt_window:
        cmd += ["--adapt", "--adapt-window", str(adapt_window)]
    log = Path(f"/tmp/vigil-bench-{tag}.log")
    worker = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=log.open("wb"))
    rss: list[tuple[float, float]] = []  # (seconds since the stream started, MB)
    sent: dict[tuple[str, str], tuple[float, str, int]] = {}  # -> (time, phase, label)
    got: dict[int, dict[tuple[str, str], bool]] = {0: {}, 1: {}}
    lat: dict[int, list[float]] = {0: [], 1: []}
    done = threading.Event()
    try:
        deadline = time.time() + 300
        while log.read_text().count("joined group") < 2:  # the screen and probe stages
            if worker.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        reader = KafkaBus(settings).consumer([topics.scores], f"bench-reader-{tag}")
        while not reader.assigned:
            reader.poll(0.2)
        prod = KafkaBus(settings)
        trajs = {split: _trajectories(datasets, split) for _, split, _ in phases}
        t_start = time.time()

        def produce() -> None:
            t0 = time.perf_counter()
            i = 0
            for name, split, n in phases:
                for phase, e in _phase_events(trajs[split], n, name, harm_keep):
                    wait = t0 + i / rate - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    sent[(e.trajectory_id, e.step.step_id)] = (time.time(), phase,
                                                               int(e.step.label or 0))
                    publish_record(prod, topics.steps_deployment, e, key=e.trajectory_id)
                    i += 1
                    if i % 50 == 0:
                        prod.flush()
            prod.flush()

        def sample() -> None:
            while not done.is_set():
                mb = rss_mb(worker.pid)
                if mb is not None:
                    rss.append((round(time.time() - t_start, 1), round(mb, 1)))
                done.wait(rss_every_s)

        pt = threading.Thread(target=produce, daemon=True)
        st = threading.Thread(target=sample, daemon=True)
        pt.start()
        st.start()
        total = sum(n for _, _, n in phases)
        end = time.time() + total / rate + drain_s
        last_scored = t_start
        while time.time() < end:
            for m in reader.poll(0.2):
                s = decode(m.value, Score)
                k = (s.trajectory_id, s.step_id)
                if s.tier not in got or k not in sent or k in got[s.tier]:
                    continue  # canaries and tier-2 scores are not this bench's
                got[s.tier][k] = s.flagged
                lat[s.tier].append(time.time() - sent[k][0])
                last_scored = time.time()
            passed = {k for k, f in got[0].items() if f}
            if not pt.is_alive() and len(got[0]) >= len(sent) and passed <= got[1].keys():
                break
        done.set()
        st.join(rss_every_s + 1)
        gates = _gate_metrics(port)
        reader.close()
        prod.close()
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        admin.close()
    out: dict[str, Any] = {
        "offered_steps_per_s": rate, "adapt_window": adapt_window, "canary_rate": canary_rate,
        "hijacked_trajectories_kept": harm_keep,
        "steps_sent": len(sent), "steps_scored_tier0": len(got[0]),
        "steps_scored_tier1": len(got[1]),
        "wall_seconds": round(last_scored - t_start, 1),
        "latency_ms_tier0": _pct(lat[0]), "latency_ms_tier1": _pct(lat[1]),
        "rss_mb": rss, "gate_thresholds": gates,
    }
    for name, _, _ in phases:
        keys = [k for k, v in sent.items() if v[1] == name]
        half = set(sorted(keys, key=lambda k: sent[k][0])[len(keys) // 2:])
        for part, ks in (("", keys), ("_second_half", [k for k in keys if k in half])):
            benign = [k for k in ks if sent[k][2] == 0]
            harmful = [k for k in ks if sent[k][2] == 1]

            def share(ks_: list[tuple[str, str]], tier: int) -> float | None:
                seen = [k for k in ks_ if k in got[tier]]  # reaching L(t+1): flagged at t
                return round(sum(got[tier][k] for k in seen) / len(ks_), 4) if ks_ else None

            out.setdefault(name, {}).update({
                f"benign_share_reaching_L1{part}": share(benign, 0),
                f"benign_share_reaching_L2{part}": share(benign, 1),
                f"recall_reaching_L1{part}": share(harmful, 0),
                f"recall_reaching_L2{part}": share(harmful, 1),
                f"steps{part}": len(ks), f"harmful{part}": len(harmful),
            })
    if len(rss) >= 3:
        warm = [mb for t, mb in rss if t >= min(60.0, rss[-1][0] / 2)]
        out["rss_growth_after_warmup"] = round(warm[-1] / warm[0] - 1, 4) if warm else None
    tail = log.read_text().splitlines()
    out["worker_last_line"] = next((line for line in reversed(tail)
                                    if line.startswith("vigil stream: L0 scored")), None)
    return out


def run_live_bench(policy: str | None, datasets: list[str], rate: float, per_phase: int,
                   adapt_window: int) -> dict[str, Any]:
    """The shifted stream through the split stages, with calibrated and with live gates."""
    from streams.broker import EmbeddedBroker

    phases = [("train_suites_val", "val", per_phase), ("test_slack", "test_slack", per_phase)]
    out: dict[str, Any] = {"measured": __doc__}
    with EmbeddedBroker() as broker:
        for mode, window in (("calibrated", None), ("adapted", adapt_window)):
            r = run_live(policy, broker.bootstrap_servers, datasets, rate=rate, phases=phases,
                         adapt_window=window, tag=f"{mode}-{int(time.time())}")
            print("live", mode, json.dumps({k: v for k, v in r.items() if k != "rss_mb"}),
                  flush=True)
            out[mode] = r
    return out


def run_soak(policy: str | None, datasets: list[str], rate: float, seconds: float,
             adapt_window: int) -> dict[str, Any]:
    """A long run of the held-out traffic at ``rate``, with live gates, RSS every 10 s."""
    from streams.broker import EmbeddedBroker

    n = int(rate * seconds)
    with EmbeddedBroker() as broker:
        r = run_live(policy, broker.bootstrap_servers, datasets, rate=rate,
                     phases=[("test_slack", "test_slack", n)], adapt_window=adapt_window,
                     tag=f"soak-{int(time.time())}", drain_s=120.0)
    print("soak", json.dumps({k: v for k, v in r.items() if k != "rss_mb"}), flush=True)
    return r
