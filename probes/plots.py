"""The AUROC-by-layer plot of a sweep."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from probes.sweep import SweepResult


def plot_sweep(
    result: SweepResult,
    out: str | Path,
    val_auroc: Mapping[str, float | None] | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = ("-", "--", ":", "-.")
    poolings = sorted({r.pooling for r in result.rows})
    for i, pooling in enumerate(poolings):
        style = styles[i % len(styles)]
        rows = sorted((r for r in result.rows if r.pooling == pooling), key=lambda r: r.layer)
        if not rows:
            continue
        xs = [r.layer for r in rows]
        ax.plot(xs, [_nan(r.cv_auroc) for r in rows], "o" + style, label=f"logistic CV ({pooling})")
        ax.plot(
            xs,
            [_nan(r.cv_auroc_diffmeans) for r in rows],
            "x" + style,
            alpha=0.6,
            label=f"diff-means CV ({pooling})",
        )
        if val_auroc:
            ax.plot(
                xs,
                [_nan(val_auroc.get(f"{x}-{pooling}")) for x in xs],
                "s" + style,
                alpha=0.6,
                label=f"logistic val ({pooling})",
            )
    ax.axvline(result.layer, color="grey", lw=0.8)
    ax.set_xlabel("layer (decoder block output)")
    ax.set_ylabel("AUROC")
    ax.set_title(f"probe AUROC by layer (chosen: {result.layer}, {result.pooling})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _nan(x: float | None) -> float:
    return float("nan") if x is None else float(x)
