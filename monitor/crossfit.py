"""Cross-fitting: gates stacked and thresholded on out-of-domain scores (leave-one-domain-out).

A gate weighs its signals by a logistic regression fitted on calibration steps. When those
steps are scored by models trained on the same domains, a signal that has learnt the
training tools (the world model's harm head does) looks near-perfect there, takes the
weight, and fails on the tools of a new deployment. Cross-fitting scores every calibration
step with *fold* models that never saw its domain: for each training domain, each trained
model (world model, argument provenance, activation probe, L1's truncated judge) is
refitted on every other domain. :func:`monitor.calibrate.calibrate` then fits each gate's
weights and sets its thresholds on those out-of-domain scores (what a user's unseen tools
look like to the models), while the policy it writes runs the full models.

Fold bundles live under ``<root>/<domain>/<bundle>`` (``root`` defaults to
``$VIGIL_HOME/models/folds``); a fold reuses the full bundle of a model whose training data
never held its domain (the probe never sees MiniWoB++, so the MiniWoB++ fold keeps it).
:func:`train_folds` trains what is missing, with progress; :func:`fold_models` reads what is
there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.judge_recipe import JudgeRecipe

Log = Callable[[str], None]

BUNDLES = ("worldmodel", "provenance", "probes", "judge_fast")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fold_dir(root: str | Path, domain: str) -> Path:
    """The folder of ``domain``'s fold (``agentdojo/banking`` -> ``agentdojo-banking``)."""
    return Path(root) / domain.replace("/", "-")


def bundle_built(folder: Path, bundle: str) -> bool:
    """Whether ``folder`` holds a ``bundle`` (one of :data:`BUNDLES`) in its current format; a
    bundle from before the pickle-free formats does not count, so it is trained again."""
    from probes.bundle import ARRAYS_FILE
    from worldmodel.provenance import BUNDLE_FILE
    from worldmodel.score import WEIGHTS_FILE

    marker = {"worldmodel": WEIGHTS_FILE, "provenance": BUNDLE_FILE, "probes": ARRAYS_FILE,
              "judge_fast": "judge.json"}
    return (folder / marker[bundle]).exists()


def domains_of(datasets: Sequence[str | Path], splits: Sequence[str] = ("train", "val")
               ) -> dict[str, set[str]]:
    """For each dataset, the domains its ``splits`` hold."""
    from worldmodel.datasets.domains import domain_of
    from worldmodel.datasets.format import read_transitions

    return {str(d): {domain_of(t) for t in read_transitions(d, list(splits))} for d in datasets}


@dataclass(frozen=True)
class FoldSpec:
    """The full models, and what of their training their bundles do not record, so that each
    fold is trained the same way less one domain. A bundle not named in ``models`` is not
    cross-fitted. The world model's folds repeat the full bundle's own training config
    (``config.json``: data, epochs, architecture, text cache)."""

    models: Mapping[str, str]  # bundle name -> the full bundle's folder
    provenance_data: str | None = None  # the dataset argument provenance was fitted on
    probes_data: str | None = None  # the dataset the probe was trained on
    probe_layers: Sequence[int] = (6,)
    probe_train_limit: int | None = None
    probe_cache: str | None = None
    judge_data: Sequence[str] = ()  # the datasets L1's truncated judge learnt from
    judge_recipe: JudgeRecipe | None = None  # and how


def fold_models(spec: FoldSpec, domains: Sequence[str], root: str | Path
                ) -> dict[str, dict[str, str]]:
    """Per domain, the bundle folders its fold scores with: the fold's own where one was
    trained, else the full model's."""
    out: dict[str, dict[str, str]] = {}
    for d in domains:
        folder = fold_dir(root, d)
        out[d] = {
            name: str(folder / name) if bundle_built(folder / name, name) else str(full)
            for name, full in spec.models.items()
        }
    return out


