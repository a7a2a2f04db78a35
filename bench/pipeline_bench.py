"""End-to-end bench of the tiers (issue 5): held-out recall at the default budgets, and the
stream's throughput and latency through the real broker.

    python bench/pipeline_bench.py                      # both parts, default policy
    python bench/pipeline_bench.py --part quality --per-split 2000 --per-split-reviewed 150
    python bench/pipeline_bench.py --part stream --rates 50 200 1000
    python bench/pipeline_bench.py --part shift --per-split 2000   # budgets under shift
    python bench/pipeline_bench.py --part l0 --l0-steps 2048        # L0 speed, cold and warm

Quality (two passes per split: through L1 on a large sample, where tier 2 = "a reviewer
would grade it" at the 2 % budget; and through the L2 reviewer on a small sample, where
tier 3 = "a human is paged" at the 0.2 % budget, since each review costs seconds here): the
default calibrated policy ($VIGIL_HOME/models/policy.json, fitted on the train
split and calibrated on val of AgentDojo workspace/travel/banking x important_instructions)
screens a seeded, class-stratified sample of each held-out split (``test_slack``: the slack
suite; ``test_attacks``: every other attack template) through L0, L1 and the L2 reviewer,
exactly as ``monitor screen`` does. Reported per split: recall per tier (harmful steps
reaching it), overall recall (steps flagged = reaching L3), false-positive rate (benign steps
flagged), benign share per tier, pages per 10k steps, AUROC of the final score.

Stream: the embedded Tansu broker and the worker's screen (L0) and probe (L1) stages in this
process; a producer offers step events at a fixed rate; latency is the time from producing a
step to its tier-0 and its tier-1 score arriving on ``vigil.scores`` (both clocks are this
machine's); model compute is each stage's own timing, overhead the rest of its handler.

Writes bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def _sample(split: Any, n: int, seed: int = 0) -> Any:
    from monitor.calibrate import LabelledSplit, stratified_subsample

    if len(split.steps) <= n:
        return split
    keep = stratified_subsample(np.arange(len(split.steps)), split.y, n, seed)
    return LabelledSplit([split.steps[i] for i in keep], split.y[keep], split.hash)


def load_held_out(datasets: list[str], split: str) -> Any:
    """Held-out steps, read for evaluation only (``load_split`` refuses test splits)."""
    from monitor.calibrate import LabelledSplit, screen_step_of_transition
    from monitor.tiers import data_hash
    from worldmodel.datasets.format import read_manifest, read_transitions

    steps, y, hashes = [], [], []
    for d in datasets:
        hashes.append(read_manifest(d).content_hash)
        for t in read_transitions(d, [split]):
            steps.append(screen_step_of_transition(t, Path(d)))
            y.append(int(t.label))
    return LabelledSplit(steps, np.array(y, dtype=int), data_hash([*hashes, split]))


def quality(args: argparse.Namespace) -> dict[str, Any]:
    from monitor.defaults import ensure_policy
    from monitor.pipeline import load_screener
    from monitor.tiers import TIERS
    from vigil.metrics import auroc

    screener = load_screener(ensure_policy(args.policy))
    out: dict[str, Any] = {
        "policy": str(args.policy or "default"),
        "policy_data": dict(screener.policy.data),
        "budgets": list(screener.policy.config.budgets),
        "flag_tier": screener.policy.config.flag_tier,
        "val": screener.policy.metrics.get("val"),
        "splits": {},
    }
    runs = [(split, through) for split in args.splits for through in (1, 2)]
    for split, through in runs:
        full = load_held_out(args.data, split)
        if not full.steps:
            continue
        s = _sample(full, args.per_split if through == 1 else args.per_split_reviewed)
        screener.timings.clear()
        t0 = time.perf_counter()
        verdicts = screener.screen(s.steps, through=through)
        dt = time.perf_counter() - t0
        tiers = np.array([v.tier for v in verdicts])
        score = np.array([v.score for v in verdicts])
        flagged = np.array([v.flagged for v in verdicts])
        y = s.y
        m: dict[str, Any] = {
            "through": f"L{through}",
            "steps": int(len(y)),
            "harmful": int(y.sum()),
            "of_split_steps": int(len(full.steps)),
            "recall_overall": float(flagged[y == 1].mean()) if y.sum() else None,
            "fpr": float(flagged[y == 0].mean()) if (y == 0).any() else None,
            "pages_per_10k_steps": float(10000 * (tiers >= 3).mean()),
            "auroc_final_score": auroc(y, score),
            "seconds": round(dt, 1),
            "seconds_per_tier": {k: round(v, 2) for k, v in screener.timings.items()},
        }
        for k in (1, 2, 3):
            hit = tiers[y == 1] >= k
            m[f"recall_reaching_{TIERS[k]}"] = float(hit.mean()) if y.sum() else None
            m[f"benign_share_reaching_{TIERS[k]}"] = (
                float((tiers[y == 0] >= k).mean()) if (y == 0).any() else None
            )
        if through == 1:  # nothing can be flagged (tier 3) without the reviewer
            for key in ("recall_overall", "fpr", "pages_per_10k_steps"):
                m[key] = None
        out["splits"][f"{split}/through_L{through}"] = m
        print(split, json.dumps(m), flush=True)
    return out


def shift(args: argparse.Namespace) -> dict[str, Any]:
    """Benign share per tier on a shifted stream (the training suites' validation steps, then
    ``test_slack``), through L1, with the calibrated thresholds and with live ones
    (:mod:`monitor.adaptive`); canaries from the training split are interleaved (5 %) so the
    live gates keep their recall floor, and canary recall is reported for both."""
    from dashboards.canary import CANARY_KEY, load_canary_set
    from monitor.adaptive import LiveGates
    from monitor.calibrate import load_split
    from monitor.defaults import ensure_default_canaries, ensure_policy
    from monitor.pipeline import load_screener
    from monitor.screening import screen_steps_of

    screener = load_screener(ensure_policy(args.policy), reviewer=False)
    budgets = list(screener.policy.config.budgets)
    before = _sample(load_split(args.data, "val"), args.per_split)
    after = _sample(load_held_out(args.data, "test_slack"), args.per_split)
    canary_steps = [
        st for c in load_canary_set(ensure_default_canaries())
        for st in screen_steps_of(c.model_copy(
            update={"meta": {**c.meta, CANARY_KEY: {"canary_id": c.trajectory_id}}}))
    ]
    rng = np.random.default_rng(0)
    phases = [("train_suites_val", before), ("test_slack", after)]
    stream, phase, label = [], [], []
    for name, split in phases:
        for st, y in zip(split.steps, split.y, strict=True):
            if y == 1 and rng.random() >= args.shift_harm_keep:
                continue  # harm is rare in real traffic: keep a share of the harmful steps
            stream.append(st)
            phase.append(name)
            label.append(int(y))
            if rng.random() < 0.05:
                stream.append(canary_steps[int(rng.integers(len(canary_steps)))])
                phase.append(name)
                label.append(-1)  # a canary
    ph, lab = np.array(phase), np.array(label)
    canary_harm = np.array([st.step.label == 1 for st in stream])  # a canary's harmful steps
    out: dict[str, Any] = {"budgets": budgets,
                           "steps": {n: int(((ph == n) & (lab >= 0)).sum()) for n, _ in phases},
                           "harmful": {n: int(((ph == n) & (lab == 1)).sum()) for n, _ in phases},
                           "canaries": int((lab < 0).sum()), "window": args.adapt_window}
    for mode in ("calibrated", "adapted"):
        screener.live = (LiveGates(screener.policy, window=args.adapt_window)
                         if mode == "adapted" else None)
        tiers = []
        t0 = time.perf_counter()
        for i in range(0, len(stream), 256):  # batches in stream order, as a worker polls
            tiers += [v.tier for v in screener.screen(stream[i:i + 256], through=1)]
        t = np.array(tiers)
        m: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 1)}
        for name, _ in phases:
            benign, harmful = (ph == name) & (lab == 0), (ph == name) & (lab == 1)
            canary = (ph == name) & (lab < 0) & canary_harm
            # the second half of a phase: after the live gates have seen its traffic
            idx = np.flatnonzero(ph == name)
            late = np.zeros(len(t), dtype=bool)
            late[idx[len(idx) // 2:]] = True
            m[name] = {
                f"benign_share_reaching_L{k}": float((t[benign] >= k).mean()) for k in (1, 2)
            } | {
                f"benign_share_reaching_L{k}_second_half": float((t[benign & late] >= k).mean())
                for k in (1, 2)
            } | {
                f"recall_reaching_L{k}": float((t[harmful] >= k).mean()) if harmful.any()
                else None for k in (1, 2)
            } | {
                f"canary_recall_reaching_L{k}": float((t[canary] >= k).mean()) if canary.any()
                else None for k in (1, 2)
            }
        if screener.live is not None:
            m["live_gates"] = screener.live.status()
        out[mode] = m
        print("shift", mode, json.dumps(m, default=float), flush=True)
    screener.live = None
    return out


def l0_speed(args: argparse.Namespace) -> dict[str, Any]:
    """L0 alone, in process, on held-out steps it has never seen: each scorer's time over
    batches of 256 with the world model's text encoder fresh (no cached text), then the
    same steps again (every text cached, for the MiniLM encoder)."""
    from monitor.pipeline import load_screener
    from monitor.scorers.worldmodel import WorldModelSignals
    from worldmodel.encoders import text_encoder

    screener = load_screener(args.policy, reviewer=False)
    steps = load_held_out(args.data, "test_slack").steps[: args.l0_steps]
    kinds = []
    for s in screener.l0:
        if isinstance(s, WorldModelSignals) and args.l0_worldmodel:
            from worldmodel.score import WorldModelScorer  # speed only: its scores are not
            s.scorer = WorldModelScorer.load(args.l0_worldmodel)  # what the policy calibrated
        if isinstance(s, WorldModelSignals):
            kinds.append(s.scorer.text_encoder_kind)
            s.scorer.encoder = text_encoder(kinds[-1])  # no disk cache: cold
    out: dict[str, Any] = {"steps": len(steps), "batch": 256, "text_encoder": kinds,
                           "worldmodel": args.l0_worldmodel or "the policy's"}
    for phase in ("cold", "warm"):
        per: dict[str, float] = {}
        t0 = time.perf_counter()
        for i in range(0, len(steps), 256):
            batch = steps[i:i + 256]
            for scorer in screener.l0:
                t1 = time.perf_counter()
                scorer.score_steps(batch)
                name = type(scorer).__name__
                per[name] = per.get(name, 0.0) + time.perf_counter() - t1
        took = time.perf_counter() - t0
        out[phase] = {"steps_per_s": round(len(steps) / took, 1),
                      "seconds_per_scorer": {k: round(v, 3) for k, v in per.items()}}
        print("l0", phase, json.dumps(out[phase]), flush=True)
    return out


def l1_speed(args: argparse.Namespace) -> dict[str, Any]:
    """L1 alone, in process: the policy's probe on held-out steps it has never seen (no
    activation cache), by batch size (steps sorted by length within a call, as
    ``probes.capture.extract`` does), in the dtype the bundle was trained in; then with each
    decoder block compiled (``torch.compile``)."""
    from monitor.pipeline import load_screener
    from monitor.scorers.probes import ProbeSignals
    from probes.models import load_probe_model

    screener = load_screener(args.policy, reviewer=False)
    probe = next(s for s in screener.l1 if isinstance(s, ProbeSignals)).scorer
    steps = [st.to_probe() for st in load_held_out(args.data, "test_slack").steps]
    steps = steps[: args.l1_steps]
    out: dict[str, Any] = {"steps": len(steps), "layer": probe.info.layer,
                           "dtype": probe.info.dtype, "by_batch": {}}
    probe.cache_dir = None
    probe.score(steps[:32])  # load the model; the first call pays for lazy initialisation
    for compiled in (False, True):
        if compiled:
            probe.model = load_probe_model(probe.model.path, dtype=probe.info.dtype,
                                           compile=True)
            probe.score(steps[:64])  # compile once (dynamic shapes)
        for bs in args.l1_batches:
            probe.batch_size = bs
            t0 = time.perf_counter()
            probe.score(steps)
            rate = round(len(steps) / (time.perf_counter() - t0), 1)
            out["by_batch"][f"{bs}{' compiled' if compiled else ''}"] = rate
            print("l1", "compiled" if compiled else "eager", bs, rate, "steps/s", flush=True)
    return out


def stream(args: argparse.Namespace) -> dict[str, Any]:
    from bench.pipeline_stream import run_stream_bench

    return run_stream_bench(args.policy, args.data, args.rates, args.seconds)


def main() -> None:
    import vigil.paths

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--part", default="all", choices=[
        "quality", "stream", "shift", "l0", "l1", "live", "soak", "all"])
    p.add_argument("--l0-steps", type=int, default=2048, help="l0: held-out steps timed")
    p.add_argument("--l0-worldmodel", help="l0: time this world-model bundle in the policy's "
                   "place (e.g. one trained with --text-encoder static)")
    p.add_argument("--l1-steps", type=int, default=1024, help="l1: held-out steps timed")
    p.add_argument("--l1-batches", nargs="+", type=int, default=[8, 16, 32, 64],
                   help="l1: batch sizes timed")
    p.add_argument("--policy", help="calibrated policy (default: $VIGIL_HOME/models/policy.json)")
    p.add_argument("--data", nargs="+", default=[str(vigil.paths.dataset("agentdojo"))])
    p.add_argument("--splits", nargs="+", default=["test_slack", "test_attacks"])
    p.add_argument("--per-split", type=int, default=2000,
                   help="steps sampled per held-out split, screened through L1")
    p.add_argument("--per-split-reviewed", type=int, default=150,
                   help="steps sampled per held-out split, screened through the L2 reviewer")
    p.add_argument("--rates", nargs="+", type=float, default=[50, 200, 1000])
    p.add_argument("--seconds", type=float, default=20.0, help="offered-load duration per rate")
    p.add_argument("--shift-harm-keep", type=float, default=0.1,
                   help="shift: the share of harmful steps kept in the stream (rare harm)")
    p.add_argument("--adapt-window", type=int, default=2000,
                   help="shift: the live gates' window of scores")
    p.add_argument("--live-rate", type=float, default=100.0,
                   help="live/soak: offered steps/s to the worker process")
    p.add_argument("--live-per-phase", type=int, default=3000,
                   help="live: steps of each phase (training suites, then test_slack)")
    p.add_argument("--soak-seconds", type=float, default=600.0, help="soak: how long to offer")
    args = p.parse_args()
    path = RESULTS / "pipeline.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    result.update(
        {
            "bench": "pipeline",
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
        }
    )
    if args.part in ("quality", "all"):
        result["quality"] = quality(args)
        result["quality"]["command"] = " ".join([sys.executable, *sys.argv])
    if args.part in ("shift", "all"):
        result["shift"] = shift(args)
        result["shift"]["command"] = " ".join([sys.executable, *sys.argv])
    if args.part in ("l0", "all"):
        key = "l0_other_worldmodel" if args.l0_worldmodel else "l0"
        result[key] = l0_speed(args)
        result[key]["command"] = " ".join([sys.executable, *sys.argv])
    if args.part in ("live", "all"):
        from bench.pipeline_live import run_live_bench

        result["live"] = run_live_bench(args.policy, args.data, args.live_rate,
                                        args.live_per_phase, args.adapt_window)
        result["live"]["command"] = " ".join([sys.executable, *sys.argv])
    if args.part == "soak":  # ten minutes: not part of "all"
        from bench.pipeline_live import run_soak

        result["soak"] = run_soak(args.policy, args.data, args.live_rate, args.soak_seconds,
                                  args.adapt_window)
        result["soak"]["command"] = " ".join([sys.executable, *sys.argv])
    if args.part in ("l1", "all"):
        result["l1"] = l1_speed(args)
        result["l1"]["command"] = " ".join([sys.executable, *sys.argv])
    if args.part in ("stream", "all"):
        new = stream(args)
        command = " ".join([sys.executable, *sys.argv])
        rates = {r["offered_steps_per_s"]: r for r in result.get("stream", {}).get("rates", [])}
        rates.update({r["offered_steps_per_s"]: {**r, "command": command} for r in new["rates"]})
        new["rates"] = [rates[k] for k in sorted(rates)]  # rates not run again are kept
        result["stream"] = new
        result["stream"]["command"] = command
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True, default=float) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
