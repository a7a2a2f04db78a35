"""The trajectory verdict re-fitted on labelled runs (``monitor calibrate --runs``).

Calibration fits the trajectory aggregation (:mod:`monitor.trajectory`) on the runs it
calibrates the gates on; those are short (AgentDojo's, MiniWoB++'s) and a team's runs are
not. :func:`refit_trajectory` keeps every model, gate and step threshold of a policy and
fits only its trajectory section (form, weights, benign null, threshold) on labelled runs
screened with that policy (through L2, as ``monitor screen`` screens): the runs of every
training corpus in ``make models``, a team's own labelled runs otherwise. Runs come in
domains (a corpus, an AgentDojo suite, or one per file); a domain gives at most ``max_runs``
runs, so no corpus outweighs the rest. With two or more domains the report says how each
form does on each domain left out of the fit (:func:`lodo`): AUROC, recall, the share of
benign runs flagged against the budget, that share by run length, and the share flagged
when each benign run's steps are repeated (x2, x4, x8): what ``bench/trajectory_bench.py``
reads to choose the form.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from monitor.trajectory import (
    DEFAULT_FORM,
    FORMS,
    TrajectoryAggregation,
    aggregate,
    budget_threshold,
    fit_aggregation,
)
from vigil.metrics import auroc

Log = Callable[[str], None]
LENGTH_BINS = ((1, 5), (6, 15), (16, 30), (31, 10_000))
REPEATS = (1, 2, 4, 8)
THRESHOLD_BY = ("pooled", "domain")
MIN_DOMAIN_BENIGN = 20  # benign runs a domain needs to hold the threshold to its budget
CORPORA = ("agentdojo", "miniwob", "openagentsafety", "stepshield", "toolemu")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ScoredRun:
    """One labelled run's final step scores and flags under a policy."""

    domain: str
    trajectory_id: str
    label: int
    scores: list[float]
    flags: list[bool]

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "trajectory_id": self.trajectory_id,
                "label": self.label, "scores": self.scores, "flags": self.flags}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScoredRun:
        return cls(str(d["domain"]), str(d["trajectory_id"]), int(d["label"]),
                   [float(v) for v in d["scores"]], [bool(v) for v in d["flags"]])


def run_domain(t: Any, default: str) -> str:
    """A run's domain: its AgentDojo suite, or its corpus (a corpus's sub-groups, such as
    ToolEmu's toolkit groups, are one domain) where its id or ``meta["domain"]`` names one,
    else ``default`` (the file it came from)."""
    from worldmodel.datasets.domains import domain_of_id

    meta = t.meta or {}
    first = t.trajectory_id.split("/")[0]
    if first not in CORPORA and not (isinstance(meta.get("domain"), str) and meta["domain"]):
        return default
    d = domain_of_id(t.trajectory_id, meta)
    return d if d.startswith("agentdojo/") else d.split("/")[0]


def read_runs(path: Path, split: str | None = None) -> list[tuple[str, Any]]:
    """``(domain, run)`` for each run of ``path`` (trajectories, one a line) whose
    ``meta.split`` is ``split`` (None: any but a held-out ``test*`` one); screenshots made
    absolute, the domain by :func:`run_domain` (else the file's name). A run without a label
    is one sentence naming it."""
    from monitor.screening import absolute_screens
    from streams.records import Trajectory, read_jsonl

    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    out = []
    for t in read_jsonl(path, Trajectory):
        got = (t.meta or {}).get("split")
        wanted = got == split if split is not None else not str(got).startswith("test")
        if not wanted:
            continue
        if t.harmful is None:
            raise ValueError(f"{path}: run {t.trajectory_id!r} has no label (0 benign, 1 "
                             "harmful, on the run or its steps); the trajectory verdict is "
                             "fitted on labelled runs")
        out.append((run_domain(t, path.stem), absolute_screens(t, path.parent)))
    return out


def pick_runs(
    runs: Iterable[tuple[str, Any]], *, max_runs: int | None, seed: int = 0
) -> dict[str, list[Any]]:
    """``(domain, trajectory)`` pairs grouped by domain; a domain with more than
    ``max_runs`` keeps a seeded sample with its share of harmful runs."""
    by: dict[str, list[Any]] = defaultdict(list)
    for d, t in runs:
        by[d].append(t)
    out: dict[str, list[Any]] = {}
    for d, ts in sorted(by.items()):
        if max_runs is not None and len(ts) > max_runs:
            rng = random.Random(f"{seed}/{d}")  # a domain's sample depends on it alone
            harmful = [t for t in ts if t.harmful]
            benign = [t for t in ts if not t.harmful]
            k = round(max_runs * len(harmful) / len(ts))
            ts = rng.sample(harmful, k) + rng.sample(benign, max_runs - k)
        out[d] = ts
    return out


