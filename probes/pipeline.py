"""Train a probe bundle from a transition dataset, and evaluate one held out.

``train`` is fitted (and swept, grouped by task), ``val`` sets the threshold;
the ``test*`` splits are only ever scored by :func:`evaluate_bundle`.

The activations come from a local probe model, an embeddings endpoint
(:mod:`probes.remote`), or, with ``pm=None``, from the records themselves:
every train and val step must then carry ``meta.activations`` of one model
and one pooling (``{"model_id", "pooling", "layers": {"6": [...]}}``), and
no model runs at all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from probes.bundle import BundleInfo, ProbeScorer, save_bundle
from probes.capture import (
    ActivationSource,
    ExtractStats,
    ProbeStep,
    Template,
    extract,
    identity_hash,
)
from probes.estimators import DiffMeansProbe, LogisticProbe
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
    domains: list[str] = field(default_factory=list)  # worldmodel.datasets.domains


def load_steps(
    data: str | Path, splits: Sequence[str], *, limit: int | None = None, seed: int = 0,
    exclude_domains: Sequence[str] = (),
) -> LabelledSteps:
    """Steps of ``splits``; with ``limit``, a deterministic (seeded) subsample of that size;
    then without the steps of ``exclude_domains`` (so a cross-fitting fold draws the same
    sample, less its held-out domain, and reuses its cached activations)."""
    from worldmodel.datasets.domains import domain_of
    from worldmodel.datasets.format import read_transitions

    rows = list(read_transitions(data, splits))
    if limit is not None and len(rows) > limit:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), limit, replace=False))
        rows = [rows[i] for i in keep]
    if exclude_domains:
        rows = [t for t in rows if domain_of(t) not in exclude_domains]
    return LabelledSteps(
        [ProbeStep.from_transition(t) for t in rows],
        np.array([t.label for t in rows], dtype=int),
        [t.group or t.task for t in rows],
        [str((t.meta or {}).get("attack") or "") for t in rows],
        [domain_of(t) for t in rows],
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


def attached_features(
    steps: Sequence[ProbeStep], layers: Sequence[int] | None = None, *, split: str = ""
) -> tuple[dict[tuple[int, str], np.ndarray], str, str]:
    """The activations the steps carry: ``({(layer, pooling): X}, model_id, pooling)``.

    Every step must carry them, from one model and one pooling; ``layers``
    default to those every step has.
    """
    where = f" in {split}" if split else ""
    if not steps:
        raise ValueError(f"no steps{where} to read attached activations from")
    bare = [s for s in steps if not s.activations]
    if bare:
        raise ValueError(
            f"{len(bare)} of {len(steps)} steps{where} carry no activations (meta.activations), "
            f"e.g. {bare[0].step_id or '?'}"
        )
    models = sorted({str(s.activations_model) for s in steps})
    poolings = sorted({s.activations_pooling or "attached" for s in steps})
    if len(models) > 1 or len(poolings) > 1:
        raise ValueError(
            f"the steps{where} carry activations of several models or poolings "
            f"({models}, {poolings}); a probe reads one"
        )
    common = set.intersection(*(set(s.activations or {}) for s in steps))
    want = sorted(set(layers) if layers else common)
    if not want or not set(want) <= common:
        raise ValueError(
            f"layers {sorted(set(want) - common) or want} are not carried by every step{where} "
            f"(all of them carry {sorted(common)})"
        )
    out: dict[tuple[int, str], np.ndarray] = {}
    for layer in want:
        rows = [np.asarray((s.activations or {})[layer], dtype=np.float32) for s in steps]
        widths = {r.shape for r in rows}
        if len(widths) > 1 or len(next(iter(widths))) != 1:
            raise ValueError(f"layer {layer}{where}: the attached vectors differ in shape {widths}")
        out[(layer, poolings[0])] = np.stack(rows)
    return out, models[0], poolings[0]


def train_probe(
    pm: ActivationSource | None,
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
    exclude_domains: Sequence[str] = (),
) -> tuple[BundleInfo, SweepResult]:
    """Sweep layers on ``train``, fit the chosen probe, calibrate on ``val``, write a bundle.

    ``pm`` is a local probe model or an embeddings endpoint; ``None`` trains
    from the activations the records carry (see the module docstring).
    """
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    from worldmodel.datasets.format import read_manifest

    template = template or Template()
    train = load_steps(data, ["train"], limit=train_limit, exclude_domains=exclude_domains)
    val = load_steps(data, ["val"], exclude_domains=exclude_domains)
    if not 0 < train.y.sum() < len(train.y):
        raise ValueError(f"{data}: the train split needs both benign and harmful steps")
    if pm is None:
        ftr, model_id, pooling = attached_features(train.steps, layers, split="train")
        layers = sorted({layer for layer, _ in ftr})
        fva, val_model, val_pooling = attached_features(val.steps, layers, split="val")
        if (val_model, val_pooling) != (model_id, pooling):
            raise ValueError(
                f"val carries activations of {val_model} ({val_pooling}), train of {model_id} "
                f"({pooling}); both must come from one model"
            )
        dims = next(iter(ftr.values())).shape[1]
        source, model_hash, model_path, dtype = "records", identity_hash(model_id, dims), "", ""
        log(
            f"probes: {len(train.steps)} train and {len(val.steps)} val steps with attached "
            f"{model_id} activations ({pooling}), layers {layers}"
        )
    else:
        layers = list(layers or pm.available_layers)
        log(f"probes: {len(train.steps)} train and {len(val.steps)} val steps, layers {layers}")
        ftr, fva = (
            extract(
                pm,
                part.steps,
                layers,
                template=template,
                cache_dir=cache_dir,
                batch_size=batch_size,
                stats=stats,
            )
            for part in (train, val)
        )
        source, model_id, model_hash, model_path = pm.source, pm.model_id, pm.model_hash, pm.path
        dtype = str(getattr(pm, "dtype", ""))
    # layers are chosen by leave-one-domain-out where the data spans domains (each CV fold
    # holds one domain out), else by CV grouped by task
    n_domains = len(set(train.domains))
    if n_domains >= 2:
        log(f"probes: sweeping layers by leave-one-domain-out over {n_domains} domains")
    groups, n_cv = (train.domains, n_domains) if n_domains >= 2 else (train.groups, n_splits)
    result = sweep_layers(ftr, train.y, groups, n_splits=n_cv, fpr=target_fpr, log=log)
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
        model_id=model_id,
        model_hash=model_hash,
        model_path=model_path,
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
        source=source,
        dtype=dtype,
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
