"""Transfer bench: does detection carry to tools and harms it was not trained on?

    python bench/transfer_bench.py [--families rules,provenance,alignment,minilm,drift,likelihood]
        [--slack-limit 3000] [--attacks-limit 3000] [--toolemu-cv 5]

The protocol is :mod:`monitor.transfer` (leave-one-domain-out; thresholds from the other
domains' benign steps; the stack fitted on out-of-domain scores). Domains: AgentDojo
workspace, travel, banking (train + val splits, with the builder's renamed-tool and
paraphrased-injection variants), the ToolEmu toolkit groups, and MiniWoB++ when its
dataset exists. ``test_slack`` and ``test_attacks`` are scored once, at the end, by every
family and the stack fitted on all training domains. ToolEmu is also scored per
trajectory by grouped-by-case cross-validation.

A TF-IDF + logistic-regression baseline on the step's text (task, observation, action)
runs under the same protocol, outside the stack, as the bar to beat.

Writes ``bench/results/transfer.json`` (command, data hashes, figures per held-out domain,
family and the stacked policy, machine) and ``bench/results/transfer.png``.
Features are computed once and cached under ``$VIGIL_HOME/cache/transfer``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.machine import machine, write_report  # noqa: E402
from monitor.transfer import (  # noqa: E402
    Corpus,
    Family,
    evaluate_split,
    grouped_trajectory_cv,
    linear_family,
    load_corpus,
    lodo,
)
from vigil import paths  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ALL_FAMILIES = ("rules", "injection", "provenance", "alignment", "minilm", "drift",
                "likelihood")
DEFAULT_FAMILIES = ("rules", "injection", "provenance")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _key(corpus: Corpus) -> str:
    h = hashlib.sha256()
    for st in corpus.steps:
        h.update(f"{st.key}\0{st.task}\0{st.step.action.text}\0".encode())
    return h.hexdigest()[:16]


def cached(name: str, corpus: Corpus, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """Feature matrix of ``name`` over ``corpus``: computed once, kept in the cache folder."""
    folder = paths.home() / "cache" / "transfer"
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / f"{name}-{_key(corpus)}.npy"
    if f.exists():
        return np.load(f)
    t0 = time.perf_counter()
    X = np.asarray(compute(), dtype=np.float32)
    np.save(f, X)
    say(f"{name}: {X.shape} features in {time.perf_counter() - t0:.0f} s")
    return X


# --- feature families -----------------------------------------------------------------------


def rules_features(corpus: Corpus) -> np.ndarray:
    from monitor.scorers.rules import RuleSignals

    out = RuleSignals().score_steps(corpus.steps)
    names = RuleSignals.signals
    return np.array([[d[n] for n in names] for d in out])


TEXT_ENCODER = ["minilm"]  # --text-encoder: "minilm" or "static" (model2vec, distilled)


def _encoder() -> Any:
    from worldmodel.encoders import text_encoder

    return text_encoder(TEXT_ENCODER[0], cache_dir=paths.text_cache(), log=say)


def minilm_features(corpus: Corpus) -> np.ndarray:
    """MiniLM (or static, ``--text-encoder``) embeddings of the action and of the newest
    observation, side by side."""
    enc = _encoder()
    act = enc.encode([st.step.action.text for st in corpus.steps])
    obs = enc.encode([st.step.observation.text for st in corpus.steps])
    enc.save()
    return np.hstack([act, obs, (act * obs).sum(1, keepdims=True)])


def provenance_features(corpus: Corpus) -> np.ndarray:
    from worldmodel.provenance import provenance_features as feats

    X, _names = feats(corpus.steps)
    return np.asarray(X)


def alignment_features(corpus: Corpus) -> np.ndarray:
    """Goal alignment (:mod:`worldmodel.alignment`): the action's similarity to the most
    instruction-like passage the agent read and to the task, their difference (0 where
    nothing read has an instruction cue), that passage's instruction-likeness."""
    from worldmodel.alignment import goal_alignment

    enc = _encoder()
    out = goal_alignment(corpus.steps, enc)
    enc.save()
    has = np.array([bool(a.instruction.text) for a in out], dtype=float)
    return np.column_stack([[a.to_passage for a in out], [a.to_task for a in out],
                            has * [a.lean for a in out], [a.instruction.score for a in out],
                            has])


