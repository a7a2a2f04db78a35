"""`monitor probes train-likelihood`: fit the task-masked likelihood signal (``lm_task_gain``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import vigil.paths
from monitor.cli.common import CliError

EXAMPLES = (
    "examples:\n"
    "  monitor probes train-likelihood                  # all train/val steps -> "
    "$VIGIL_HOME/models/likelihood\n"
    "  monitor probes train-likelihood --limit 600 --threads 1 --out /tmp/likelihood\n"
    "  monitor probes train-likelihood --task-tokens 128 --context-tokens 192"
)


def cmd_train_likelihood(args: argparse.Namespace) -> int:
    from probes.likelihood import LikelihoodTemplate, train_likelihood
    from vigil.lm import load_language_model

    data = Path(args.data) if args.data else vigil.paths.dataset("agentdojo")
    if not (data / "manifest.json").exists():
        raise CliError(
            f"{data} is not a transition dataset (no manifest.json); build it with "
            "`monitor worldmodel build-data agentdojo`"
        )
    out = Path(args.out) if args.out else vigil.paths.bundle("likelihood")
    template = LikelihoodTemplate(
        task_tokens=args.task_tokens, context_tokens=args.context_tokens,
        action_tokens=args.action_tokens, history=args.history,
    )
    lm = load_language_model(args.model_path, threads=args.threads, dtype=args.dtype,
                             compile=args.compile)
    bundle = train_likelihood(lm, data, out, template=template, limit=args.limit,
                              batch_size=args.batch_size)
    lodo = bundle["lodo"]
    print(json.dumps({
        "bundle": str(out), "steps": bundle["data"]["steps"],
        "feature_set": lodo["feature_set"], "C": lodo["C"],
        "lodo_auroc": lodo["lodo_auroc"], "lodo_auroc_mean": lodo["lodo_auroc_mean"],
        "steps_per_s": bundle["speed"]["steps_per_s"],
    }, indent=2))
    return 0


def _probes_subparsers(sub: Any) -> Any:
    """The ``probes`` group's subparsers when ``sub`` is the top level's, else ``sub`` itself."""
    group = getattr(sub, "choices", {}).get("probes")
    if group is None:
        return sub
    for action in group._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the `probes` command has no subcommands to add train-likelihood to")


def add_parser(sub: Any) -> None:
    """Add ``train-likelihood`` to the ``probes`` group (``sub``: the top-level subparsers,
    after ``probes.add_parser(sub)``, or the ``probes`` group's own)."""
    p = _probes_subparsers(sub).add_parser(
        "train-likelihood",
        help="fit the task-masked action likelihood signal (lm_task_gain) and write its bundle",
        description="Score every train/val step's action under the language model with the "
        "user's task and with it masked; fit a logistic calibration of the gain (feature set "
        "and C chosen by leave-one-domain-out over the training suites) and write "
        "bundle.json.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", help="transition dataset (default: $VIGIL_HOME/data/agentdojo)")
    p.add_argument("--out", help="bundle folder (default: $VIGIL_HOME/models/likelihood)")
    p.add_argument("--model-path", help="a local Hugging Face causal-LM folder "
                   "(default: Gemma-3-270M)")
    p.add_argument("--limit", type=int, help="a deterministic subsample of N train/val steps")
    p.add_argument("--batch-size", type=int, default=16, help="steps a forward pass")
    p.add_argument("--task-tokens", type=int, default=96, help="task budget (head kept)")
    p.add_argument("--context-tokens", type=int, default=128,
                   help="history + observation budget (end kept)")
    p.add_argument("--action-tokens", type=int, default=40, help="action budget (head kept)")
    p.add_argument("--history", type=int, default=2, help="earlier (observation, action) pairs")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto: bfloat16 where the hardware has it natively, else float32")
    p.add_argument("--threads", type=int, help="torch CPU threads (1 on a busy machine)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decoder blocks (about a minute to start)")
    p.set_defaults(fn=cmd_train_likelihood)
