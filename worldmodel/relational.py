"""Tool-agnostic L0 signals that ride in the world-model bundle.

The JEPA harm head learns the training suites' tools and arguments and
generalises poorly to new tool sets (bench: AgentDojo slack). Two small
estimators read *relations* instead of identities:

- :class:`InjectionDetector` — multiple-instance linear scoring of an
  observation's pieces (``features.chunks``) in the frozen text space: an
  observation carries injected instructions when its most instruction-like
  piece scores high. Fitted on the ``injected`` flags of training steps.
- :class:`RelationalHarm` — standardise + logistic regression on the
  relational features (how the action relates to the task and to what the
  agent read, ``features.relational``) plus the injection scores of the
  current and earlier observations. Rows labelled only through their
  trajectory (ToolEmu) are learnt by multiple-instance learning
  (``mil.MILLogisticRegression``, noisy-OR over the trajectory's steps).

Both are scikit-learn estimators (``BaseEstimator``): ``__init__`` only stores
the hyper-parameters, so ``get_params`` / ``set_params`` and
``sklearn.base.clone`` work; ``fit`` returns self and sets the learned state, in
attributes ending in ``_``. ``to_dict`` / ``from_dict`` are the bundle's
(JSON) form of a fitted one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator

from worldmodel.features import Tables
from worldmodel.mil import MILLogisticRegression


def _check_fitted(est: Any, attr: str) -> None:
    if getattr(est, attr, None) is None:
        raise RuntimeError(f"{type(est).__name__} is not fitted yet; call fit first")


class InjectionDetector(BaseEstimator):
    """score(observation) = max over its pieces of w·e(piece) + b."""

    coef_: np.ndarray
    intercept_: float

    def __init__(self, l2: float = 1e-3, epochs: int = 300, lr: float = 0.05, seed: int = 0):
        self.l2 = l2
        self.epochs = epochs
        self.lr = lr
        self.seed = seed

    def fit(
        self, text: np.ndarray, chunk_lists: list[list[int]], y: np.ndarray
    ) -> InjectionDetector:
        keep = [i for i, c in enumerate(chunk_lists) if c]
        torch.manual_seed(self.seed)
        emb = torch.from_numpy(text)
        ids = [torch.tensor(chunk_lists[i]) for i in keep]
        target = torch.tensor(np.asarray(y)[keep], dtype=torch.float32)
        w = torch.zeros(text.shape[1], requires_grad=True)
        b = torch.zeros(1, requires_grad=True)
        opt = torch.optim.Adam([w, b], lr=self.lr)
        pos = float(target.sum())
        pw = torch.tensor(max(1.0, (len(target) - pos) / max(pos, 1.0)))
        # pieces of all observations in one padded matrix: a max per row is one op
        width = max(len(i) for i in ids)
        pad = torch.zeros(len(ids), width, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.bool)
        for r, i in enumerate(ids):
            pad[r, : len(i)] = i
            mask[r, : len(i)] = True
        for _ in range(self.epochs):
            # score every piece once, then gather: not a (rows, width, dim) copy each epoch
            s = (emb @ w)[pad].masked_fill(~mask, -1e9).max(1).values + b
            loss = torch.nn.functional.binary_cross_entropy_with_logits(s, target, pos_weight=pw)
            loss = loss + self.l2 * w.pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.coef_ = w.detach().numpy().astype(np.float32)
        self.intercept_ = float(b.detach())
        return self

    def score(self, text: np.ndarray, chunk_lists: list[list[int]]) -> np.ndarray:
        """Logit per observation; an observation with no text scores the intercept alone."""
        _check_fitted(self, "coef_")
        piece = text @ self.coef_
        out = np.full(len(chunk_lists), self.intercept_, dtype=np.float32)
        for i, c in enumerate(chunk_lists):
            if c:
                out[i] = float(piece[c].max()) + self.intercept_
        return out

    def to_dict(self) -> dict[str, Any]:
        _check_fitted(self, "coef_")
        return {"coef": self.coef_.tolist(), "intercept": self.intercept_}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InjectionDetector:
        det = cls()
        det.coef_ = np.asarray(d["coef"], dtype=np.float32)
        det.intercept_ = float(d["intercept"])
        return det


def relational_features(tables: Tables, detector: InjectionDetector) -> np.ndarray:
    """[relational cosines, injection(current obs), injection(earlier obs), their max]."""
    assert tables.rel is not None
    inj_obs = detector.score(tables.text, tables.obs_chunks)
    inj_hist = detector.score(tables.text, tables.hist_chunks)
    has_hist = np.array([bool(c) for c in tables.hist_chunks])
    inj_hist = np.where(has_hist, inj_hist, -10.0)
    return np.column_stack([tables.rel, inj_obs, inj_hist, np.maximum(inj_obs, inj_hist)])


class RelationalHarm(BaseEstimator):
    """Standardise + logistic regression on ``relational_features``.

    ``C``: the inverse L2 strength of the (class-balanced) logistic regression.
    ``fit(x, y, bags=None, bag_labels=None)``: as ``MILLogisticRegression.fit`` (``y`` NaN
    or -1 where a row's only label is its trajectory's, ``bags`` the trajectory ids,
    ``bag_labels`` their labels); without such rows it is scikit-learn's logistic
    regression, as before.
    """

    mean_: np.ndarray
    scale_: np.ndarray
    coef_: np.ndarray
    intercept_: float

    def __init__(self, C: float = 1.0) -> None:
        self.C = C

    def fit(
        self,
        x: np.ndarray,
        y: np.ndarray,
        bags: Any = None,
        bag_labels: dict[Any, int] | None = None,
    ) -> RelationalHarm:
        from sklearn.linear_model import LogisticRegression

        self.mean_ = x.mean(0)
        self.scale_ = x.std(0) + 1e-6
        z = (x - self.mean_) / self.scale_
        yy = np.asarray(y, dtype=np.float64)
        if bag_labels and (np.isnan(yy) | (yy < 0)).any():
            mil = MILLogisticRegression(C=self.C).fit(z, yy, bags, bag_labels)
            self.coef_, self.intercept_ = mil.coef_, mil.intercept_
            return self
        lr = LogisticRegression(C=self.C, max_iter=5000, class_weight="balanced")
        lr.fit(z, np.asarray(y))
        self.coef_ = lr.coef_[0].astype(np.float64)
        self.intercept_ = float(lr.intercept_[0])
        return self

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        _check_fitted(self, "coef_")
        return ((x - self.mean_) / self.scale_) @ self.coef_ + self.intercept_

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-np.clip(self.decision_function(x), -50, 50)))
        return np.column_stack([1 - p, p])

    def to_dict(self) -> dict[str, Any]:
        _check_fitted(self, "coef_")
        return {
            "C": self.C,
            "mean": self.mean_.tolist(),
            "scale": self.scale_.tolist(),
            "coef": self.coef_.tolist(),
            "intercept": self.intercept_,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RelationalHarm:
        est = cls(C=d["C"])
        est.mean_ = np.asarray(d["mean"])
        est.scale_ = np.asarray(d["scale"])
        est.coef_ = np.asarray(d["coef"])
        est.intercept_ = float(d["intercept"])
        return est