def train_folds(
    spec: FoldSpec,
    domains: Sequence[str],
    root: str | Path,
    *,
    log: Log = _stderr,
) -> dict[str, dict[str, str]]:
    """Train each domain's fold models that are missing under ``root``; returns
    :func:`fold_models`. A model is refitted for a domain only where its training data
    holds that domain."""
    held: dict[str, set[str]] = {}
    wanted = {
        "worldmodel": list(_worldmodel_config(spec).data) if "worldmodel" in spec.models else [],
        "provenance": [spec.provenance_data] if spec.provenance_data else [],
        "probes": [spec.probes_data] if spec.probes_data else [],
        "judge_fast": list(spec.judge_data) if spec.judge_recipe is not None else [],
    }
    by_data = domains_of(sorted({d for v in wanted.values() for d in v}))
    for name, data in wanted.items():
        held[name] = set().union(*(by_data[str(d)] for d in data)) if data else set()
    t0 = time.perf_counter()
    probe_model: list[Any] = []  # loaded once, on first need
    todo = [(d, name) for d in domains for name in BUNDLES
            if name in spec.models and d in held[name]
            and not bundle_built(fold_dir(root, d) / name, name)]
    if todo:
        log(f"cross-fit: training {len(todo)} fold models for {len(domains)} domains under "
            f"{root} (each leaves its domain out)")
    for n, (d, name) in enumerate(todo, 1):
        out = fold_dir(root, d) / name
        t1 = time.perf_counter()
        log(f"cross-fit [{n}/{len(todo)}]: {name} without {d}")
        if name == "worldmodel":
            _train_worldmodel(spec, d, out, log)
        elif name == "provenance":
            _train_provenance(spec, d, out)
        elif name == "judge_fast":
            from monitor.reviewer.train import train_recipe

            train_recipe(spec.judge_recipe, list(spec.judge_data), out, exclude_domains=(d,),
                         log=_lines_with(log, "judge: "))
        else:
            _train_probe(spec, d, out, probe_model, log)
        done = time.perf_counter() - t0
        log(f"cross-fit [{n}/{len(todo)}]: {name} without {d} in "
            f"{time.perf_counter() - t1:.0f} s (ETA {done / n * (len(todo) - n):.0f} s)")
    return fold_models(spec, domains, root)


def _worldmodel_config(spec: FoldSpec) -> Any:
    """The full world model's training config (its bundle's ``config.json``)."""
    import json
    from dataclasses import fields

    from worldmodel.model import JEPAConfig
    from worldmodel.train import TrainConfig

    d = json.loads((Path(spec.models["worldmodel"]) / "config.json").read_text())
    known = {f.name for f in fields(TrainConfig)} - {"model"}
    return TrainConfig(**{k: v for k, v in d.items() if k in known},
                       model=JEPAConfig.from_dict(d["model"]))


def _train_worldmodel(spec: FoldSpec, domain: str, out: Path, log: Log) -> None:
    from dataclasses import replace

    from worldmodel.train import train

    cfg = _worldmodel_config(spec)
    train(replace(cfg, out=str(out), exclude_domains=(domain,)), log=_lines_with(log, "epoch"))


def _lines_with(log: Log, keep: str) -> Log:
    """``log`` for lines that mention ``keep`` (a fold's training is one of several)."""
    return lambda msg: log(f"  {msg}") if keep in msg else None


def _train_provenance(spec: FoldSpec, domain: str, out: Path) -> None:
    """The full bundle's chosen model (C and features, picked by LODO) refitted without
    ``domain``."""
    import numpy as np

    from worldmodel.datasets.domains import domain_of
    from worldmodel.datasets.format import read_transitions
    from worldmodel.provenance import (
        ProvenanceHarm,
        load_bundle,
        provenance_features,
        save_bundle,
    )

    assert spec.provenance_data is not None
    full = load_bundle(spec.models["provenance"])
    ts = [t for t in read_transitions(spec.provenance_data, ["train", "val"])
          if domain_of(t) != domain]
    x, _ = provenance_features(ts)
    y = np.array([t.label for t in ts], dtype=int)
    feats = tuple(full.features) if full.features else None
    model = ProvenanceHarm(C=full.C, features=feats).fit(x, y)
    save_bundle(model, out, {"C": model.C, "features": list(feats or ()),
                             "note": f"cross-fitting fold without {domain}"})


def _train_probe(spec: FoldSpec, domain: str, out: Path, loaded: list[Any], log: Log) -> None:
    from probes.models import load_probe_model
    from probes.pipeline import train_probe

    assert spec.probes_data is not None
    if not loaded:
        loaded.append(load_probe_model(log=log))
    train_probe(
        loaded[0],
        spec.probes_data,
        out,
        layers=list(spec.probe_layers),
        cache_dir=spec.probe_cache,
        train_limit=spec.probe_train_limit,
        exclude_domains=(domain,),
        log=_lines_with(log, "wrote"),
    )


def share_probe_model(l1_sets: Sequence[Sequence[Any]]) -> None:
    """Let every activation probe of ``l1_sets`` (the full L1 scorers and each fold's) run
    on one loaded language model where they name the same one (a fold's probe differs only
    in its weights), instead of loading it once per fold."""
    from monitor.scorers.probes import ProbeSignals
    from probes.models import load_probe_model

    scorers = [s.scorer for ss in l1_sets for s in ss if isinstance(s, ProbeSignals)]
    local = [s for s in scorers if s.info.source not in ("records", "endpoint")]
    if len(local) < 2:
        return
    info = local[0].info
    path = local[0].model_path or info.model_path or None
    if path and not Path(path).exists():
        path = None
    model = load_probe_model(path, dtype=info.dtype)
    for s in local:
        if s.model is None and s.info.model_hash == model.model_hash:
            s.model = model
