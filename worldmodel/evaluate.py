"""Held-out evaluation of a world-model bundle.

For every held-out split (``test*``) of every dataset given:

- harm AUROC, before and after execution;
- recall at the bundle's own 1 %-FPR threshold (chosen on validation data) and
  the false-positive rate that threshold actually gives on the split;
- recall at exactly 1 % FPR on the split itself (an oracle threshold, for
  reference only: it peeks at the split's benign steps);
- surprise AUROC for the observations that carry injected instructions (the
  next observation of a step, against next observations that do not).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from vigil.metrics import auroc, recall_at_fpr
from worldmodel.datasets.format import read_manifest, read_transitions
from worldmodel.features import step_input
from worldmodel.score import WorldModelScorer


def split_metrics(
    y: np.ndarray,
    injected_next: np.ndarray,
    pre: np.ndarray,
    post: np.ndarray,
    surprise: np.ndarray,
    thr_pre: float,
    thr_post: float,
) -> dict[str, Any]:
    benign = y == 0
    out: dict[str, Any] = {
        "steps": int(len(y)),
        "harmful": int(y.sum()),
        "injected_observations": int(injected_next.sum()),
    }
    for name, s, thr in (("pre", pre, thr_pre), ("post", post, thr_post)):
        out[f"harm_auroc_{name}"] = auroc(y, s)
        out[f"harm_recall_at_val_threshold_{name}"] = (
            float((s[y == 1] >= thr).mean()) if y.sum() else None
        )
        out[f"harm_fpr_at_val_threshold_{name}"] = (
            float((s[benign] >= thr).mean()) if benign.any() else None
        )
        out[f"harm_recall_at_1pct_fpr_oracle_{name}"] = recall_at_fpr(y, s)
    out["surprise_auroc_injected"] = auroc(injected_next, surprise)
    return out


def relational_metrics(
    scores: list[Any], y: np.ndarray, injected_next: np.ndarray, threshold: float
) -> dict[str, Any]:
    """The tool-agnostic signals of the bundle (``worldmodel.relational``) on one split."""
    rh = np.array([s.relational_harm for s in scores], dtype=float)
    inj = np.array([s.injection if s.injection is not None else 0.0 for s in scores])
    return {
        "relational_harm_auroc": auroc(y, rh),
        "relational_harm_recall_at_val_threshold": float((rh[y == 1] >= threshold).mean())
        if y.sum()
        else None,
        "relational_harm_fpr_at_val_threshold": float((rh[y == 0] >= threshold).mean())
        if (y == 0).any()
        else None,
        "relational_harm_recall_at_1pct_fpr_oracle": recall_at_fpr(y, rh),
        "injection_auroc": auroc(injected_next, inj),
    }


def evaluate(
    bundle: str | Path,
    data: list[str],
    *,
    splits: list[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    scorer = WorldModelScorer.load(bundle, batch_size=256)
    cal = scorer.calibration
    results: dict[str, Any] = {}
    scores_by_split: dict[str, tuple[np.ndarray, ...]] = {}
    for d in data:
        manifest = read_manifest(d)
        wanted = splits or manifest.held_out_splits
        scorer.image_base = Path(d)
        for split in wanted:
            rows = list(read_transitions(d, [split]))
            if not rows:
                continue
            log(f"scoring {len(rows)} steps of {manifest.name}/{split} ...")
            scores = scorer.score([step_input(t) for t in rows])
            y = np.array([t.label for t in rows])
            inj = np.array([t.next_injected for t in rows])
            pre = np.array([s.harm_pre for s in scores])
            post = np.array(
                [s.harm_post if s.harm_post is not None else s.harm_pre for s in scores]
            )
            sur = np.array([s.surprise if s.surprise is not None else 0.0 for s in scores])
            m = split_metrics(
                y, inj, pre, post, sur, cal.harm_threshold_pre, cal.harm_threshold_post
            )
            if scorer.relational and scores[0].relational_harm is not None:
                m.update(relational_metrics(scores, y, inj, scorer.relational["harm_threshold"]))
            by_cat: dict[str, int] = {}
            for t in rows:
                if t.label:
                    by_cat[t.category or "unknown"] = by_cat.get(t.category or "unknown", 0) + 1
            m["harmful_by_category"] = by_cat
            attacks = np.array([str(t.meta.get("attack")) for t in rows], dtype=object)
            if len(set(attacks)) > 1:
                m["by_attack"] = {
                    a: {
                        "steps": int(sel.sum()),
                        "harm_auroc_pre": auroc(y[sel], pre[sel]),
                        "harm_recall_at_val_threshold_pre": float(
                            (pre[sel & (y == 1)] >= cal.harm_threshold_pre).mean()
                        )
                        if (sel & (y == 1)).any()
                        else None,
                    }
                    for a in sorted(set(attacks))
                    for sel in [attacks == a]
                }
            results[f"{manifest.name}/{split}"] = m
            rh = np.array([s.relational_harm or 0.0 for s in scores])
            scores_by_split[f"{manifest.name}/{split}"] = (y, pre, post, rh)
    scorer.encoder.save()  # the next evaluation reuses these encodings
    return {
        "bundle": str(bundle),
        "data": scorer.data_hash,
        "splits": results,
        "_scores": scores_by_split,
    }


__all__ = ["evaluate", "relational_metrics", "split_metrics"]