DRIFT_LAYERS = (10, 11, 12)  # what `monitor probes train-drift` chose by LODO on AgentDojo


def drift_features(corpus: Corpus) -> np.ndarray:
    """Gemma last-token deltas (with − without the newest observation), layers 10–12."""
    from monitor.scorers.drift import drift_features as feats
    from vigil.lm import load_language_model

    lm = load_language_model()
    return np.asarray(feats(corpus.steps, lm, layers=DRIFT_LAYERS,
                            cache_dir=paths.probe_cache()).columns(DRIFT_LAYERS))


def likelihood_features(corpus: Corpus) -> np.ndarray:
    """log p(action | task) − log p(action | task masked) under Gemma, and its parts."""
    from monitor.scorers.likelihood import screen_step_features

    X = np.asarray(screen_step_features(corpus.steps))
    return np.column_stack([np.nan_to_num(X), np.isnan(X).any(1)])


FEATURES: dict[str, tuple[int, Callable[[Corpus], np.ndarray], float, str]] = {
    "rules": (0, rules_features, 1.0, "L0 text rules (destructive, new recipient, marker)"),
    "provenance": (0, provenance_features, 1.0, "L0 argument provenance features"),
    "alignment": (0, alignment_features, 1.0,
                  "L0 goal alignment: the action nearer the injected passage or the task"),
    "minilm": (0, minilm_features, 0.05, "MiniLM embeddings of action and observation"),
    "drift": (1, drift_features, 0.1, "L1 task drift: Gemma hidden-state deltas"),
    "likelihood": (1, likelihood_features, 1.0, "L1 task-masked action likelihood under Gemma"),
}


def injection_families(corpus: Corpus) -> list[Family]:
    """The MIL chunk detector (``worldmodel.relational.InjectionDetector``) refitted per
    fold on the ``injected`` flags: does the newest observation (``injection_now``) or any
    earlier one the step's history shows (``injection_seen``) carry instructions?"""
    from worldmodel.features import chunks

    piece_id: dict[str, int] = {}
    obs_pieces: dict[str, list[int]] = {}

    def pieces_of(text: str) -> list[int]:
        if text not in obs_pieces:
            ids = []
            for p in chunks(text):
                ids.append(piece_id.setdefault(p, len(piece_id)))
            obs_pieces[text] = ids
        return obs_pieces[text]

    now = [pieces_of(st.step.observation.text) for st in corpus.steps]
    seen = [sorted({i for h in st.history for i in pieces_of(h.observation.text)})
            for st in corpus.steps]
    enc = _encoder()
    t0 = time.perf_counter()
    emb = enc.encode(list(piece_id))
    enc.save()
    say(f"injection: {len(piece_id)} observation pieces encoded ({TEXT_ENCODER[0]}) in "
        f"{time.perf_counter() - t0:.0f} s")

    from worldmodel.relational import InjectionDetector

    fitted: dict[bytes, InjectionDetector] = {}  # both families share one fit per set of rows

    def fit(idx: np.ndarray, c: Corpus) -> Any:
        key = hashlib.sha1(np.sort(idx).tobytes()).digest()
        if key not in fitted:
            fitted[key] = InjectionDetector().fit(emb, [now[i] for i in idx], c.injected[idx])
        return fitted[key]

    def score_now(model: Any, idx: np.ndarray) -> np.ndarray:
        return np.asarray(model.score(emb, [now[i] for i in idx]))

    def score_seen(model: Any, idx: np.ndarray) -> np.ndarray:
        s = np.asarray(model.score(emb, [seen[i] for i in idx]))
        return np.where([bool(seen[i]) for i in idx], s, -10.0)

    return [Family("injection_now", 0, fit, score_now,
                   "MIL chunk detector on the newest observation (fitted on injected flags)"),
            Family("injection_seen", 0, fit, score_seen,
                   "the same detector over the observations of the step's history")]