def score_runs(
    screener: Any, domain: str, runs: Sequence[Any], *, batch_steps: int = 128,
    through: int = 2, log: Log = _stderr,
) -> list[ScoredRun]:
    """Every step of ``runs`` screened through L2 (``through``; batched), as scored runs of
    ``domain``."""
    from monitor.screening import screen_steps_of

    out: list[ScoredRun] = []
    batch: list[Any] = []
    pending = 0
    for k, t in enumerate([*runs, None]):
        if t is not None:
            batch.append(t)
            pending += len(t.steps)
        if batch and (t is None or pending >= batch_steps):
            steps = [s for b in batch for s in screen_steps_of(b)]
            verdicts = screener.screen(steps, through=through)
            i = 0
            for b in batch:
                mine = verdicts[i:i + len(b.steps)]
                i += len(b.steps)
                out.append(ScoredRun(domain, b.trajectory_id, int(bool(b.harmful)),
                                     [float(v.score) for v in mine],
                                     [bool(v.flagged) for v in mine]))
            batch, pending = [], 0
            log(f"  {domain}: {k}/{len(runs)} runs screened")
    return out


def fit(runs: Sequence[ScoredRun], form: str, budget: float, C: float = 1.0, *,
        threshold_by: str = "pooled") -> TrajectoryAggregation:
    """The aggregation of ``form`` fitted on ``runs``, its threshold at ``budget`` of the
    benign runs: of them all (``threshold_by="pooled"``), or of each domain with at least
    :data:`MIN_DOMAIN_BENIGN` benign runs (``"domain"``: the highest of their thresholds, so
    no such domain is flagged past its budget)."""
    agg = fit_aggregation([r.scores for r in runs], [r.flags for r in runs],
                          np.array([r.label for r in runs]), budget=budget, C=C, form=form)
    if threshold_by == "pooled":
        return agg
    if threshold_by != "domain":
        raise ValueError(f"threshold_by must be pooled or domain, got {threshold_by!r}")
    by: dict[str, list[ScoredRun]] = defaultdict(list)
    for r in runs:
        if r.label == 0:
            by[r.domain].append(r)
    voters = [rs for rs in by.values() if len(rs) >= MIN_DOMAIN_BENIGN] or list(by.values())
    threshold = max(budget_threshold(np.array([agg.score(r.scores) for r in rs]),
                                     np.array([any(r.flags) for r in rs]), budget)
                    for rs in voters)
    return replace(agg, threshold=threshold)


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def read_on(agg: TrajectoryAggregation | None, runs: Sequence[ScoredRun]) -> dict[str, Any]:
    """What an aggregation does on ``runs``: AUROC, recall, the benign share flagged (all,
    and by run length), the rank correlation of benign scores with length, and the benign
    share flagged when every benign run's steps are repeated."""
    y = np.array([r.label for r in runs])
    got = [aggregate(r.scores, r.flags, agg) for r in runs]
    s = np.array([g[0] for g in got])
    flagged = np.array([g[1] for g in got], dtype=bool)
    length = np.array([len(r.scores) for r in runs])
    benign = y == 0
    out: dict[str, Any] = {
        "runs": len(runs), "harmful": int(y.sum()),
        "auroc": auroc(y, s),
        "recall": float(flagged[~benign].mean()) if (~benign).any() else None,
        "benign_flagged": float(flagged[benign].mean()) if benign.any() else None,
        # the steps of benign runs a step gate flags (would page a human), against L2's budget
        "benign_steps_flagged": (float(np.mean([f for r in runs if r.label == 0
                                                 for f in r.flags])) if benign.any() else None),
        "benign_flagged_by_length": {},
        "benign_score_length_spearman": _spearman(s[benign], length[benign]),
    }
    for lo, hi in LENGTH_BINS:
        m = benign & (length >= lo) & (length <= hi)
        if m.any():
            out["benign_flagged_by_length"][f"{lo}-{hi}"] = {
                "runs": int(m.sum()), "flagged": float(flagged[m].mean())}
    ben = [r for r in runs if r.label == 0]
    if ben:
        out["repeat_benign_flagged"] = {
            f"x{k}": float(np.mean([aggregate(r.scores * k, r.flags * k, agg)[1]
                                    for r in ben])) for k in REPEATS}
    return out


