"""Transfer: how well detection carries to a domain its fit never saw (leave-one-domain-out).

The protocol (``bench/transfer_bench.py`` runs it; ``docs/transfer.md`` says what the
figures mean):

1. A :class:`Corpus` is every step of the training splits (``train``, ``val``) of the
   training datasets, each with its domain (:mod:`worldmodel.datasets.domains`), its label
   and its trajectory. ToolEmu steps carry only their trajectory's label (``weak``): they
   are fitted by multiple-instance learning and scored per trajectory.
2. A *family* is one signal: features per step (computed once, cached by the caller) and
   an estimator fitted on labelled steps. For each training domain D (:func:`lodo_folds`)
   every family is fitted on the other domains and scores D: D's scores are out-of-domain.
3. The *stacked policy* of a fold is a logistic regression over the families' scores. It
   is fitted on out-of-domain scores too (an inner LODO over the fold's fit domains), so
   it learns how far each signal carries, not how well it fits its own training data.
4. Thresholds are set on the *fit* domains' benign out-of-domain scores (1 % FPR, the tier
   budgets) and applied to D unchanged: what a user gets on tools nobody calibrated on.
5. Held-out splits (``test_slack``, ``test_attacks``) are scored once, by families and a
   stack fitted on every training domain, with thresholds from the training domains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vigil.metrics import auroc
from worldmodel.datasets.domains import lodo_folds

FPR = 0.01


@dataclass
class Corpus:
    """Steps with what the protocol needs of each (parallel arrays)."""

    steps: list[Any]  # monitor.screening.ScreenStep
    domain: np.ndarray  # str per step
    split: np.ndarray  # str per step
    label: np.ndarray  # int per step (for weak steps: the trajectory's label)
    weak: np.ndarray  # bool: only the trajectory is labelled
    bag: np.ndarray  # trajectory id per step
    group: np.ndarray  # what must not straddle a split (user task, ToolEmu case)
    injected: np.ndarray  # int: the newest observation carries injected instructions

    def __len__(self) -> int:
        return len(self.steps)

    def subset(self, idx: np.ndarray) -> Corpus:
        return Corpus([self.steps[i] for i in idx], self.domain[idx], self.split[idx],
                      self.label[idx], self.weak[idx], self.bag[idx], self.group[idx],
                      self.injected[idx])


def load_corpus(
    datasets: Sequence[str],
    splits: Sequence[str],
    *,
    limits: dict[str, int] | None = None,
    seed: int = 0,
) -> Corpus:
    """Every transition of ``splits`` over ``datasets`` as a step; ``limits[split]`` keeps a
    seeded subsample of whole trajectories of that split (about that many steps)."""
    from pathlib import Path

    from monitor.calibrate import screen_step_of_transition
    from worldmodel.datasets.domains import domain_of
    from worldmodel.datasets.format import read_transitions

    rows: list[tuple[Any, str, str, int, bool, str, str, int]] = []
    for d in datasets:
        for t in read_transitions(d, list(splits)):
            weak = (t.meta or {}).get("label_level") == "trajectory"
            rows.append((screen_step_of_transition(t, Path(d)), domain_of(t), t.split,
                         int(t.label), weak, t.trajectory_id, t.group or t.trajectory_id,
                         int(t.injected)))
    limits = limits or {}
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for split in splits:
        idx = [i for i, r in enumerate(rows) if r[2] == split]
        limit = limits.get(split)
        if limit is None or len(idx) <= limit:
            keep.extend(idx)
            continue
        bags = sorted({rows[i][5] for i in idx})
        order = rng.permutation(len(bags))
        chosen: set[str] = set()
        n = 0
        per_bag: dict[str, int] = {}
        for i in idx:
            per_bag[rows[i][5]] = per_bag.get(rows[i][5], 0) + 1
        for j in order:
            if n >= limit:
                break
            chosen.add(bags[j])
            n += per_bag[bags[j]]
        keep.extend(i for i in idx if rows[i][5] in chosen)
    rows = [rows[i] for i in sorted(keep)]
    return Corpus(
        steps=[r[0] for r in rows],
        domain=np.array([r[1] for r in rows], dtype=object),
        split=np.array([r[2] for r in rows], dtype=object),
        label=np.array([r[3] for r in rows], dtype=int),
        weak=np.array([r[4] for r in rows], dtype=bool),
        bag=np.array([r[5] for r in rows], dtype=object),
        group=np.array([r[6] for r in rows], dtype=object),
        injected=np.array([r[7] for r in rows], dtype=int),
    )


# --- families -----------------------------------------------------------------------------

Fit = Callable[[np.ndarray, "Corpus"], Any]  # (row indices, corpus) -> fitted model
Score = Callable[[Any, np.ndarray], np.ndarray]  # (model, row indices) -> score per row


@dataclass
class Family:
    """One signal under the protocol: how to fit it on some rows and score others.

    ``tier``: where it runs (0 = every step, 1 = steps L0 escalates). Scores are any
    monotone "higher = more harmful" value; the stack reads them standardised. A fit is
    kept per set of rows: LODO fits the same row sets many times (the inner fold that
    leaves out E within the outer fold that leaves out D is the outer fold E's inner D).
    """

    name: str
    tier: int
    fit_rows: Fit
    score: Score
    doc: str = ""
    _fits: dict[bytes, Any] = field(default_factory=dict, repr=False)

    def fit(self, idx: np.ndarray, corpus: Corpus) -> Any:
        import hashlib

        key = hashlib.sha1(np.sort(np.asarray(idx, dtype=np.int64)).tobytes()).digest()
        if key not in self._fits:
            self._fits[key] = self.fit_rows(idx, corpus)
        return self._fits[key]


def linear_family(name: str, tier: int, X: np.ndarray, *, C: float = 1.0,
                  doc: str = "") -> Family:
    """Standardise + class-balanced logistic regression on a fixed feature matrix ``X``
    (one row per corpus step). Weak (trajectory-labelled) rows are fitted by
    multiple-instance learning: the trajectory's label supervises a noisy-OR of its steps."""

    def fit(idx: np.ndarray, corpus: Corpus) -> Any:
        return fit_linear(X, idx, corpus, C=C)

    def score(model: Any, idx: np.ndarray) -> np.ndarray:
        mean, scale, w, b = model
        return ((X[idx] - mean) / scale) @ w + b

    return Family(name, tier, fit, score, doc)


def fit_linear(X: np.ndarray, idx: np.ndarray, corpus: Corpus, *, C: float = 1.0,
               epochs: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(mean, scale, w, b) of a class-balanced logistic regression, with MIL for weak rows."""
    import torch

    Xf = X[idx].astype(np.float32)
    mean = Xf.mean(0)
    scale = Xf.std(0) + 1e-6
    Z = torch.from_numpy((Xf - mean) / scale)
    weak = corpus.weak[idx]
    y = corpus.label[idx].astype(np.float32)
    strong = np.flatnonzero(~weak)
    bags_of = corpus.bag[idx]
    weak_rows = np.flatnonzero(weak)
    bag_names = sorted(set(bags_of[weak_rows]))
    bag_index = {b: k for k, b in enumerate(bag_names)}
    bag_id = torch.tensor([bag_index[b] for b in bags_of[weak_rows]], dtype=torch.long)
    bag_y = np.zeros(len(bag_names), dtype=np.float32)
    for r in weak_rows:
        bag_y[bag_index[bags_of[r]]] = y[r]
    w = torch.zeros(Z.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=epochs, line_search_fn="strong_wolfe")
    ys = torch.from_numpy(y[strong])
    Zs = Z[strong]
    Zw = Z[weak_rows]
    yb = torch.from_numpy(bag_y)

    def balanced(target: torch.Tensor) -> torch.Tensor:
        pos = float(target.sum())
        n = len(target)
        if n == 0:
            return target
        wp, wn = n / (2 * max(pos, 1.0)), n / (2 * max(n - pos, 1.0))
        return torch.where(target > 0.5, torch.tensor(wp), torch.tensor(wn))

    ws, wb = balanced(ys), balanced(yb)
    n_total = len(strong) + len(bag_names)
    l2 = 1.0 / (C * max(n_total, 1))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.zeros(())
        if len(strong):
            logit = Zs @ w + b
            loss = loss + (torch.nn.functional.binary_cross_entropy_with_logits(
                logit, ys, reduction="none") * ws).sum()
        if len(weak_rows):
            # noisy-OR: log P(bag safe) = sum over its steps of log(1 - p_step)
            log_safe_step = torch.nn.functional.logsigmoid(-(Zw @ w + b))
            log_safe = torch.zeros(len(bag_names)).index_add(0, bag_id, log_safe_step)
            log_safe = log_safe.clamp(max=-1e-6)
            log_unsafe = torch.log(-torch.expm1(log_safe))
            nll = -(yb * log_unsafe + (1 - yb) * log_safe)
            loss = loss + (nll * wb).sum()
        loss = loss / max(n_total, 1) + l2 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return mean, scale, w.detach().numpy(), float(b.detach())


# --- metrics ------------------------------------------------------------------------------


def threshold_at(benign_scores: np.ndarray, fpr: float) -> float:
    """The smallest threshold that passes at most ``fpr`` of ``benign_scores`` (score > t)."""
    s = np.sort(np.asarray(benign_scores, dtype=float))
    if len(s) == 0:
        return math.inf
    k = int(math.floor(len(s) * (1 - fpr)))
    return float(s[min(k, len(s) - 1)])


def bag_scores(scores: np.ndarray, bags: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per trajectory: the max of its steps' scores (and the trajectory ids, sorted)."""
    names = sorted(set(bags.tolist()))
    pos = {b: k for k, b in enumerate(names)}
    out = np.full(len(names), -np.inf)
    for s, b in zip(scores, bags, strict=True):
        k = pos[b]
        out[k] = max(out[k], s)
    return out, names


def bag_labels(corpus: Corpus, idx: np.ndarray, names: list[str]) -> np.ndarray:
    lab: dict[str, int] = {}
    for i in idx:
        b = corpus.bag[i]
        lab[b] = max(lab.get(b, 0), int(corpus.label[i]))
    return np.array([lab[n] for n in names], dtype=int)


@dataclass
class Scored:
    """Figures of one score on one held-out set (steps, or trajectories where weak)."""

    level: str  # "step" | "trajectory"
    n: int
    harmful: int
    auroc: float | None
    recall_at_fpr: float | None
    fpr: float | None  # realised on the held-out benign items
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(float(x), 4)  # noqa: E731
        return {"level": self.level, "n": self.n, "harmful": self.harmful,
                "auroc": r(self.auroc), "recall_at_1pct_fpr": r(self.recall_at_fpr),
                "fpr_realised": r(self.fpr), **self.extra}


def score_held_out(corpus: Corpus, idx: np.ndarray, s: np.ndarray, thr: float,
                   thr_bag: float) -> Scored:
    """Step figures where steps are labelled, trajectory figures (max over steps) where not."""
    if corpus.weak[idx].any():
        sb, names = bag_scores(s, corpus.bag[idx])
        yb = bag_labels(corpus, idx, names)
        return Scored("trajectory", len(names), int(yb.sum()), auroc(yb, sb),
                      float((sb[yb == 1] > thr_bag).mean()) if yb.any() else None,
                      float((sb[yb == 0] > thr_bag).mean()) if (yb == 0).any() else None)
    y = corpus.label[idx]
    return Scored("step", len(idx), int(y.sum()), auroc(y, s),
                  float((s[y == 1] > thr).mean()) if y.any() else None,
                  float((s[y == 0] > thr).mean()) if (y == 0).any() else None)


# --- the protocol -------------------------------------------------------------------------


def out_of_domain_scores(families: Sequence[Family], corpus: Corpus, rows: np.ndarray,
                         log: Callable[[str], None] = lambda _: None) -> np.ndarray:
    """(len(rows), families) scores of ``rows``, each from a fit that left its domain out."""
    sub_domains = corpus.domain[rows]
    out = np.zeros((len(rows), len(families)), dtype=np.float64)
    for fold in lodo_folds(sub_domains.tolist()):
        fit_rows, held_rows = rows[fold.fit], rows[fold.held_out]
        for k, fam in enumerate(families):
            model = fam.fit(fit_rows, corpus)
            out[fold.held_out, k] = fam.score(model, held_rows)
        log(f"  inner fold {fold.domain}: {len(held_rows)} steps")
    return out


@dataclass
class Stack:
    """The stacked policy: standardise the families' scores, class-balanced LR."""

    mean: np.ndarray
    scale: np.ndarray
    w: np.ndarray
    b: float

    def __call__(self, S: np.ndarray) -> np.ndarray:
        return ((S - self.mean) / self.scale) @ self.w + self.b


def fit_stack(S: np.ndarray, rows: np.ndarray, corpus: Corpus, C: float = 1.0) -> Stack:
    mean, scale, w, b = fit_linear(S, np.arange(len(rows)), corpus.subset(rows), C=C)
    return Stack(mean, scale, w, b)


@dataclass(frozen=True)
class Budgets:
    """The tier budgets the cascade is gated at (share of benign steps passed up)."""

    l1: float = 0.20
    l2: float = 0.02


def _benign_thresholds(s: np.ndarray, rows: np.ndarray, corpus: Corpus,
                       fpr: float) -> tuple[float, float]:
    """(step threshold, trajectory threshold) at ``fpr`` on the benign items of ``rows``."""
    strong = ~corpus.weak[rows]
    benign_steps = s[strong & (corpus.label[rows] == 0)]
    sb, names = bag_scores(s, corpus.bag[rows])
    yb = bag_labels(corpus, rows, names)
    return threshold_at(benign_steps, fpr), threshold_at(sb[yb == 0], fpr)


def evaluate_split(
    families: Sequence[Family],
    corpus: Corpus,
    fit_rows: np.ndarray,
    held_rows: np.ndarray,
    *,
    budgets: Budgets = Budgets(),
    fpr: float = FPR,
    fit_scores: np.ndarray | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Fit every family and the stack on ``fit_rows``; score ``held_rows`` (see module doc).

    ``fit_scores``: the families' out-of-domain scores of ``fit_rows`` when already known.
    """
    held = np.zeros((len(held_rows), len(families)))
    for k, fam in enumerate(families):
        held[:, k] = fam.score(fam.fit(fit_rows, corpus), held_rows)
    if fit_scores is None:
        fit_scores = out_of_domain_scores(families, corpus, fit_rows, log)
    out: dict[str, Any] = {"families": {}}
    for k, fam in enumerate(families):
        thr, thr_bag = _benign_thresholds(fit_scores[:, k], fit_rows, corpus, fpr)
        out["families"][fam.name] = score_held_out(
            corpus, held_rows, held[:, k], thr, thr_bag).to_json()
    tiers = [[k for k, f in enumerate(families) if f.tier <= t] for t in (0, 1)]
    stacks = [fit_stack(fit_scores[:, cols], fit_rows, corpus) for cols in tiers]
    final_fit = stacks[1](fit_scores[:, tiers[1]])
    final_held = stacks[1](held[:, tiers[1]])
    thr, thr_bag = _benign_thresholds(final_fit, fit_rows, corpus, fpr)
    stacked = score_held_out(corpus, held_rows, final_held, thr, thr_bag).to_json()
    stacked["weights"] = {families[k].name: round(float(w / s), 4) for k, w, s in
                          zip(tiers[1], stacks[1].w, stacks[1].scale, strict=True)}
    stacked["tiers"] = _cascade(stacks, tiers, fit_scores, held, fit_rows, held_rows, corpus,
                                budgets)
    out["stacked"] = stacked
    return out


def _cascade(stacks: list[Stack], tiers: list[list[int]], fit_scores: np.ndarray,
             held: np.ndarray, fit_rows: np.ndarray, held_rows: np.ndarray, corpus: Corpus,
             budgets: Budgets) -> dict[str, Any]:
    """Gate L0 at ``budgets.l1`` and L1 at ``budgets.l2`` of the fit domains' benign steps;
    the share of the held-out benign (and harmful) steps that reaches L1 and L2."""
    benign_fit = (~corpus.weak[fit_rows]) & (corpus.label[fit_rows] == 0)
    g0_fit = stacks[0](fit_scores[:, tiers[0]])
    t0 = threshold_at(g0_fit[benign_fit], budgets.l1)
    g1_fit = stacks[1](fit_scores[:, tiers[1]])
    passed = benign_fit & (g0_fit > t0)
    # L1's threshold: of all benign fit steps, budgets.l2 pass both gates
    share = budgets.l2 / max(passed.sum() / max(benign_fit.sum(), 1), 1e-9)
    t1 = threshold_at(g1_fit[passed], min(share, 1.0)) if passed.any() else math.inf
    g0 = stacks[0](held[:, tiers[0]]) > t0
    g1 = g0 & (stacks[1](held[:, tiers[1]]) > t1)
    strong = ~corpus.weak[held_rows]
    y = corpus.label[held_rows]
    res: dict[str, Any] = {}
    for name, mask in (("benign", strong & (y == 0)), ("harmful", strong & (y == 1))):
        if mask.any():
            res[f"{name}_share_reaching_L1"] = round(float(g0[mask].mean()), 4)
            res[f"{name}_share_reaching_L2"] = round(float(g1[mask].mean()), 4)
    return res


def lodo(families: Sequence[Family], corpus: Corpus, rows: np.ndarray, *,
         budgets: Budgets = Budgets(), fpr: float = FPR,
         log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """One :func:`evaluate_split` per training domain of ``rows``, fitting on the others."""
    out: dict[str, Any] = {}
    for fold in lodo_folds(corpus.domain[rows].tolist()):
        log(f"LODO: holding out {fold.domain} ({len(fold.held_out)} steps)")
        out[fold.domain] = evaluate_split(families, corpus, rows[fold.fit], rows[fold.held_out],
                                          budgets=budgets, fpr=fpr, log=log)
    return out


def grouped_trajectory_cv(
    families: Sequence[Family],
    corpus: Corpus,
    fit_rows: np.ndarray,
    target_rows: np.ndarray,
    groups: np.ndarray,
    *,
    k: int = 5,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Trajectory AUROC and F1 on ``target_rows`` by ``k``-fold CV over ``groups`` (e.g.
    ToolEmu cases: never one case on both sides). Each fold fits families and stack on
    ``fit_rows`` minus the fold's rows; a trajectory's score is the max of its steps'
    stacked scores; the F1 threshold is the one that maximises F1 on the fit rows' target
    trajectories (out-of-domain scores)."""
    from sklearn.metrics import f1_score

    names = sorted(set(groups[target_rows].tolist()))
    order = np.random.default_rng(0).permutation(len(names))
    fold_of = {names[j]: n % k for n, j in enumerate(order)}
    all_s, all_y, all_flag = [], [], []
    target_set = set(target_rows.tolist())
    for f in range(k):
        held = np.array([i for i in target_rows if fold_of[groups[i]] == f], dtype=int)
        held_set = set(held.tolist())
        fit = np.array([i for i in fit_rows if i not in held_set], dtype=int)
        fit_scores = out_of_domain_scores(families, corpus, fit)
        stack = fit_stack(fit_scores, fit, corpus)
        held_scores = np.column_stack([fam.score(fam.fit(fit, corpus), held)
                                       for fam in families])
        fit_target = np.array([n for n, i in enumerate(fit) if i in target_set], dtype=int)
        sb_fit, nb_fit = bag_scores(stack(fit_scores[fit_target]), corpus.bag[fit[fit_target]])
        yb_fit = bag_labels(corpus, fit[fit_target], nb_fit)
        cands = np.unique(sb_fit)
        best = max(cands, key=lambda t: f1_score(yb_fit, sb_fit >= t, zero_division=0))
        sb, nb = bag_scores(stack(held_scores), corpus.bag[held])
        yb = bag_labels(corpus, held, nb)
        all_s.extend(sb.tolist())
        all_y.extend(yb.tolist())
        all_flag.extend((sb >= best).tolist())
        log(f"  case fold {f + 1}/{k}: {len(nb)} trajectories")
    y, s, flag = np.array(all_y), np.array(all_s), np.array(all_flag)
    return {"trajectories": len(y), "unsafe": int(y.sum()), "folds": k,
            "auroc": round(auroc(y, s) or float("nan"), 4),
            "f1": round(float(f1_score(y, flag, zero_division=0)), 4),
            "precision": round(float(flag[y == 1].sum() / max(flag.sum(), 1)), 4),
            "recall": round(float(flag[y == 1].mean()), 4) if y.any() else None}
