"""`monitor reviewer train|serve`: fine-tune the L2 judge, serve a reviewer model over HTTP."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import vigil.paths
from monitor.cli.common import CliError
from monitor.judge_recipe import CORPORA, FAST_JUDGE, JUDGE
from monitor.serve_limits import ServeLimits

TRAIN_EXAMPLES = (
    "examples:\n"
    "  monitor reviewer train                          # default corpus -> "
    "$VIGIL_HOME/models/judge\n"
    "  monitor reviewer train --max-examples 200 --out /tmp/judge   # a small run\n"
    "  monitor reviewer train --method lora --evidence 0 --max-chars 1200 --epochs 1 \\\n"
    "      --out /tmp/lora      # a LoRA adapter (MBs, not a 1.1 GB model; transfers less)\n"
    "  monitor reviewer train --exclude-domains agentdojo/banking --out /tmp/fold  # a LODO fold\n"
    "  monitor reviewer train --fast       # L1's truncated judge -> $VIGIL_HOME/models/judge_fast"
)
SERVE_EXAMPLES = (
    "examples:\n"
    "  monitor reviewer serve --port 8001              # the base reviewer model\n"
    "  monitor reviewer serve --judge $VIGIL_HOME/models/judge   # the fine-tuned judge"
)


def _datasets(given: list[str] | None) -> list[str]:
    if given:
        data = [Path(d).expanduser() for d in given]
    else:
        data = [vigil.paths.dataset(n) for n in CORPORA]
        data = [d for d in data if (d / "manifest.json").exists()]
        if not data:
            raise CliError("no default dataset is built; run `monitor worldmodel build-data "
                           f"agentdojo` (and {', '.join(CORPORA[1:])}) or pass --data")
    for d in data:
        if not (d / "manifest.json").exists():
            raise CliError(f"{d} is not a transition dataset (no manifest.json)")
    return [str(d) for d in data]


def train_config(args: argparse.Namespace) -> Any:
    """The :class:`~monitor.reviewer.train.JudgeTrainConfig` the options ask for: the
    default recipe (``--fast``: L1's) where an option is not given."""
    from monitor.reviewer.train import JudgeTrainConfig

    recipe = FAST_JUDGE if args.fast else JUDGE  # what --fast changes: depth, encoder, lr
    return JudgeTrainConfig(
        data=_datasets(args.data),
        out=str(Path(args.out).expanduser() if args.out else
                vigil.paths.bundle("judge_fast" if args.fast else "judge")),
        model_path=args.model_path,
        method=args.method,
        epochs=args.epochs,
        max_examples=args.max_examples,
        eval_examples=args.eval_examples,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        lr=args.lr if args.lr is not None else recipe.lr,
        max_chars=args.max_chars,
        bf16=args.bf16,
        threads=args.threads,
        lora_r=args.lora_r,
        lora_layers=args.lora_layers,
        lora_targets=tuple(args.lora_targets),
        balance=not args.no_balance,
        balance_by=args.balance_by,
        evidence=args.evidence,
        encoder=args.encoder or recipe.encoder,
        freeze_embeddings=args.freeze_embeddings,
        layers=args.layers if args.layers is not None else recipe.layers,
        twins=recipe.twins if args.twins is None else args.twins,
        exclude_domains=tuple(args.exclude_domains or ()),
    )


def cmd_train(args: argparse.Namespace) -> int:
    from monitor.reviewer.train import train_judge

    cfg = train_config(args)
    try:
        out = train_judge(cfg)
    except ValueError as e:
        raise CliError(str(e)) from e
    info = json.loads((out / "judge.json").read_text())
    print(json.dumps({"bundle": str(out), "method": info["method"],
                      "examples": info["examples"], "eval_loss": info["eval_loss"],
                      "seconds": info["seconds"]}, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import os

    import uvicorn

    from monitor.reviewer.serve import check_exposure, create_app

    token = args.token or os.environ.get("VIGIL_REVIEWER_TOKEN") or None
    limits = ServeLimits(args.max_body_bytes, args.max_prompt_tokens, args.max_request_tokens,
                         args.max_prompts, args.request_timeout, args.max_queue,
                         args.queue_timeout)
    try:
        limits.check()
        note = check_exposure(args.host, token)
    except ValueError as e:
        raise CliError(str(e)) from e
    if note:
        print(note, file=sys.stderr)
    if args.judge:
        from monitor.reviewer.judge import Judge

        try:
            lm = Judge(args.judge, threads=args.threads).lm
        except (FileNotFoundError, ValueError) as e:
            raise CliError(str(e)) from e
    else:
        from monitor.reviewer.engine import load_reviewer_model

        lm = load_reviewer_model(args.model_path, threads=args.threads)
    print(f"serving {lm.model_id} at http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(create_app(lm, model_name=args.model_name, token=token, limits=limits),
                host=args.host, port=args.port, log_level="info")
    return 0


def add_parser(sub: Any) -> None:
    """Add the ``reviewer`` group (``train``, ``serve``) to the ``monitor`` command line."""
    p = sub.add_parser("reviewer", help="the L2 reviewer: fine-tune the judge, serve a model")
    rsub = p.add_subparsers(dest="reviewer_command", required=True)
    t = rsub.add_parser(
        "train",
        help="fine-tune the local judge (LoRA or full) on the training corpus",
        description=(
            "Supervised fine-tuning of the local reviewer model as a safe/unsafe judge on "
            "the train split of the given datasets (val: held-out loss). Progress with loss "
            "and ETA; checkpoints every few steps, resumed when rerun with the same --out; "
            "writes the adapter (safetensors), judge.json and loss.png."
        ),
        epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("--data", nargs="+", help="transition datasets (default: the built "
                   "defaults under $VIGIL_HOME/data)")
    t.add_argument("--out", help="bundle folder (default: $VIGIL_HOME/models/judge)")
    t.add_argument("--model-path", help="base model folder (default: Gemma-3-270M)")
    t.add_argument("--method", choices=["lora", "full"], default=JUDGE.method,
                   help="full: every weight (default; transfers to unseen tools); lora: a "
                   "peft adapter")
    t.add_argument("--epochs", type=float, default=JUDGE.epochs,
                   help="passes over the examples (default %(default)g)")
    t.add_argument("--max-examples", type=int, default=JUDGE.max_examples,
                   help="training examples sampled (default %(default)s)")
    t.add_argument("--eval-examples", type=int, default=JUDGE.eval_examples,
                   help="held-out val examples for the loss and AUROC (default %(default)s)")
    t.add_argument("--batch-size", type=int, default=4)
    t.add_argument("--grad-accum", type=int, default=4)
    t.add_argument("--lr", type=float, help="default 2e-4 (LoRA) or 2e-5 (full; "
                   f"{FAST_JUDGE.lr:g} with --fast)")
    t.add_argument("--max-chars", type=int, default=JUDGE.max_chars,
                   help="characters of trajectory shown per example (default %(default)s; "
                   "the evidence comes on top and is never cut)")
    prec = t.add_mutually_exclusive_group()
    prec.add_argument("--bf16", dest="bf16", action="store_const", const=True,
                      help="mixed precision in bfloat16 (default: where the hardware "
                      "multiplies it natively; emulated, it trains 2-3x slower)")
    prec.add_argument("--no-bf16", dest="bf16", action="store_const", const=False,
                      help="train in float32")
    t.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    t.add_argument("--lora-layers", type=int,
                   help="adapt only the top N decoder layers (default: all)")
    t.add_argument("--lora-targets", nargs="+",
                   default=["q_proj", "k_proj", "v_proj", "o_proj"],
                   help="module names LoRA adapts (default: the attention projections)")
    t.add_argument("--no-balance", action="store_true",
                   help="sample examples in the data's proportions instead of half safe, "
                   "half unsafe within each mode (step, trajectory) of each corpus")
    t.add_argument("--balance-by", choices=["corpus", "mode"], default="corpus",
                   help="balance safe and unsafe within each mode of each corpus (default), "
                   "or of all corpora together ('mode': how judges were trained before "
                   "2026-12-06)")
    t.add_argument("--evidence", type=int, nargs="?", const=2, default=JUDGE.evidence,
                   choices=[0, 1, 2, 3],
                   metavar="LEVEL",
                   help="evidence shown to the judge before its question: 1 where the "
                   "action's values come from (the user's task, what the agent read, "
                   "nowhere); 2 (the level --evidence alone gives) that and the most "
                   "instruction-like passage the agent read, and whether the action reads "
                   "more like it or like the user's task; 3 that and the act (its kind, "
                   "whether it can be undone, whether the task asks for it or grants it); the "
                   "bundle records the level and is asked the same way (default %(default)s; "
                   "0: none)")
    t.add_argument("--encoder", choices=["minilm", "static"],
                   help="the sentence encoder of the goal alignment (levels 2-3): minilm, or "
                   "static, its model2vec distillation, about a hundred times cheaper: for a "
                   f"truncated judge at L1 (default {JUDGE.encoder}; {FAST_JUDGE.encoder} with "
                   "--fast)")
    emb = t.add_mutually_exclusive_group()
    emb.add_argument("--freeze-embeddings", dest="freeze_embeddings", action="store_const",
                     const=True, help="full: keep the token embeddings (tied with the LM head) "
                     "as the base model has them, so the bundle packs as the changed blocks "
                     f"only (default: {'on' if JUDGE.freeze_embeddings else 'off'})")
    emb.add_argument("--train-embeddings", dest="freeze_embeddings", action="store_const",
                     const=False, help="full: train the token embeddings too")
    t.set_defaults(freeze_embeddings=JUDGE.freeze_embeddings)
    t.add_argument("--layers", type=int, metavar="N",
                   help="keep only the first N decoder blocks: a truncated judge, N/18 of the "
                   f"cost, for L1 (default: all; {FAST_JUDGE.layers} with --fast)")
    t.add_argument("--fast", action="store_true",
                   help="L1's truncated judge by the default recipe (the first "
                   f"{FAST_JUDGE.layers} blocks, the {FAST_JUDGE.encoder} encoder, lr "
                   f"{FAST_JUDGE.lr:g}) -> $VIGIL_HOME/models/judge_fast, as `monitor calibrate "
                   "--defaults` trains it; the options above still override")
    tw = t.add_mutually_exclusive_group()
    tw.add_argument("--twins", dest="twins", action="store_const", const=True,
                    help="add the read-only twins of hijacked runs: each a safe trajectory, "
                    "its steps after the dropped harmful call safe steps (default: "
                    f"{'on' if JUDGE.twins else 'off'}: they cost transfer to a held-out "
                    "domain)")
    tw.add_argument("--no-twins", dest="twins", action="store_const", const=False,
                    help="leave the twins out")
    t.add_argument("--exclude-domains", nargs="+", metavar="DOMAIN",
                   help="train without these domains (agentdojo/banking, toolemu/<group>, "
                   "miniwob): a leave-one-domain-out fold, to measure the judge on tools it "
                   "never saw")
    t.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    t.set_defaults(fn=cmd_train)
    s = rsub.add_parser(
        "serve",
        help="serve the reviewer model (or the fine-tuned judge) as an OpenAI-compatible API",
        epilog=SERVE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--judge", help="a judge bundle from `monitor reviewer train`")
    s.add_argument("--model-path", help="base model folder (default: Gemma-3-270M)")
    s.add_argument("--model-name", help="the model name the API reports")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8001)
    s.add_argument("--threads", type=int)
    s.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on every request "
                   "(default: $VIGIL_REVIEWER_TOKEN; required on any host but loopback)")
    d = ServeLimits()
    s.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"larger request bodies get 413 before they are read (default "
                   f"{d.max_body_bytes})")
    s.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens,
                   help=f"a longer prompt gets 400 (default {d.max_prompt_tokens})")
    s.add_argument("--max-request-tokens", type=int, default=d.max_request_tokens,
                   help=f"more prompt tokens in one request get 400 (default "
                   f"{d.max_request_tokens})")
    s.add_argument("--max-prompts", type=int, default=d.max_prompts,
                   help=f"more prompts in one request get 400 (default {d.max_prompts})")
    s.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                   help=f"seconds one request may compute before 504 (default "
                   f"{d.request_timeout_s:g})")
    s.add_argument("--max-queue", type=int, default=d.max_queue,
                   help=f"requests waiting for the model before 429 (default {d.max_queue})")
    s.add_argument("--queue-timeout", type=float, default=d.queue_timeout_s,
                   help=f"seconds a request waits for the model before 503 (default "
                   f"{d.queue_timeout_s:g})")
    s.set_defaults(fn=cmd_serve)
