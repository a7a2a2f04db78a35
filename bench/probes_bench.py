"""L1 probe bench: layer sweep on train, threshold on val, held-out AUROC/recall, throughput.

    python bench/probes_bench.py --data /tmp/agentdojo-full [--layers 1-12]
        [--train-limit 1200] [--slack-limit 1500] [--attacks-limit 2000]

Writes bench/results/probes.json (command, data hash, figures, machine) and
bench/results/probes_auroc_by_layer.png. Only ``train`` is fitted and swept
(grouped by task), only ``val`` sets the threshold; ``test_slack`` (a suite
never trained on) and ``test_attacks`` (other attack templates) are scored
once. Where a split is subsampled (deterministically, seed 0) the JSON says so.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from monitor.probes_cli import _layers  # noqa: E402
from probes.bundle import ProbeScorer  # noqa: E402
from probes.capture import ExtractStats, Template, default_cache_dir, extract  # noqa: E402
from probes.models import load_probe_model  # noqa: E402
from probes.pipeline import evaluate_bundle, load_steps, train_probe  # noqa: E402
from probes.plots import plot_sweep  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def throughput(pm: Any, data: str, layer: int, template: Template, n: int, batch: int) -> dict:
    """Cold (no cache) extraction speed at the chosen layer and at full depth."""
    steps = load_steps(data, ["val"], limit=n, seed=1).steps
    out: dict[str, Any] = {"steps": len(steps), "batch": batch, "max_tokens": template.max_tokens}
    for name, layers in (("chosen_layer", [layer]), ("full_depth", [pm.num_layers])):
        st = ExtractStats()
        extract(
            pm,
            steps,
            layers,
            template=template,
            cache_dir=None,
            batch_size=batch,
            progress=False,
            stats=st,
        )
        out[f"steps_per_s_{name}"] = st.steps_per_s
    return out


def latency(scorer: ProbeScorer, data: str, n: int = 32) -> dict[str, float]:
    steps = load_steps(data, ["val"], limit=n, seed=2).steps
    X = scorer.features(steps)
    t0 = time.perf_counter()
    for i in range(len(X)):
        scorer.score_features(X[i : i + 1])
    probe_ms = (time.perf_counter() - t0) / len(X) * 1e3
    scorer.cache_dir = None  # end to end: the probe model runs, batch of one
    t0 = time.perf_counter()
    for s in steps[:8]:
        scorer.score([s])
    e2e_ms = (time.perf_counter() - t0) / 8 * 1e3
    return {"probe_only_ms_per_step": probe_ms, "end_to_end_ms_per_step_batch1": e2e_ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/tmp/agentdojo-full")
    ap.add_argument("--layers", default="1-12")
    ap.add_argument("--train-limit", type=int, default=1200)
    ap.add_argument("--slack-limit", type=int, default=1500)
    ap.add_argument("--attacks-limit", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS / "probes.json"))
    ap.add_argument("--bundle", default=str(RESULTS / "probes_bundle"))
    args = ap.parse_args()
    from worldmodel.data import read_manifest

    t_all = time.perf_counter()
    t0 = time.perf_counter()
    pm = load_probe_model()
    load_s = time.perf_counter() - t0
    template = Template()
    cache = default_cache_dir()
    stats = ExtractStats()
    layers = _layers(args.layers, pm.num_layers)
    info, sweep = train_probe(
        pm,
        args.data,
        args.bundle,
        layers=layers,
        template=template,
        cache_dir=cache,
        batch_size=args.batch_size,
        train_limit=args.train_limit,
        stats=stats,
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    png = plot_sweep(
        sweep, RESULTS / "probes_auroc_by_layer.png", info.metrics.get("val_auroc_by_layer")
    )
    scorer = ProbeScorer.load(args.bundle, model=pm, cache_dir=cache, batch_size=args.batch_size)
    held: dict[str, Any] = {}
    held.update(evaluate_bundle(scorer, args.data, ["test_slack"], limit=args.slack_limit))
    held.update(evaluate_bundle(scorer, args.data, ["test_attacks"], limit=args.attacks_limit))
    tp = throughput(pm, args.data, info.layer, template, 64, args.batch_size)
    lat = latency(scorer, args.data)
    m = read_manifest(args.data)
    result = {
        "command": " ".join([sys.executable, *sys.argv]),
        "data": {
            "path": args.data,
            "name": m.name,
            "content_hash": m.content_hash,
            "counts": m.counts,
        },
        "subsampling": {
            "train": args.train_limit,
            "test_slack": args.slack_limit,
            "test_attacks": args.attacks_limit,
            "why": "extraction on this 2-core CPU runs at a few steps/s, so the full "
            "37k-step held-out set would take hours; subsamples are deterministic (seed 0)",
        },
        "model": {
            "id": info.model_id,
            "hash": info.model_hash,
            "load_s": load_s,
            "layers": pm.num_layers,
            "hidden": pm.hidden_size,
            "note": "weights dequantised from the Q4_K_M GGUF, run in float32",
        },
        "template": {**template.to_dict(), "hash": template.hash},
        "swept_layers": layers,
        "sweep": sweep.to_dict(),
        "chosen": {
            "layer": info.layer,
            "pooling": info.pooling,
            "C": sweep.C,
            "threshold": info.threshold,
            "target_fpr": info.target_fpr,
        },
        "val": info.metrics,
        "held_out": held,
        "targets": {
            "recall_at_1pct_fpr": 0.95,
            "extraction_steps_per_s": 50,
            "met_recall_slack": _ge(held, "test_slack", 0.95),
            "met_recall_attacks": _ge(held, "test_attacks", 0.95),
            "met_throughput": tp["steps_per_s_chosen_layer"] >= 50,
        },
        "extraction": {
            "sweep_cold_steps_per_s": stats.steps_per_s,
            "sweep_steps_computed": stats.computed,
            **tp,
        },
        "latency": lat,
        "plots": [str(png.relative_to(ROOT))],
        "wall_s": time.perf_counter() - t_all,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch_threads": __import__("torch").get_num_threads(),
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True, default=_num) + "\n")
    print(f"wrote {args.out} and {png}")
    return 0


def _ge(held: dict[str, Any], split: str, target: float) -> bool | None:
    r = held.get(split, {}).get("probe", {}).get("recall_at_1pct_fpr_oracle")
    return None if r is None else bool(r >= target)


def _num(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x).__name__)


if __name__ == "__main__":
    raise SystemExit(main())