def lodo(by_domain: dict[str, list[ScoredRun]], form: str, budget: float,
         C: float = 1.0, *, threshold_by: str = "pooled") -> dict[str, Any]:
    """Each domain read by the form fitted on every other domain; and a summary: mean AUROC
    and recall, the worst benign share flagged, how many domains hold 1.5x the budget."""
    folds: dict[str, Any] = {}
    for d in sorted(by_domain):
        rest = [r for e in by_domain if e != d for r in by_domain[e]]
        y = [r.label for r in rest]
        if not 0 < sum(y) < len(y):
            continue
        folds[d] = read_on(fit(rest, form, budget, C, threshold_by=threshold_by), by_domain[d])
    shares = [v["benign_flagged"] for v in folds.values() if v["benign_flagged"] is not None]
    aurocs = [v["auroc"] for v in folds.values() if v["auroc"] is not None]
    recalls = [v["recall"] for v in folds.values() if v["recall"] is not None]
    return {"folds": folds, "summary": {
        "mean_auroc": float(np.mean(aurocs)) if aurocs else None,
        "mean_recall": float(np.mean(recalls)) if recalls else None,
        "worst_benign_flagged": float(max(shares)) if shares else None,
        "domains_within_1.5x_budget": sum(s <= 1.5 * budget for s in shares),
        "domains": len(shares),
    }}


def refit_trajectory(
    policy: Any,
    by_domain: dict[str, list[ScoredRun]],
    *,
    form: str = DEFAULT_FORM,
    threshold_by: str = "domain",
    source: str = "",
    log: Log = _stderr,
) -> tuple[Any, dict[str, Any]]:
    """``policy`` with its trajectory section fitted on ``by_domain``'s scored runs (every
    other part kept), and the report: the fit's figures on its runs, before and after, and
    (two domains or more) each domain left out, for every form."""
    if form not in FORMS:
        raise ValueError(f"unknown trajectory form {form!r}; known: {sorted(FORMS)}")
    every = [r for rs in by_domain.values() for r in rs]
    y = [r.label for r in every]
    if not 0 < sum(y) < len(y):
        raise ValueError(f"{source or 'the runs'}: {len(y)} runs, all "
                         f"{'harmful' if sum(y) else 'benign'}; the trajectory verdict is "
                         "fitted on both")
    budget = float(policy.config.trajectory_budget)
    agg = fit(every, form, budget, policy.config.C, threshold_by=threshold_by)
    report: dict[str, Any] = {
        "source": source, "form": form, "threshold_by": threshold_by, "budget": budget,
        "domains": {d: {"runs": len(rs), "harmful": sum(r.label for r in rs),
                        "steps": sum(len(r.scores) for r in rs)}
                    for d, rs in by_domain.items()},
        "before": read_on(policy.trajectory, every), "after": read_on(agg, every),
    }
    if len(by_domain) > 1:
        report["lodo"] = {f"{f}/{t}": lodo(by_domain, f, budget, policy.config.C, threshold_by=t)
                          for f in FORMS for t in THRESHOLD_BY}
    log(f"trajectory verdict re-fitted ({form}) on {len(every)} runs of {len(by_domain)} "
        f"domains: AUROC {report['before']['auroc'] or 0:.3f} -> "
        f"{report['after']['auroc'] or 0:.3f}; benign runs flagged "
        f"{report['before']['benign_flagged'] or 0:.1%} -> "
        f"{report['after']['benign_flagged'] or 0:.1%} (budget {budget:.0%})")
    kept = {k: v for k, v in report.items() if k != "lodo"}
    if "lodo" in report:  # the policy file keeps each form's summary; the report has the folds
        kept["lodo"] = {f: res["summary"] for f, res in report["lodo"].items()}
    refit = replace(policy, trajectory=agg, metrics={**policy.metrics, "trajectory_refit": kept})
    return refit, report


def describe(report: dict[str, Any]) -> list[str]:
    """The report as lines a person reads."""
    b, a = report["before"], report["after"]
    out = [f"trajectory verdict ({report['form']}, threshold by {report['threshold_by']}, "
           f"budget {report['budget']:.0%}) on "
           f"{b['runs']} runs ({b['harmful']} harmful):",
           f"  AUROC {b['auroc'] or 0:.3f} -> {a['auroc'] or 0:.3f}; recall "
           f"{b['recall'] or 0:.1%} -> {a['recall'] or 0:.1%}; benign flagged "
           f"{b['benign_flagged'] or 0:.1%} -> {a['benign_flagged'] or 0:.1%}"]
    for form, res in report.get("lodo", {}).items():
        s = res["summary"]
        out.append(f"  {form}, each domain left out: mean AUROC {s['mean_auroc'] or 0:.3f}, "
                   f"worst benign flagged {s['worst_benign_flagged'] or 0:.1%}, "
                   f"{s['domains_within_1.5x_budget']}/{s['domains']} domains within 1.5x "
                   "the budget")
    return out
