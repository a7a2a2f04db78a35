"""World-model bench: train on the default data, evaluate held out, measure throughput.

    python bench/worldmodel_bench.py --data DIR [DIR ...] [--epochs 8]

Writes bench/results/worldmodel.json (command, data hashes, figures, machine) and
PNG plots (ROC on each held-out split, training curves) next to it. Only the
train split is fitted and only val picks thresholds; every figure below is on
held-out splits (AgentDojo slack suite, other attack templates, MiniWoB seeds).
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import vigil.paths  # noqa: E402
from worldmodel.datasets.format import read_transitions  # noqa: E402
from worldmodel.encoders import text_encoder  # noqa: E402
from worldmodel.evaluate import evaluate  # noqa: E402
from worldmodel.features import step_input  # noqa: E402
from worldmodel.model import JEPAConfig  # noqa: E402
from worldmodel.score import WorldModelScorer  # noqa: E402
from worldmodel.train import TrainConfig, train  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def throughput(bundle: Path, data: str, split: str, n: int, batch: int, screenshots: bool) -> dict:
    rows = [
        t
        for t in read_transitions(data, [split])
        if (t.observation.screenshot is not None) == screenshots
    ][:n]
    if not rows:
        return {}
    base = Path(data)
    steps = [step_input(t) for t in rows]
    kind = json.loads((bundle / "config.json").read_text()).get("text_encoder", "minilm")
    cold = WorldModelScorer.load(bundle, encoder=text_encoder(kind), batch_size=batch)  # no cache
    cold.image_base = base
    t0 = time.perf_counter()
    for i in range(0, len(steps), batch):
        cold.score(steps[i : i + batch])
    t_cold = time.perf_counter() - t0
    t0 = time.perf_counter()  # same steps again: every text is cached now
    for i in range(0, len(steps), batch):
        cold.score(steps[i : i + batch])
    t_warm = time.perf_counter() - t0
    pre = [replace(s, next_observation=None) for s in steps]
    t0 = time.perf_counter()
    for i in range(0, len(pre), batch):
        cold.score(pre[i : i + batch])
    t_pre = time.perf_counter() - t0
    return {
        "steps": len(steps),
        "batch": batch,
        "text_encoder": kind,
        "steps_per_s_cold_cache": len(steps) / t_cold,
        "steps_per_s_warm_cache": len(steps) / t_warm,
        "steps_per_s_pre_execution_warm": len(pre) / t_pre,
        "texts_encoded_cold": cold.encoder.encoded,
    }


def plot(result: dict, scores: dict, history: list, out: Path, stem: str = "worldmodel"
         ) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    files = []
    fig, axes = plt.subplots(1, max(1, len(scores)), figsize=(5 * max(1, len(scores)), 4.2))
    axes = np.atleast_1d(axes)
    for ax, (name, (y, pre, post, rel)) in zip(axes, scores.items(), strict=False):
        for label, s in (
            ("JEPA harm, pre-execution", pre),
            ("JEPA harm, post-execution", post),
            ("relational harm", rel),
        ):
            if 0 < y.sum() < len(y):
                f, t, _ = roc_curve(y, s)
                ax.plot(f, t, label=label)
        ax.axvline(0.01, color="grey", ls=":", lw=1)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlim(0, 1)
        ax.set_title(f"harm ROC: {name}")
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("recall")
        ax.legend(loc="lower right")
    fig.tight_layout()
    p = out / f"{stem}_roc.png"
    fig.savefig(p, dpi=110)
    files.append(p.name)
    plt.close(fig)
    if history:
        fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
        ep = [h["epoch"] for h in history]
        for k in ("pred", "rollout", "harm", "var"):
            ax[0].plot(ep, [h[k] for h in history], label=k)
        ax[0].set_yscale("log")
        ax[0].set_title("training loss terms")
        ax[0].legend()
        for k in ("val_harm_auroc_pre", "val_harm_auroc_post", "embedding_std"):
            ax[1].plot(ep, [h.get(k, float("nan")) for h in history], label=k)
        ax[1].set_title("validation")
        ax[1].legend()
        fig.tight_layout()
        p = out / f"{stem}_training.png"
        fig.savefig(p, dpi=110)
        files.append(p.name)
        plt.close(fig)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--bundle", default=str(vigil.paths.models_dir() / "worldmodel-bench"))
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--throughput-steps", type=int, default=1024)
    ap.add_argument("--text-encoder", choices=["minilm", "static"], default="minilm")
    ap.add_argument("--out", default=str(RESULTS / "worldmodel.json"))
    args = ap.parse_args()
    bundle = Path(args.bundle)
    t0 = time.monotonic()
    if not args.skip_train:
        train(
            TrainConfig(
                data=args.data,
                out=str(bundle),
                epochs=args.epochs,
                text_cache=str(vigil.paths.text_cache()),
                text_encoder=args.text_encoder,
                model=JEPAConfig(),
            )
        )
    train_s = time.monotonic() - t0
    metrics = json.loads((bundle / "metrics.json").read_text())
    ev = evaluate(bundle, args.data)
    scores = ev.pop("_scores")
    agentdojo = next((d for d in args.data if "agentdojo" in d), args.data[0])
    gui = next((d for d in args.data if "miniwob" in d), None)
    tp = {"text": throughput(bundle, agentdojo, "test_slack", args.throughput_steps, 64, False)}
    if gui:
        tp["screenshot"] = throughput(bundle, gui, "test", args.throughput_steps, 64, True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "worldmodel",
        "command": " ".join([sys.executable, *sys.argv]),
        "data": ev["data"],
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "train": {
            "seconds_wall_incl_encoding": train_s if not args.skip_train else None,
            "train_seconds_reported": metrics["train_seconds"],
            "epochs": len(metrics["history"]),
            "train_rows": metrics["train_rows"],
            "val": metrics["val"],
            "history": metrics["history"],
        },
        "held_out": ev["splits"],
        "throughput": tp,
    }
    result["plots"] = plot(result, scores, metrics["history"], Path(args.out).parent,
                           Path(args.out).stem)
    Path(args.out).write_text(
        json.dumps(result, indent=2, sort_keys=True, default=float) + "\n"
    )
    print(
        json.dumps({k: result[k] for k in ("train", "throughput")}, indent=1, default=float)[:3000]
    )
    for name, m in ev["splits"].items():
        print(name, {k: v for k, v in m.items() if not isinstance(v, dict)})


if __name__ == "__main__":
    main()
