"""The embedded defaults: datasets, model bundles and the calibrated policy, made on first use.

Everything lives under ``$VIGIL_HOME`` (the layout is :mod:`vigil.paths`): the corpus
(AgentDojo with its renamed-tool and paraphrased-injection variants, ToolEmu, and for the
full defaults MiniWoB++, OpenAgentSafety and StepShield), the L0 world-model and
argument-provenance bundles, the L1 probe bundle, the L2 judge (Gemma-3-270M fine-tuned as
a safe/unsafe judge: :mod:`monitor.reviewer.judge`, by the recipe of
:mod:`monitor.judge_recipe`, unless a judge bundle is there) and the calibrated tier policy
that joins them.

:func:`prepare_defaults` builds whatever is missing, in that order, printing
what it does; what exists is loaded, never rebuilt. ``small=True`` trains
smaller models on fewer steps without MiniWoB++ (``make demo``; minutes instead of twenty).
Only the ``train`` and ``val`` splits are fitted on. :func:`ensure_policy` is what the
commands call: the policy they were given, or the default one, built on first use.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import vigil.paths
from monitor.judge_recipe import CORPORA, FAST_JUDGE, JUDGE, SMALL_JUDGE, JudgeRecipe
from monitor.tiers import PolicyConfig, default_policy_config

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DefaultSizes:
    wm_epochs: int
    probe_layers: tuple[int, ...]
    probe_train_limit: int
    calibrate_train_limit: int
    review_limit: int  # at most this many training steps are reviewed to fit the L2 gate
    miniwob: bool = True  # record MiniWoB++ (headless Chromium, ~3 min) for the corpus
    # fit and threshold the gates on out-of-domain scores (monitor.crossfit): one fold of
    # each trained model per step-labelled training domain
    cross_fit: bool = True
    # how the L2 judge is trained when no judge bundle exists (None: no judge; the reviewer
    # is then the base model on the rubrics alone)
    judge: JudgeRecipe | None = JUDGE
    # how L1's truncated judge (``judge_fast``) is trained when no bundle exists, and then
    # cross-fitted like the other models (None: L1 runs the probe alone)
    fast_judge: JudgeRecipe | None = FAST_JUDGE
    # the corpora the world model and the judge learn from (those built)
    corpora: tuple[str, ...] = CORPORA


FULL = DefaultSizes(8, (6, 9, 12), 1200, 1200, 60)
SMALL = DefaultSizes(3, (6,), 300, 400, 20, miniwob=False, cross_fit=False, judge=SMALL_JUDGE,
                     fast_judge=None, corpora=("agentdojo", "toolemu"))


def with_judge(config: PolicyConfig, judge: str | Path) -> PolicyConfig:
    """``config`` with its L2 reviewer on the judge bundle ``judge`` and ``judge_unsafe``
    among the L2 signals (the calibrated stacking weighs it against the rubric signals)."""
    from monitor.reviewer.verdict import ReviewVerdict

    l2 = config.tiers[2]
    signals = l2.signals if ReviewVerdict.JUDGE_SIGNAL in l2.signals else (
        *l2.signals, ReviewVerdict.JUDGE_SIGNAL)
    reviewer = {**(l2.reviewer or {"backend": "local"}), "model_path": str(judge)}
    tiers = (config.tiers[0], config.tiers[1], replace(l2, signals=signals, reviewer=reviewer))
    return replace(config, tiers=tiers)


def with_fast_judge(config: PolicyConfig, judge: str | Path) -> PolicyConfig:
    """``config`` with L1 also asking the truncated judge bundle ``judge`` (the signal
    ``judge_fast``, weighed by the calibrated L1 gate against the probe and L0's signals)."""
    l1 = config.tiers[1]
    signals = l1.signals if "judge_fast" in l1.signals else (*l1.signals, "judge_fast")
    models = {**(l1.models or {}), "judge_fast": str(judge)}
    return replace(config, tiers=(config.tiers[0], replace(l1, signals=signals, models=models),
                                  config.tiers[2]))


def ensure_judge(data: list[str], sizes: DefaultSizes, *, fast: bool = False,
                 log: Log = _stderr) -> Path | None:
    """The default judge bundle (``$VIGIL_HOME/models/judge``, with ``fast`` L1's truncated
    one, ``models/judge_fast``): the one there, else one trained now by ``sizes.judge``'s (or
    ``sizes.fast_judge``'s) recipe; None when ``sizes`` asks for no such judge."""
    from monitor.reviewer.judge import is_judge_bundle

    path = vigil.paths.bundle("judge_fast" if fast else "judge")
    if is_judge_bundle(path):
        return path
    recipe = sizes.fast_judge if fast else sizes.judge
    if recipe is None:
        return None
    what = f"L1 judge (first {recipe.layers} blocks)" if fast else "L2 judge"
    log(f"vigil: fine-tuning the {what} ({recipe.method}, {recipe.max_examples} examples, "
        f"{recipe.epochs:g} epochs) -> {path}; a bundle there, from `monitor reviewer train`, "
        "is used as it is")
    from monitor.reviewer.train import train_recipe

    return train_recipe(recipe, data, path, log=log)


def ensure_policy(policy: str | Path | None = None, *, log: Log = _stderr) -> Path:
    """``policy`` if given; else ``$VIGIL_HOME/models/policy.json`` where one was built or
    calibrated; else the policy shipped with vigil (``make models``; no training); else the
    default policy, prepared first (with progress; minutes, once)."""
    if policy:
        return Path(policy).expanduser()
    path = vigil.paths.policy()
    if path.exists():
        return path
    from monitor.shipped import shipped_policy

    shipped = shipped_policy()
    if shipped is not None:
        return shipped
    prepare_defaults(log=log)
    return path


def prepare_defaults(
    *,
    small: bool = False,
    config: PolicyConfig | None = None,
    log: Log = _stderr,
) -> Path:
    """Build what is missing of the default data, models and policy; return the policy path."""
    paths = {
        "agentdojo": vigil.paths.dataset("agentdojo"),
        "toolemu": vigil.paths.dataset("toolemu"),
        "miniwob": vigil.paths.dataset("miniwob"),
        "openagentsafety": vigil.paths.dataset("openagentsafety"),
        "stepshield": vigil.paths.dataset("stepshield"),
        "worldmodel": vigil.paths.worldmodel_bundle(),
        "probes": vigil.paths.probes_bundle(),
        "provenance": vigil.paths.bundle("provenance"),
        "policy": vigil.paths.policy(),
        "text_cache": vigil.paths.text_cache(),
        "probe_cache": vigil.paths.probe_cache(),
    }
    sizes = SMALL if small else FULL
    t0 = time.perf_counter()
    if paths["policy"].exists():
        return paths["policy"]
    log(
        "vigil: preparing the default models under "
        f"{paths['policy'].parent.parent} (once; {'a few' if small else 'about twenty'} minutes)"
    )
    _ensure_datasets(paths, sizes, log)
    # the world model and the judge learn from every corpus: AgentDojo (step labels),
    # MiniWoB++ (GUI, step labels), ToolEmu and OpenAgentSafety (trajectory labels, by
    # multiple-instance learning) and StepShield (step labels up to the first rogue step)
    datasets = [str(paths[n]) for n in sizes.corpora if (paths[n] / "manifest.json").exists()]
    from monitor.crossfit import BUNDLES, bundle_built

    folds_root = vigil.paths.models_dir() / "folds"
    paths["judge_fast"] = vigil.paths.bundle("judge_fast")
    trained = [n for n in BUNDLES if n != "judge_fast" or sizes.fast_judge is not None]
    if not all(bundle_built(paths[n], n) for n in trained):
        import shutil

        shutil.rmtree(folds_root, ignore_errors=True)  # folds of models about to be replaced
    if not bundle_built(paths["worldmodel"], "worldmodel"):
        from worldmodel.train import TrainConfig, train

        log(f"vigil: training the world model on {', '.join(datasets)} -> {paths['worldmodel']}")
        train(
            TrainConfig(
                data=datasets,
                out=str(paths["worldmodel"]),
                epochs=sizes.wm_epochs,
                text_cache=str(paths["text_cache"]),
            ),
            log=log,
        )
    if not bundle_built(paths["provenance"], "provenance"):
        train_default_provenance(paths["agentdojo"], paths["provenance"], log=log)
    if not bundle_built(paths["probes"], "probes"):
        from probes.models import load_probe_model
        from probes.pipeline import train_probe

        log(f"vigil: training the activation probe -> {paths['probes']}")
        train_probe(
            load_probe_model(log=log),
            paths["agentdojo"],
            paths["probes"],
            layers=list(sizes.probe_layers),
            cache_dir=paths["probe_cache"],
            train_limit=sizes.probe_train_limit,
            log=log,
        )
    # the gates stack step-labelled data only: a ToolEmu step carries its trajectory's label
    step_labelled = [str(paths[n]) for n in ("agentdojo", "miniwob")
                     if (paths[n] / "manifest.json").exists()]
    models = {"worldmodel": str(paths["worldmodel"]), "probes": str(paths["probes"]),
              "provenance": str(paths["provenance"])}
    config = config or default_policy_config()
    fast = ensure_judge(datasets, sizes, fast=True, log=log) if config.tiers[1].signals else None
    if fast is not None:
        config = with_fast_judge(config, fast)
        models["judge_fast"] = str(fast)
    folds = None
    if sizes.cross_fit:
        from monitor.crossfit import FoldSpec, domains_of, train_folds

        spec = FoldSpec(
            models=models,
            provenance_data=str(paths["agentdojo"]),
            probes_data=str(paths["agentdojo"]),
            probe_layers=sizes.probe_layers,
            probe_train_limit=sizes.probe_train_limit,
            probe_cache=str(paths["probe_cache"]),
            judge_data=tuple(datasets) if fast is not None else (),
            judge_recipe=sizes.fast_judge if fast is not None else None,
        )
        domains = sorted(set().union(*domains_of(step_labelled).values()))
        folds = train_folds(spec, domains, folds_root, log=log)
    judge = ensure_judge(datasets, sizes, log=log) if config.tiers[2].reviewer else None
    if judge is not None:
        config = with_judge(config, judge)
    calibrate_default(
        config,
        step_labelled,
        paths["policy"],
        models=models,
        sizes=sizes,
        folds=folds,
        log=log,
    )
    log(f"vigil: defaults ready in {time.perf_counter() - t0:.0f} s ({paths['policy']})")
    return paths["policy"]


def _ensure_datasets(paths: dict[str, Path], sizes: DefaultSizes, log: Log) -> None:
    """Build the default corpus where missing: AgentDojo (~2 min), ToolEmu (seconds, from the
    shipped file when it is there) and, for the full defaults, MiniWoB++ (~3 min, headless
    Chromium), OpenAgentSafety and StepShield (seconds each, from their files)."""
    if not (paths["agentdojo"] / "manifest.json").exists():
        from worldmodel.datasets.agentdojo.build import build_agentdojo

        log(f"vigil: building AgentDojo transitions -> {paths['agentdojo']} (~2 min)")
        build_agentdojo(paths["agentdojo"])
    _ensure_interchange(paths, "toolemu", "ToolEmu", sizes, log)
    if sizes.miniwob and not (paths["miniwob"] / "manifest.json").exists():
        from worldmodel.datasets.miniwob.build import build_miniwob

        log(f"vigil: recording MiniWoB++ episodes in headless Chromium -> {paths['miniwob']} "
            "(~3 min)")
        build_miniwob(paths["miniwob"])
    _ensure_interchange(paths, "openagentsafety", "OpenAgentSafety", sizes, log)
    _ensure_interchange(paths, "stepshield", "StepShield", sizes, log)


def _ensure_interchange(paths: dict[str, Path], name: str, title: str, sizes: DefaultSizes,
                        log: Log) -> None:
    """Build the ``name`` corpus from its interchange file where it is missing (seconds);
    without the file, say so and train without it (ToolEmu, OpenAgentSafety and StepShield
    come as files under ``../shared/data/``)."""
    import importlib

    if (paths[name] / "manifest.json").exists() or name not in sizes.corpora:
        return
    module = importlib.import_module(f"worldmodel.datasets.{name}.build")
    source = module.default_source()
    if not source.exists():
        log(f"vigil: no {title} file at {source} (set ${module.SOURCE_ENV}); training "
            "without it")
        return
    log(f"vigil: building {title} transitions -> {paths[name]}")
    getattr(module, f"build_{name}")(paths[name], progress=False)


def train_default_provenance(data: Path, out: Path, *, log: Log = _stderr) -> Path:
    """Fit the argument-provenance harm model on the training splits of ``data`` (features
    and C chosen by leave-one-suite-out) and write its bundle to ``out``."""
    import numpy as np

    from worldmodel.datasets.domains import domain_of
    from worldmodel.datasets.format import read_transitions
    from worldmodel.provenance import (
        ProvenanceHarm,
        fit_lodo,
        provenance_features,
        save_bundle,
    )

    ts = list(read_transitions(data, ["train", "val"]))
    x, _ = provenance_features(ts)
    y = np.array([t.label for t in ts], dtype=int)
    domains = [domain_of(t) for t in ts]
    log(f"vigil: fitting argument provenance on {len(ts)} steps -> {out}")
    if len(set(domains)) < 2:  # nothing to leave out: the documented default model
        model = ProvenanceHarm(C=0.1).fit(x, y)
        return save_bundle(model, out, {"C": 0.1, "note": f"one domain {set(domains)}: no LODO"})
    model, report = fit_lodo(x, y, domains, log=lambda _: None)
    return save_bundle(model, out, report)


def calibrate_default(
    config: PolicyConfig,
    datasets: list[str],
    out: Path,
    *,
    models: dict[str, str],
    sizes: DefaultSizes = FULL,
    reviewer: bool = True,
    folds: dict[str, dict[str, str]] | None = None,
    log: Log = _stderr,
) -> Path:
    """Calibrate ``config`` with the given model bundles on ``datasets`` and save it to
    ``out``; with ``folds`` (per domain, its fold's bundle folders: :mod:`monitor.crossfit`),
    on out-of-domain scores."""
    from monitor.calibrate import calibrate, load_split
    from monitor.pipeline import build_parts

    parts = build_parts(config, models=models, reviewer=reviewer, log=log)
    fold_parts = None
    if folds:
        from monitor.crossfit import share_probe_model

        fold_parts = {}
        for d, fm in folds.items():
            f0, f1, _ = build_parts(config, models={**models, **fm}, reviewer=False, log=log)
            fold_parts[d] = (f0, f1)
        share_probe_model([parts[1], *(f1 for _, f1 in fold_parts.values())])
    train = load_split(datasets, "train", limit=sizes.calibrate_train_limit)
    val = load_split(datasets, "val")
    policy = calibrate(
        config,
        parts,
        train,
        val,
        data={"datasets": datasets, "models": models,
              **({"folds": folds} if folds else {})},
        review_limit=sizes.review_limit,
        folds=fold_parts,
        log=log,
    )
    return policy.save(out)


def ensure_default_canaries(log: Log = _stderr) -> Path:
    """The default canary set (``$VIGIL_HOME/data/canaries.jsonl``), built from the training
    split of the default AgentDojo data on first use."""
    from dashboards.canary import build_canary_set

    path = vigil.paths.canaries()
    if not path.exists():
        src = vigil.paths.dataset("agentdojo")
        if not (src / "manifest.json").exists():
            from worldmodel.datasets.agentdojo.build import build_agentdojo

            log(f"vigil: building AgentDojo transitions -> {src} (~2 min)")
            build_agentdojo(src)
        n = build_canary_set([src], path)
        log(f"vigil: built {n} canaries from the training split -> {path}")
    return path
