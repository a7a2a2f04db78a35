"""L1 probe bench: layer sweep on train, threshold on val, held-out AUROC/recall, throughput.

    python bench/probes_bench.py [--data $VIGIL_HOME/data/agentdojo] [--layers 1-18]
        [--train-limit 1200] [--slack-limit 1500] [--attacks-limit 2000]
        [--dtype auto] [--compile] [--short-tokens 48]

Writes bench/results/probes.json (command, data hash, figures, machine) and
bench/results/probes_auroc_by_layer.png. Only ``train`` is fitted and swept
(grouped by task), only ``val`` sets the threshold; ``test_slack`` (a suite
never trained on) and ``test_attacks`` (other attack templates) are scored
once. Where a split is subsampled (deterministically, seed 0) the JSON says so.

Besides the held-out figures it measures cold extraction speed (no cache) for
float32, bfloat16 and bfloat16 + ``torch.compile``, at the chosen layer and at
full depth, and two quality checks of the speed options, both on train/val
only: bfloat16 against float32 activations of the val steps (cosine, val AUROC
of the bundle's probe) and a shorter template (``--short-tokens``: CV AUROC on
train and val AUROC at the chosen layer and pooling).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from probes.bundle import ProbeScorer  # noqa: E402
from probes.capture import ExtractStats, Template, extract  # noqa: E402
from probes.models import load_probe_model  # noqa: E402
from probes.pipeline import evaluate_bundle, load_steps, train_probe  # noqa: E402
from probes.plots import plot_sweep  # noqa: E402
from vigil.lm import parse_layers  # noqa: E402
from vigil.metrics import auroc  # noqa: E402
from vigil.paths import dataset, probe_cache  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def _rate(pm: Any, steps: list, layers: list[int], template: Template, batch: int) -> float:
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
    return st.steps_per_s


def throughput(
    pm: Any, data: str, layer: int, template: Template, n: int, batch: int, short_tokens: int
) -> dict:
    """Cold (no cache) steps/s: float32, bfloat16, bfloat16 compiled; chosen layer, full depth."""
    steps = load_steps(data, ["val"], limit=n, seed=1).steps
    out: dict[str, Any] = {"steps": len(steps), "batch": batch, "max_tokens": template.max_tokens}
    short = replace(template, max_tokens=short_tokens)
    for dtype, comp in (("float32", False), ("bfloat16", False), ("bfloat16", True)):
        name = dtype + ("_compiled" if comp else "")
        m = pm if (pm.dtype == dtype and not comp) else load_probe_model(dtype=dtype, compile=comp)
        if comp:  # compile (once per process) and warm up on every batch width
            t0 = time.perf_counter()
            _rate(m, steps, [m.num_layers], template, batch)
            _rate(m, steps, [m.num_layers], short, batch)
            out[f"{name}_compile_and_warmup_s"] = time.perf_counter() - t0
        out[name] = {
            "chosen_layer": _rate(m, steps, [layer], template, batch),
            "full_depth": _rate(m, steps, [m.num_layers], template, batch),
            f"chosen_layer_{short_tokens}_tokens": _rate(m, steps, [layer], short, batch),
        }
        print(f"throughput {name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def dtype_check(scorer: ProbeScorer, pm: Any, data: str, batch: int) -> dict[str, Any]:
    """The bundle's dtype against the other one, on the val steps at the bundle's layer."""
    other = "float32" if pm.dtype == "bfloat16" else "bfloat16"
    ref = load_probe_model(dtype=other)
    val = load_steps(data, ["val"])
    key = (scorer.info.layer, scorer.info.pooling)
    a, b = (
        extract(
            model,
            val.steps,
            [key[0]],
            template=scorer.template,
            cache_dir=probe_cache(),
            batch_size=batch,
            progress=False,
        )[key]
        for model in (pm, ref)
    )
    cos = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    sa, sb = scorer.score_features(a), scorer.score_features(b)
    return {
        "bundle_dtype": pm.dtype,
        "other_dtype": other,
        "val_steps": len(val.steps),
        "activation_cosine_mean": float(cos.mean()),
        "activation_cosine_min": float(cos.min()),
        "score_max_abs_diff": float(np.abs(sa - sb).max()),
        "val_auroc_bundle_dtype": auroc(val.y, sa),
        "val_auroc_other_dtype": auroc(val.y, sb),
        "flags_changed_at_threshold": int(
            ((sa >= scorer.threshold) != (sb >= scorer.threshold)).sum()
        ),
    }


def short_template_check(
    pm: Any, data: str, layer: int, pooling: str, tokens: int, train_limit: int, batch: int
) -> dict[str, Any]:
    """Would a shorter template (faster) keep the quality? Train CV and val only."""
    from probes.estimators import LogisticProbe
    from probes.sweep import sweep_layers

    t = replace(Template(), max_tokens=tokens)
    tr = load_steps(data, ["train"], limit=train_limit)
    va = load_steps(data, ["val"])
    ftr = extract(
        pm,
        tr.steps,
        [layer],
        template=t,
        cache_dir=probe_cache(),
        batch_size=batch,
        progress=False,
    )
    fva = extract(
        pm,
        va.steps,
        [layer],
        template=t,
        cache_dir=probe_cache(),
        batch_size=batch,
        progress=False,
    )
    sw = sweep_layers(ftr, tr.y, tr.groups, log=lambda m: None)
    row = next(r for r in sw.rows if r.pooling == pooling)
    p = LogisticProbe(C=sw.C).fit(ftr[(layer, pooling)], tr.y)
    return {
        "max_tokens": tokens,
        "template_hash": t.hash,
        "layer": layer,
        "pooling": pooling,
        "cv_auroc": row.cv_auroc,
        "cv_recall_at_1pct": row.cv_recall_at_1pct,
        "val_auroc": auroc(va.y, p.decision_function(fva[(layer, pooling)])),
    }


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
    ap.add_argument("--data", default=str(dataset("agentdojo")))
    ap.add_argument("--layers", default="1-18")
    ap.add_argument("--train-limit", type=int, default=1200)
    ap.add_argument("--slack-limit", type=int, default=1500)
    ap.add_argument("--attacks-limit", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", default="auto", help="auto (bf16 where native), float32, bfloat16")
    ap.add_argument("--compile", action="store_true", help="torch.compile the decoder blocks")
    ap.add_argument("--short-tokens", type=int, default=48, help="the shorter template checked")
    ap.add_argument("--throughput-steps", type=int, default=96)
    ap.add_argument("--out", default=str(RESULTS / "probes.json"))
    ap.add_argument("--bundle", default=str(RESULTS / "probes_bundle"))
    args = ap.parse_args()
    for k in ("train_limit", "slack_limit", "attacks_limit"):  # 0: the whole split
        setattr(args, k, getattr(args, k) or None)
    from worldmodel.datasets.format import read_manifest

    t_all = time.perf_counter()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    pm = load_probe_model(dtype=args.dtype, compile=args.compile)
    load_s = time.perf_counter() - t0
    template = Template()
    cache = probe_cache()
    stats = ExtractStats()
    layers = parse_layers(args.layers, pm.num_layers)
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
    t_eval = time.perf_counter()
    lat = latency(scorer, args.data)
    dcheck = dtype_check(scorer, pm, args.data, args.batch_size)
    scheck = short_template_check(
        pm,
        args.data,
        info.layer,
        info.pooling,
        args.short_tokens,
        args.train_limit,
        args.batch_size,
    )
    tp = throughput(
        pm,
        args.data,
        info.layer,
        template,
        args.throughput_steps,
        args.batch_size,
        args.short_tokens,
    )
    print(f"checks and throughput: {time.perf_counter() - t_eval:.0f} s", file=sys.stderr)
    best_rate = max(
        v
        for k, d in tp.items()
        if isinstance(d, dict)
        for kk, v in d.items()
        if kk == "chosen_layer"
    )
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
            "why": "None: the whole split. The sweep keeps the earlier runs' 1,200-step train "
            "subsample so the layer rows compare; subsamples are deterministic (seed 0)",
        },
        "model": {
            "id": info.model_id,
            "hash": info.model_hash,
            "load_s": load_s,
            "layers": pm.num_layers,
            "hidden": pm.hidden_size,
            "dtype": pm.dtype,
            "compiled": args.compile,
            "note": f"weights dequantised from the Q4_K_M GGUF, run in {pm.dtype}",
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
            "met_throughput": best_rate >= 50,
            "best_steps_per_s_chosen_layer": best_rate,
        },
        "extraction": {
            "sweep_cold_steps_per_s_all_layers": stats.steps_per_s,
            "sweep_steps_computed": stats.computed,
            **tp,
        },
        "quality_checks": {"dtype": dcheck, "short_template": scheck},
        "latency": lat,
        "plots": [str(png.relative_to(ROOT))],
        "wall_s": time.perf_counter() - t_all,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch_threads": __import__("torch").get_num_threads(),
            "loadavg_at_start": load_before,
            "loadavg_at_end": os.getloadavg(),
            "note": "2 cores shared with other engineers' jobs while this ran: speeds are "
            "lower bounds of what the CPU does alone",
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