def tfidf_family(corpus: Corpus) -> Family:
    """The baseline: TF-IDF of task + observation + action, class-balanced LR."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    docs = np.array([f"{st.task}\n{st.step.observation.text[:2000]}\n{st.step.action.text}"
                     for st in corpus.steps], dtype=object)

    def fit(idx: np.ndarray, c: Corpus) -> Any:
        m = make_pipeline(TfidfVectorizer(min_df=2, max_features=20000, sublinear_tf=True),
                          LogisticRegression(C=4.0, class_weight="balanced", max_iter=2000))
        return m.fit(docs[idx].tolist(), c.label[idx])

    def score(model: Any, idx: np.ndarray) -> np.ndarray:
        return np.asarray(model.decision_function(docs[idx].tolist()))

    return Family("tfidf_baseline", 0, fit, score, "TF-IDF + logistic regression baseline")


# --- report ---------------------------------------------------------------------------------


def summary(lodo_res: dict[str, Any], held: dict[str, Any]) -> dict[str, Any]:
    rec = [v["stacked"]["recall_at_1pct_fpr"] for v in lodo_res.values()
           if v["stacked"]["recall_at_1pct_fpr"] is not None]
    out: dict[str, Any] = {
        "lodo_mean_recall_at_1pct_fpr_stacked": round(float(np.mean(rec)), 4) if rec else None,
        "lodo_mean_recall_at_1pct_fpr_baseline": round(float(np.mean(
            [v["baseline"]["recall_at_1pct_fpr"] for v in lodo_res.values()
             if v["baseline"]["recall_at_1pct_fpr"] is not None])), 4),
    }
    for split, v in held.items():
        out[f"{split}_stacked"] = {k: v["stacked"][k] for k in
                                   ("auroc", "recall_at_1pct_fpr", "fpr_realised")}
        out[f"{split}_baseline"] = {k: v["baseline"][k] for k in
                                    ("auroc", "recall_at_1pct_fpr", "fpr_realised")}
    return out


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = {**{f"LODO {k}": v for k, v in report["lodo"].items()}, **report["held_out"]}
    names = list(next(iter(sets.values()))["families"]) + ["baseline", "stacked"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 0.45 * len(sets) + 3))
    for ax, metric in zip(axes, ("auroc", "recall_at_1pct_fpr"), strict=True):
        y = np.arange(len(sets))
        h = 0.8 / len(names)
        for j, n in enumerate(names):
            vals = [(v["families"].get(n) or v.get(n) or {}).get(metric) for v in sets.values()]
            ax.barh(y + j * h, [x if x is not None else 0 for x in vals], h, label=n)
        ax.set_yticks(y + 0.4 - h / 2)
        ax.set_yticklabels(list(sets))
        ax.set_xlim(0, 1)
        ax.set_title(metric + " (held-out domain; threshold from the other domains)")
        ax.invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agentdojo", default=str(paths.dataset("agentdojo")))
    ap.add_argument("--toolemu", default=str(paths.dataset("toolemu")))
    ap.add_argument("--miniwob", default=str(paths.dataset("miniwob")))
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                    help=f"comma-separated, of {', '.join(ALL_FAMILIES)} (drift and likelihood "
                    "run Gemma: about a step a second on two cores)")
    ap.add_argument("--slack-limit", type=int, default=3000)
    ap.add_argument("--attacks-limit", type=int, default=3000)
    ap.add_argument("--train-limit", type=int, default=None,
                    help="keep about this many steps (whole trajectories) of train and of val")
    ap.add_argument("--toolemu-cv", type=int, default=5)
    ap.add_argument("--text-encoder", choices=["minilm", "static"], default="minilm",
                    help="the text encoder of the injection and minilm families: MiniLM, or "
                    "the static model2vec model distilled from it")
    ap.add_argument("--out", default=str(RESULTS / "transfer.json"))
    args = ap.parse_args(argv)
    TEXT_ENCODER[0] = args.text_encoder
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    from worldmodel.datasets.format import read_manifest

    datasets = [d for d in (args.agentdojo, args.toolemu, args.miniwob)
                if (Path(d) / "manifest.json").exists()]
    say(f"datasets: {datasets}")
    corpus = load_corpus(datasets, ["train", "val", "test_slack", "test_attacks"],
                         limits={"test_slack": args.slack_limit,
                                 "test_attacks": args.attacks_limit,
                                 **({"train": args.train_limit, "val": args.train_limit // 4}
                                    if args.train_limit else {})})
    train = np.flatnonzero(np.isin(corpus.split, ["train", "val"]))
    say(f"{len(corpus)} steps; {len(train)} training; domains "
        f"{sorted(set(corpus.domain[train].tolist()))}")
    families: list[Family] = []
    skipped: dict[str, str] = {}
    for name in args.families.split(","):
        if name == "injection":
            families.extend(injection_families(corpus))
            continue
        tier, fn, C, doc = FEATURES[name]
        try:
            key = name if name != "minilm" or args.text_encoder == "minilm" else "static"
            X = cached(key, corpus, functools.partial(fn, corpus))
        except ImportError as e:
            skipped[name] = f"not available: {e}"
            say(f"{name}: skipped ({e})")
            continue
        families.append(linear_family(name, tier, X, C=C, doc=doc))
    baseline = tfidf_family(corpus)

    def run(fit_rows: np.ndarray, held_rows: np.ndarray) -> dict[str, Any]:
        res = evaluate_split(families, corpus, fit_rows, held_rows, log=say)
        res["baseline"] = evaluate_split([baseline], corpus, fit_rows, held_rows)[
            "families"]["tfidf_baseline"]
        return res

    from worldmodel.datasets.domains import lodo_folds

    lodo_res: dict[str, Any] = {}
    for fold in lodo_folds(corpus.domain[train].tolist()):
        say(f"LODO: holding out {fold.domain}")
        lodo_res[fold.domain] = run(train[fold.fit], train[fold.held_out])
    held: dict[str, Any] = {}
    for split in ("test_slack", "test_attacks"):
        rows = np.flatnonzero(corpus.split == split)
        if len(rows):
            say(f"held out once: {split} ({len(rows)} steps)")
            held[split] = run(train, rows)
    toolemu: dict[str, Any] | None = None
    target = np.array([i for i in train if corpus.domain[i].startswith("toolemu")], dtype=int)
    if len(target) and args.toolemu_cv:
        say("ToolEmu: grouped-by-case cross-validation")
        toolemu = grouped_trajectory_cv(families, corpus, train, target, corpus.group,
                                        k=args.toolemu_cv, log=say)
    _ = lodo  # the library's all-in-one form; the bench adds the baseline per fold
    report = {
        "bench": "transfer",
        "command": " ".join([sys.executable, *sys.argv]),
        "data": {d: read_manifest(d).content_hash for d in datasets},
        "text_encoder": args.text_encoder,
        "protocol": (
            "leave-one-domain-out over the training domains; each family fitted on the other "
            "domains; the stack fitted on out-of-domain scores of the fit domains (inner LODO); "
            "thresholds at 1% FPR on the fit domains' benign steps (trajectories for ToolEmu); "
            "held-out splits scored once by models fitted on every training domain"),
        "families": {f.name: {"tier": f.tier, "what": f.doc} for f in families},
        "skipped": skipped,
        "steps": {s: int((corpus.split == s).sum()) for s in sorted(set(corpus.split))},
        "lodo": lodo_res,
        "held_out": held,
        "toolemu_trajectories_grouped_cv": toolemu,
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine(load0),
    }
    report["summary"] = summary(lodo_res, held)
    write_report(args.out, report)
    plot(report, Path(args.out).with_suffix(".png"))
    say(f"wrote {args.out}: {report['summary']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
