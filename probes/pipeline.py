"""Train a probe bundle from a transition dataset, and evaluate one held out.

``train`` is fitted (and swept, grouped by task), ``val`` sets the threshold;
the ``test*`` splits are only ever scored by :func:`evaluate_bundle`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from probes.bundle import BundleInfo, ProbeScorer, save_bundle
from probes.capture import ExtractStats, ProbeStep, Template, extract
from probes.estimators import DiffMeansProbe, LogisticProbe
from probes.models import ProbeModel
from probes.sweep import (
    SweepResult,
    auroc,
    calibrate_threshold,
    recall_at_fpr,
    sweep_layers,
)


@dataclass(frozen=True)
class LabelledSteps:
    steps: list[ProbeStep]
    y: np.ndarray
    groups: list[str]
    attacks: list[str]  # meta["attack"] or "" for benign trajectories


def load_steps(
    data: str | Path, splits: Sequence[str], *, limit: int | None = None, seed: int = 0
) -> LabelledSteps:
    """Steps of ``splits``; with ``limit``, a deterministic (seeded) subsample of that size."""
    from worldmodel.data import read_transitions

    rows = list(read_transitions(data, splits))
    if limit is not None and len(rows) > limit:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), limit, replace=False))
        rows = [rows[i] for i in keep]
    return LabelledSteps(
        [ProbeStep.from_transition(t) for t in rows],
        np.array([t.label for t in rows], dtype=int),
        [t.group or t.task for t in rows],
        [str((t.meta or {}).get("attack") or "") for t in rows],
    )


def split_metrics(
    y: np.ndarray, s: np.ndarray, threshold: float, fpr: float = 0.01
) -> dict[str, Any]:
    benign = y == 0
    return {
        "steps": int(len(y)),
        "harmful": int(y.sum()),
        "auroc": auroc(y, s),
        "recall_at_1pct_fpr_oracle": recall_at_fpr(y, s, fpr),
        "recall_at_val_threshold": float((s[y == 1] >= threshold).mean()) if y.sum() else None,
        "fpr_at_val_threshold": float((s[benign] >= threshold).mean()) if benign.any() else None,
    }


def train_probe(
    pm: ProbeModel,
    data: str | Path,
    out: str | Path,
    *,
    layers: Sequence[int] | None = None,
    template: Template | None = None,
    cache_dir: str | Path | None = None,
    target_fpr: float = 0.01,
    batch_size: int = 16,
    n_splits: int = 5,
    train_limit: int | None = None,
    log: Callable[[str], None] | None = None,
    stats: ExtractStats | None = None,
) -> tuple[BundleInfo, SweepResult]:
    """Sweep layers on ``train``, fit the chosen probe, calibrate on ``val``, write a bundle."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    from worldmodel.data import read_manifest

    template = template or Template()
    layers = list(layers or range(1, pm.num_layers + 1))
    train = load_steps(data, ["train"], limit=train_limit)
    val = load_steps(data, ["val"])
    if not 0 < train.y.sum() < len(train.y):
        raise ValueError(f"{data}: the train split needs both benign and harmful steps")
    log(f"probes: {len(train.steps)} train and {len(val.steps)} val steps, layers {layers}")
    ftr = extract(
        pm,
        train.steps,
        layers,
        template=template,
        cache_dir=cache_dir,
        batch_size=batch_size,
        stats=stats,
    )
    fva = extract(
        pm,
        val.steps,
        layers,
        template=template,
        cache_dir=cache_dir,
        batch_size=batch_size,
        stats=stats,
    )
    result = sweep_layers(ftr, train.y, train.groups, n_splits=n_splits, fpr=target_fpr, log=log)
    key = (result.layer, result.pooling)
    probe = LogisticProbe(C=result.C).fit(ftr[key], train.y)
    baseline = DiffMeansProbe().fit(ftr[key], train.y)
    s_val = probe.predict_proba(fva[key])[:, 1]
    threshold = calibrate_threshold(s_val[val.y == 0], target_fpr)
    b_val = baseline.predict_proba(fva[key])[:, 1]
    b_thr = calibrate_threshold(b_val[val.y == 0], target_fpr)
    per_layer_val = (
        {
            f"{layer}-{pooling}": auroc(
                val.y,
                LogisticProbe(C=result.C)
                .fit(ftr[(layer, pooling)], train.y)
                .decision_function(fva[(layer, pooling)]),
            )
            for layer, pooling in sorted(ftr)
        }
        if len(val.y)
        else {}
    )
    metrics: dict[str, Any] = {
        "val": split_metrics(val.y, s_val, threshold, target_fpr),
        "val_diffmeans": split_metrics(val.y, b_val, b_thr, target_fpr),
        "diffmeans_threshold": b_thr,
        "val_auroc_by_layer": per_layer_val,
    }
    m = read_manifest(data)
    info = BundleInfo(
        layer=result.layer,
        pooling=result.pooling,
        template=template.to_dict(),
        template_hash=template.hash,
        model_id=pm.model_id,
        model_hash=pm.model_hash,
        model_path=pm.path,
        threshold=threshold,
        target_fpr=target_fpr,
        estimator=repr(probe),
        metrics=metrics,
        sweep=result.to_dict(),
        data={
            "path": str(data),
            "name": m.name,
            "content_hash": m.content_hash,
            "train_steps": len(train.steps),
            "val_steps": len(val.steps),
            "train_subsampled_to": train_limit,
        },
    )
    save_bundle(out, info, probe, baseline)
    log(
        f"probes: layer {result.layer} ({result.pooling}); val AUROC "
        f"{metrics['val']['auroc']}; threshold {threshold:.4f} at {target_fpr:.0%} FPR; "
        f"wrote {out}"
    )
    return info, result


def evaluate_bundle(
    scorer: ProbeScorer,
    data: str | Path,
    splits: Sequence[str],
    *,
    limit: int | None = None,
    per_attack: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Held-out metrics of the probe and its diff-of-means baseline, per split and attack."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    out: dict[str, Any] = {}
    info = scorer.info
    b_thr = float(info.metrics.get("diffmeans_threshold", 0.5))
    for split in splits:
        ls = load_steps(data, [split], limit=limit)
        if not ls.steps:
            continue
        X = scorer.features(ls.steps, progress=True)
        s = scorer.score_features(X)
        res: dict[str, Any] = {"probe": split_metrics(ls.y, s, info.threshold, info.target_fpr)}
        if scorer.baseline is not None:
            b = scorer.score_features(X, baseline=True)
            res["diffmeans"] = split_metrics(ls.y, b, b_thr, info.target_fpr)
        if limit is not None:
            res["subsampled_to"] = limit
        if per_attack and len({a for a in ls.attacks if a}) > 1:
            # per attack: that attack's hijacked trajectories against all benign steps of the split
            benign = ls.y == 0
            by: dict[str, Any] = {}
            for a in sorted({a for a in ls.attacks if a}):
                m = benign | ((np.array(ls.attacks) == a) & (ls.y == 1))
                by[a] = split_metrics(ls.y[m], s[m], info.threshold, info.target_fpr)
            res["per_attack"] = by
        p = res["probe"]
        log(
            f"{split}: {p['steps']} steps, {p['harmful']} harmful; AUROC {_f(p['auroc'])}; "
            f"recall {_f(p['recall_at_val_threshold'])} at the val threshold (FPR "
            f"{_f(p['fpr_at_val_threshold'])}); oracle recall@1%FPR "
            f"{_f(p['recall_at_1pct_fpr_oracle'])}"
        )
        out[split] = res
    return out


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
