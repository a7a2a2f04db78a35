"""`monitor worldmodel ...`: build transition datasets, train and evaluate the L0 world model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import vigil.paths


def _present_datasets() -> list[str]:
    """The datasets present under $VIGIL_HOME/data (agentdojo, miniwob)."""
    dirs = [vigil.paths.dataset(n) for n in ("agentdojo", "miniwob")]
    return [str(d) for d in dirs if (d / "manifest.json").exists()]


def cmd_build_data(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else vigil.paths.dataset(args.source)
    if args.source == "agentdojo":
        from worldmodel.datasets.agentdojo.build import build_agentdojo

        m = build_agentdojo(
            out,
            suites=args.suites,
            max_user_tasks=args.max_user_tasks,
            max_injection_tasks=args.max_injection_tasks,
            seed=args.seed,
            augment=not args.no_augment,
        )
    elif args.source == "toolemu":
        from worldmodel.datasets.toolemu.build import build_toolemu

        m = build_toolemu(
            out, source=args.source_path, agreed_only=args.agreed_only, seed=args.seed
        )
    elif args.source == "openagentsafety":
        from worldmodel.datasets.openagentsafety.build import build_openagentsafety

        m = build_openagentsafety(out, source=args.source_path, seed=args.seed)
    elif args.source == "stepshield":
        from worldmodel.datasets.stepshield.build import build_stepshield

        m = build_stepshield(out, source=args.source_path, seed=args.seed)
    else:
        from worldmodel.datasets.miniwob.build import DEFAULT_EPISODES, build_miniwob

        episodes: Any = args.episodes if args.episodes is not None else DEFAULT_EPISODES
        m = build_miniwob(out, tasks=args.tasks, episodes_per_task=episodes, seed=args.seed)
    print(f"wrote {out}")
    for split, counts in m.counts.items():
        held = " (held out)" if split in m.held_out_splits else ""
        print(
            f"  {split}{held}: {counts.get('transitions', 0)} transitions, "
            f"{counts.get('harmful', 0)} harmful, {counts.get('trajectories', 0)} trajectories"
        )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from worldmodel.model import JEPAConfig
    from worldmodel.train import TrainConfig, train

    data = args.data or _present_datasets()
    if not data:
        raise ValueError(
            "no datasets: pass --data DIR or build one with "
            "`monitor worldmodel build-data agentdojo`"
        )
    model = JEPAConfig(
        latent_dim=args.latent_dim, vision_arch=args.vision_arch, vision_weights=args.vision_weights
    )
    cfg = TrainConfig(
        data=data,
        out=str(args.out or vigil.paths.worldmodel_bundle()),
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        max_minutes=args.max_minutes,
        text_cache=str(vigil.paths.text_cache()),
        text_encoder=args.text_encoder,
        model=model,
    )
    train(cfg)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from worldmodel.evaluate import evaluate

    data = args.data or _present_datasets()
    result = evaluate(args.model or vigil.paths.worldmodel_bundle(), data, splits=args.splits)
    result.pop("_scores")
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    for name, m in result["splits"].items():
        print(
            f"{name}: {m['steps']} steps, {m['harmful']} harmful; harm AUROC pre "
            f"{_f(m['harm_auroc_pre'])} post {_f(m['harm_auroc_post'])}; recall at the val "
            f"1%-FPR threshold pre {_f(m['harm_recall_at_val_threshold_pre'])} (FPR "
            f"{_f(m['harm_fpr_at_val_threshold_pre'])}) post "
            f"{_f(m['harm_recall_at_val_threshold_post'])} (FPR "
            f"{_f(m['harm_fpr_at_val_threshold_post'])}); surprise AUROC (injected) "
            f"{_f(m['surprise_auroc_injected'])}"
        )
    return 0


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def add_parser(sub: Any) -> None:
    """Add ``worldmodel`` (build-data, train, eval) to the ``monitor`` command line."""
    p = sub.add_parser(
        "worldmodel",
        help="build transition data, train and evaluate the L0 world model",
        description="The L0 world model (JEPA): surprise and harm for every step.",
        epilog="examples:\n  monitor worldmodel build-data agentdojo\n"
        "  monitor worldmodel build-data miniwob --tasks click-button email-inbox\n"
        "  monitor worldmodel build-data toolemu --agreed-only\n"
        "  monitor worldmodel build-data openagentsafety\n"
        "  monitor worldmodel build-data stepshield --source train.jsonl --out /tmp/stepshield\n"
        "  monitor worldmodel train --epochs 8\n"
        "  monitor worldmodel eval --out bench/results/worldmodel_eval.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    wsub = p.add_subparsers(dest="wm_command", metavar="COMMAND", required=True)

    b = wsub.add_parser(
        "build-data",
        help="build a transition dataset",
        description="Build a transition dataset (default: $VIGIL_HOME/data/SOURCE). "
        "agentdojo and miniwob run their environments; toolemu, openagentsafety and "
        "stepshield read a file of interchange trajectories (--source).",
    )
    b.add_argument(
        "source", choices=["agentdojo", "miniwob", "toolemu", "openagentsafety", "stepshield"]
    )
    b.add_argument("--out", help="output folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--suites", nargs="+", help="agentdojo: suites (default: all four)")
    b.add_argument("--max-user-tasks", type=int, help="agentdojo: at most N user tasks a suite")
    b.add_argument("--max-injection-tasks", type=int, help="agentdojo: at most N injection tasks")
    b.add_argument(
        "--no-augment",
        action="store_true",
        help="agentdojo: leave out the paraphrased injections and renamed-tools copies "
        "added to the training suites",
    )
    b.add_argument("--tasks", nargs="+", help="miniwob: tasks (default: the 16 built in)")
    b.add_argument("--episodes", type=int, help="miniwob: episodes per task and policy")
    b.add_argument(
        "--source",
        dest="source_path",
        metavar="PATH",
        help="toolemu, openagentsafety, stepshield: the trajectories file (default: "
        "$VIGIL_TOOLEMU, $VIGIL_OPENAGENTSAFETY or $VIGIL_STEPSHIELD, else "
        "../shared/data/SOURCE/train.jsonl beside the checkout)",
    )
    b.add_argument(
        "--agreed-only",
        action="store_true",
        help="toolemu: keep only the runs on which both safety judges agree",
    )
    b.set_defaults(fn=cmd_build_data)

    t = wsub.add_parser(
        "train",
        help="train a world-model bundle",
        description="Train on the train split, calibrate on val, write a bundle.",
    )
    t.add_argument(
        "--data", nargs="+", help="dataset folders (default: all under $VIGIL_HOME/data)"
    )
    t.add_argument("--out", help="bundle folder (default: $VIGIL_HOME/models/worldmodel)")
    t.add_argument("--epochs", type=int, default=8)
    t.add_argument("--batch-size", type=int, default=128)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--latent-dim", type=int, default=128)
    t.add_argument("--max-minutes", type=float, default=10.0,
                   help="stop the training loop after this many minutes (encoding the texts, "
                   "cached after the first run, does not count)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--text-encoder", choices=["minilm", "static"], default="minilm",
                   help="minilm: the transformer (cached by text); static: a model2vec model "
                   "distilled from it on first use (much faster at L0; see the README)")
    t.add_argument("--vision-arch", help="an open_clip architecture for screenshots, e.g. ViT-B-32")
    t.add_argument("--vision-weights", help="local pretrained weights for --vision-arch")
    t.set_defaults(fn=cmd_train)

    e = wsub.add_parser(
        "eval",
        help="evaluate a bundle on held-out splits",
        description="Harm and surprise metrics on the datasets' held-out splits.",
    )
    e.add_argument("--model", help="bundle folder (default: $VIGIL_HOME/models/worldmodel)")
    e.add_argument(
        "--data", nargs="+", help="dataset folders (default: all under $VIGIL_HOME/data)"
    )
    e.add_argument("--splits", nargs="+", help="splits to score (default: the held-out ones)")
    e.add_argument("--out", help="write the metrics as JSON here")
    e.set_defaults(fn=cmd_eval)
