"""Multiple-instance learning (MIL): learning step scores from trajectory labels.

Some datasets label only whole trajectories (ToolEmu: an LLM judge scored the run, not its
steps; ``Transition.meta["label_level"] == "trajectory"``). A trajectory is unsafe when at
least one of its steps is, so a trajectory is a *bag* of steps and its label says whether
the bag holds a harmful step. Labelling every step with its trajectory's label (naive
per-step labelling) would teach a model that the harmless first steps of an unsafe run,
which read and search as every safe run does, are harmful. Here a bag is scored by pooling
its steps' probabilities and only the pooled score meets the label:

* ``"noisy_or"``: ``P(bag unsafe) = 1 − Π_i (1 − p_i)``. For a *safe* bag the loss is
  exactly the sum of the per-step losses with label 0 (every step of a safe run is safe,
  so naive labelling is right there); for an *unsafe* bag it is ``−log(1 − Π(1 − p_i))``,
  low as soon as one step is confidently harmful, whatever the others score, and its
  gradient on step ``i`` is proportional to ``p_i``: the credit goes to the steps that
  already look harmful, not to all alike.
* ``"max"``: the bag's logit is its highest step logit (only the top step learns).

Step-labelled rows keep their own per-step loss. In a batch, ``bags[i] = -1`` marks a
step-labelled row, ``bags[i] = k ≥ 0`` a row of bag ``k`` (every row of a bag carries the
bag's label); each step-labelled row and each bag is one example of the mean.

:class:`MILLogisticRegression` is the same loss for a linear model over fixed feature
vectors, as a scikit-learn estimator (for stacking signals, and the world model's
relational harm head)::

    est = MILLogisticRegression(C=1.0).fit(X, y, bags=trajectory_ids, bag_labels={"t7": 1})
    est.predict_proba(X)[:, 1]                  # per step
    ids, p = est.predict_bag_proba(X, trajectory_ids)   # per trajectory

``y`` is per row: 0/1 where the step is labelled, NaN or −1 where the row's only label is
its bag's; ``bags`` gives each row's trajectory id (any hashable; None for a row in no
bag); ``bag_labels`` maps a bag id to its 0/1 label. A labelled row is fitted per step; a
labelled bag that has at least one unlabelled row is fitted by the pooled loss over all its
rows; an unlabelled row outside every labelled bag is an error.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, ClassifierMixin
from torch import Tensor

from vigil.metrics import sigmoid

Pool = Literal["noisy_or", "max"]
POOLS = ("noisy_or", "max")
# log P(bag safe) is clamped below 0 by this much: a bag of steps all scored safe to
# float precision still has a finite unsafe log-probability
_LOG_SAFE_MAX = -1e-20


def _bag_index(bags: Tensor) -> tuple[Tensor, Tensor, int]:
    """(rows in a bag, their bag index 0..K-1, K) from per-row bag ids (-1 = none)."""
    inside = torch.nonzero(bags >= 0).squeeze(-1)
    ids, index = torch.unique(bags[inside], return_inverse=True)
    return inside, index, int(ids.numel())


def log_safe(logits: Tensor, index: Tensor, n_bags: int) -> Tensor:
    """log P(bag safe) = Σ_i log(1 − p_i) per bag, from step logits (noisy-OR)."""
    out = torch.zeros(n_bags, dtype=logits.dtype, device=logits.device)
    return out.index_add(0, index, -F.softplus(logits)).clamp(max=_LOG_SAFE_MAX)


def pool_logits(logits: Tensor, index: Tensor, n_bags: int, pool: Pool = "noisy_or") -> Tensor:
    """The bag's logit from its steps' logits: logit(1 − Π(1 − p_i)) or max_i logit_i."""
    if pool == "max":
        init = torch.full((n_bags,), -torch.inf, dtype=logits.dtype, device=logits.device)
        return init.scatter_reduce(0, index, logits, reduce="amax")
    if pool != "noisy_or":
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    s = log_safe(logits, index, n_bags)
    return torch.log(-torch.expm1(s)) - s


def bag_loss(
    logits: Tensor,
    index: Tensor,
    n_bags: int,
    bag_labels: Tensor,
    *,
    pos_weight: float | Tensor = 1.0,
    pool: Pool = "noisy_or",
) -> Tensor:
    """Per-bag BCE of the pooled score against the bag label, shape (n_bags,)."""
    pw = torch.as_tensor(pos_weight, dtype=logits.dtype, device=logits.device)
    y = bag_labels.to(logits.dtype)
    if pool == "noisy_or":  # in log space: log P(unsafe) = log(1 − e^S), log P(safe) = S
        s = log_safe(logits, index, n_bags)
        return -(pw * y * torch.log(-torch.expm1(s)) + (1.0 - y) * s)
    pooled = pool_logits(logits, index, n_bags, pool)
    return F.binary_cross_entropy_with_logits(pooled, y, pos_weight=pw, reduction="none")


def harm_loss(
    logits: Tensor,
    labels: Tensor,
    bags: Tensor | None = None,
    *,
    pos_weight: float | Tensor = 1.0,
    pool: Pool = "noisy_or",
    weights: Tensor | None = None,
) -> Tensor:
    """Mean over examples: a step-labelled row (``bags == -1``) is one example with its own
    BCE; a bag (rows sharing ``bags == k``, each carrying the bag's label) is one example
    with the BCE of its pooled score. ``bags=None``: every row is step-labelled.
    ``weights`` (per row; for a bag, its first row's) scales each example."""
    pw = torch.as_tensor(pos_weight, dtype=logits.dtype, device=logits.device)
    if bags is None:
        bags = torch.full_like(labels, -1, dtype=torch.long)
    step = torch.nonzero(bags < 0).squeeze(-1)
    losses = [
        F.binary_cross_entropy_with_logits(
            logits[step], labels[step].to(logits.dtype), pos_weight=pw, reduction="none"
        )
    ]
    w = [weights[step]] if weights is not None else []
    inside, index, k = _bag_index(bags)
    if k:
        first = torch.full((k,), len(inside), dtype=torch.long, device=logits.device)
        first = first.scatter_reduce(
            0, index, torch.arange(len(inside), device=first.device), reduce="amin"
        )
        y = labels[inside][first]
        losses.append(bag_loss(logits[inside], index, k, y, pos_weight=pw, pool=pool))
        if weights is not None:
            w.append(weights[inside][first])
    loss = torch.cat(losses)
    if weights is None:
        return loss.mean() if loss.numel() else logits.sum() * 0.0
    ww = torch.cat(w).to(loss.dtype)
    return (loss * ww).sum() / ww.sum().clamp(min=1e-12)


def bag_scores(
    logits: np.ndarray, bags: Sequence[Hashable] | np.ndarray, pool: Pool = "noisy_or"
) -> tuple[np.ndarray, np.ndarray]:
    """(bag ids in order of first appearance, pooled bag logit) for step ``logits``."""
    ids, index = _codes(bags)
    pooled = pool_logits(
        torch.as_tensor(np.asarray(logits, dtype=np.float64)),
        torch.as_tensor(index),
        len(ids),
        pool,
    )
    return ids, pooled.numpy()


def _codes(bags: Sequence[Hashable] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bag ids in order of first appearance, and each row's index into them."""
    where: dict[Hashable, int] = {}
    index = np.array([where.setdefault(b, len(where)) for b in bags], dtype=np.int64)
    ids = np.empty(len(where), dtype=object)
    for b, i in where.items():
        ids[i] = b
    return ids, index


def _unlabelled(y: np.ndarray) -> np.ndarray:
    return np.isnan(y) | (y < 0)


class MILLogisticRegression(ClassifierMixin, BaseEstimator):
    """L2 logistic regression over step features that learns from step labels and from
    bag (trajectory) labels alike; see the module docstring for ``fit``'s arguments.

    The objective is scikit-learn's: ``½‖w‖² + C Σ_examples c_e · loss_e`` (the intercept
    is not penalised), an example being a labelled row or a labelled bag; with
    ``class_weight="balanced"`` ``c_e = n_examples / (2 n_class(e))``, counted over
    examples (a bag counts once). Fitted by L-BFGS in float64. Without bags it is the
    ordinary logistic regression.
    """

    coef_: np.ndarray
    intercept_: float
    classes_: np.ndarray

    def __init__(
        self,
        C: float = 1.0,
        pool: Pool = "noisy_or",
        class_weight: Literal["balanced"] | None = "balanced",
        max_iter: int = 500,
        tol: float = 1e-7,
    ) -> None:
        self.C = C
        self.pool = pool
        self.class_weight = class_weight
        self.max_iter = max_iter
        self.tol = tol

    def fit(
        self,
        X: Any,
        y: Any,
        bags: Sequence[Hashable] | np.ndarray | None = None,
        bag_labels: Mapping[Any, int] | None = None,
    ) -> MILLogisticRegression:
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        x = np.asarray(X, dtype=np.float64)
        yy = np.asarray(y, dtype=np.float64).reshape(-1)
        if x.ndim != 2 or len(x) != len(yy):
            raise ValueError(f"X must be (n, d) and y (n,); got {x.shape} and {yy.shape}")
        bag_labels = dict(bag_labels or {})
        unknown = _unlabelled(yy)
        if bags is None:
            bags = [None] * len(yy)
        if len(bags) != len(yy):
            raise ValueError(f"{len(yy)} rows but {len(bags)} bag ids")
        ids, index = _codes(bags)
        in_labelled = np.array([ids[i] is not None and ids[i] in bag_labels for i in index])
        orphans = unknown & ~in_labelled
        if orphans.any():
            raise ValueError(
                f"{int(orphans.sum())} rows have no step label and no labelled bag "
                f"(first: row {int(np.flatnonzero(orphans)[0])})"
            )
        # the bags fitted by pooling: labelled ones with at least one unlabelled row
        pooled_rows = np.flatnonzero(in_labelled & np.isin(index, np.unique(index[unknown])))
        _, bag_of = np.unique(index[pooled_rows], return_inverse=True)
        n_bags = int(bag_of.max()) + 1 if len(bag_of) else 0
        bag_y = np.zeros(n_bags)
        bag_y[bag_of] = [bag_labels[ids[index[r]]] for r in pooled_rows]
        step_rows = np.flatnonzero(~unknown)
        step_y = yy[step_rows]
        example_y = np.concatenate([step_y, bag_y])
        self.classes_ = np.array([0, 1])
        if len(example_y) == 0:
            raise ValueError("nothing to fit: no labelled row and no labelled bag")
        cw = {0: 1.0, 1: 1.0}
        if self.class_weight == "balanced":
            n, pos = len(example_y), float(example_y.sum())
            cw = {1: n / (2 * max(pos, 1.0)), 0: n / (2 * max(n - pos, 1.0))}
        c_step = torch.tensor([cw[int(v)] for v in step_y], dtype=torch.float64)
        c_bag = torch.tensor([cw[int(v)] for v in bag_y], dtype=torch.float64)

        xs, xb = torch.from_numpy(x[step_rows]), torch.from_numpy(x[pooled_rows])
        ys, yb = torch.from_numpy(step_y), torch.from_numpy(bag_y)
        idx = torch.from_numpy(bag_of.astype(np.int64))
        w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS(
            [w, b],
            max_iter=self.max_iter,
            tolerance_grad=self.tol,
            tolerance_change=self.tol * 1e-3,
            line_search_fn="strong_wolfe",
        )

        def objective() -> Tensor:
            opt.zero_grad()
            loss = 0.5 * w.pow(2).sum()
            if len(step_rows):
                s = F.binary_cross_entropy_with_logits(xs @ w + b, ys, reduction="none")
                loss = loss + self.C * (c_step * s).sum()
            if n_bags:
                bl = bag_loss(xb @ w + b, idx, n_bags, yb, pool=self.pool)
                loss = loss + self.C * (c_bag * bl).sum()
            loss.backward()  # type: ignore[no-untyped-call]
            return loss

        opt.step(objective)  # type: ignore[no-untyped-call]
        self.coef_ = w.detach().numpy().copy()
        self.intercept_ = float(b.detach())
        self.n_iter_ = int(opt.state[opt._params[0]]["n_iter"])
        return self

    def _check(self) -> None:
        if getattr(self, "coef_", None) is None:
            raise RuntimeError(f"{type(self).__name__} is not fitted yet; call fit first")

    def decision_function(self, X: Any) -> np.ndarray:
        """The step logit of each row."""
        self._check()
        return np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, 2): P(step safe), P(step harmful)."""
        p = sigmoid(self.decision_function(X))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        return (self.decision_function(X) > 0).astype(int)

    def predict_bag_proba(
        self, X: Any, bags: Sequence[Hashable] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(bag ids in order of first appearance, P(bag unsafe)) by the estimator's pool."""
        ids, logit = bag_scores(self.decision_function(X), bags, self.pool)
        return ids, sigmoid(logit)


__all__ = [
    "POOLS",
    "MILLogisticRegression",
    "bag_loss",
    "bag_scores",
    "harm_loss",
    "log_safe",
    "pool_logits",
]
