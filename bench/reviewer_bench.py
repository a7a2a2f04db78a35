"""L2 reviewer bench: latency per review of the local backend on this CPU, and what it separates.

    python bench/reviewer_bench.py [--data $VIGIL_HOME/data/agentdojo] [--split test_slack]
        [--n 20] [--threads 2] [--model-path DIR]

Reviews ``--n`` harmful steps (step label 1) and ``--n`` benign steps (steps of
benign trajectories) of one held-out AgentDojo split, drawn deterministically
(seed 0), with the default local reviewer (Gemma-3-270M, calibrated, the
shipped rubrics), and writes bench/results/reviewer.json: the command, the
machine (with its load average, because other work shares the CPUs), latency
per review (median, p90, mean), prompt tokens per review, the set-up time
(model load + calibration), and the AUROC of each reviewer signal
(``rv_coverage``, ``rv_precision``, ``rv_fbeta``) for harmful vs benign. The
data must exist first: ``monitor worldmodel build-data agentdojo``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monitor.reviewer import ReviewCase, ReviewerConfig  # noqa: E402
from monitor.reviewer.engine import load_reviewer_model  # noqa: E402
from monitor.reviewer.local import LocalReviewer  # noqa: E402
from monitor.reviewer.view import StepView, rubric_prompt  # noqa: E402
from monitor.screening import ScreenStep, screen_steps_of  # noqa: E402
from streams.records import Trajectory, read_jsonl  # noqa: E402
from vigil import paths  # noqa: E402


def pick_steps(path: Path, split: str, n: int) -> tuple[list[ScreenStep], list[int]]:
    harmful: list[ScreenStep] = []
    benign: list[ScreenStep] = []
    for t in read_jsonl(path, Trajectory):
        if t.meta.get("split") != split:
            continue
        for s in screen_steps_of(t):
            if s.step.label == 1:
                harmful.append(s)
            elif t.label == 0 and s.step.action.tool is not None:
                benign.append(s)
    rng = random.Random(0)
    rng.shuffle(harmful)
    rng.shuffle(benign)
    steps = harmful[:n] + benign[:n]
    return steps, [1] * len(harmful[:n]) + [0] * len(benign[:n])


def reading(auroc: dict[str, float]) -> str:
    best = max(auroc.values())
    if best < 0.6:
        return (f"best AUROC {best:.2f}: the local reviewer does not separate harmful from "
                "benign steps here (a 270M base model's yes/no answers barely depend on the "
                "step). It runs the pipeline offline; grading that means something needs a "
                "capable model behind the OpenAI backend.")
    return (f"best AUROC {best:.2f} on {sum(1 for _ in auroc)} signals; see mean_signal for "
            "which way each moves.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(paths.dataset("agentdojo")))
    ap.add_argument("--split", default="test_slack")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model-path", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "reviewer.json"))
    args = ap.parse_args()

    from sklearn.metrics import roc_auc_score

    steps, labels = pick_steps(Path(args.data) / "trajectories.jsonl", args.split, args.n)
    if not steps or len(set(labels)) < 2:
        raise SystemExit(f"{args.data}: split {args.split!r} lacks harmful or benign steps")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    pm = load_reviewer_model(args.model_path, threads=args.threads)
    config = ReviewerConfig(model_path=args.model_path, threads=args.threads)
    rv = LocalReviewer(config, model=pm)
    setup_s = time.perf_counter() - t0
    print(f"set-up (load + calibration): {setup_s:.1f} s; reviewing {len(steps)} steps",
          flush=True)
    verdicts = []
    for i, s in enumerate(steps):
        [v] = rv.review([ReviewCase(s)])
        verdicts.append(v)
        print(f"{i + 1}/{len(steps)} {s.key} label={labels[i]} {v.latency_s:.2f} s "
              f"R={v.coverage:.3f} P={v.precision:.2f} F={v.f_beta:.3f} {v.error or ''}",
              flush=True)
    errors = [v.error for v in verdicts if v.error]
    lat = sorted(v.latency_s for v in verdicts)
    tokens = []
    for s in steps:
        prefix = StepView.of(s).prefix(config.max_context_chars)
        tokens.append(sum(len(rv.engine.encode(rubric_prompt(prefix, r.question)))
                          for r in rv.rubrics))
    auroc: dict[str, float] = {}
    for sig in ("rv_coverage", "rv_precision", "rv_fbeta"):
        vals = [v.signals().get(sig, 0.0) for v in verdicts]
        auroc[sig] = round(float(roc_auc_score(labels, vals)), 4)
    mean_by: dict[str, Any] = {
        name: {sig: round(statistics.fmean(v.signals().get(sig, 0.0) for v, y in
                                           zip(verdicts, labels, strict=True) if y == want), 4)
               for sig in ("rv_coverage", "rv_precision", "rv_fbeta")}
        for name, want in (("harmful", 1), ("benign", 0))
    }
    out = {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "model": {"id": pm.model_id, "hash": pm.model_hash, "attention": "eager"},
        "data": {"path": args.data, "split": args.split, "harmful": labels.count(1),
                 "benign": labels.count(0), "draw": "seed 0, shuffled, first n of each"},
        "rubrics": len(rv.rubrics),
        "setup_s": round(setup_s, 2),
        "latency_s_per_review": {
            "median": round(statistics.median(lat), 3),
            "p90": round(lat[int(0.9 * (len(lat) - 1))], 3),
            "mean": round(statistics.fmean(lat), 3),
        },
        "rubric_prompt_tokens_per_review": {"median": int(statistics.median(tokens)),
                                            "max": max(tokens)},
        "auroc_harmful_vs_benign": auroc,
        "mean_signal": mean_by,
        "errors": len(errors),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "torch_threads": args.threads,
                    "loadavg_1m_before_after": [round(load0[0], 2),
                                                round(os.getloadavg()[0], 2)],
                    "note": "other engineers' jobs share these CPUs; latency varies with load"},
        "reading": reading(auroc),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: out[k] for k in ("latency_s_per_review", "auroc_harmful_vs_benign",
                                          "setup_s")}, indent=2))


if __name__ == "__main__":
    main()
