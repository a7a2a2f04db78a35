"""Cross-fitting (monitor.crossfit): each calibration step is scored by models that never saw
its domain, on real AgentDojo data with real (tiny) world models and provenance fits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.calibrate import calibrate, load_split
from monitor.crossfit import FoldSpec, domains_of, fold_dir, train_folds
from monitor.pipeline import build_parts
from monitor.screening import ScreenStep
from monitor.tiers import policy_config_from_dict
from worldmodel.datasets.domains import domain_of_id

SMALL_WM = {"latent_dim": 32, "hidden_dim": 64, "history": 2, "predictor_layers": 1,
            "predictor_heads": 2, "use_images": False}


@pytest.fixture(scope="module")
def two_suites(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real AgentDojo training suites (two domains), small."""
    from worldmodel.datasets.agentdojo.build import build_agentdojo

    out = tmp_path_factory.mktemp("agentdojo-two")
    build_agentdojo(out, suites=["banking", "travel"], attacks=["important_instructions"],
                    max_user_tasks=5, max_injection_tasks=2, progress=False)
    return out


@pytest.fixture(scope="module")
def full_and_folds(two_suites: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> tuple[dict[str, str], dict[str, dict[str, str]], list[str], list[str]]:
    from monitor.defaults import train_default_provenance
    from worldmodel.model import JEPAConfig
    from worldmodel.train import TrainConfig, train

    root = tmp_path_factory.mktemp("models")
    cache = str(root / "text-cache")
    train(TrainConfig(data=[str(two_suites)], out=str(root / "wm"), epochs=3, batch_size=32,
                      text_cache=cache, model=JEPAConfig.from_dict(dict(SMALL_WM))),
          log=lambda _: None)
    train_default_provenance(two_suites, root / "prov", log=lambda _: None)
    models = {"worldmodel": str(root / "wm"), "provenance": str(root / "prov")}
    spec = FoldSpec(models=models, provenance_data=str(two_suites))
    domains = sorted(domains_of([two_suites])[str(two_suites)])
    lines: list[str] = []
    folds = train_folds(spec, domains, root / "folds", log=lines.append)
    return models, folds, domains, lines


def test_each_fold_is_trained_without_its_domain(
    two_suites: Path, full_and_folds: tuple[Any, ...], tmp_path: Path
) -> None:
    models, folds, domains, lines = full_and_folds
    assert domains == ["agentdojo/banking", "agentdojo/travel"]
    for d in domains:
        wm = Path(folds[d]["worldmodel"])
        assert wm.parent == fold_dir(Path(wm).parent.parent, d)
        cfg = json.loads((wm / "config.json").read_text())
        assert cfg["exclude_domains"] == [d]
        full = json.loads((Path(models["worldmodel"]) / "config.json").read_text())
        # the same training but for the data (the harm class weight follows its balance)
        same = {k: v for k, v in full["model"].items() if k != "harm_pos_weight"}
        assert {k: cfg["model"][k] for k in same} == same and cfg["epochs"] == full["epochs"]
        prov = json.loads((Path(folds[d]["provenance"]) / "provenance.json").read_text())
        assert d in prov["lodo"]["note"]
    # progress: one line per fold model, with a count and an ETA
    starts = [x for x in lines if x.startswith("cross-fit [") and " in " in x]
    assert len(starts) == 4 and all("ETA" in x for x in starts)
    # a second call finds every fold built and trains nothing
    again: list[str] = []
    spec_root = Path(folds[domains[0]]["worldmodel"]).parent.parent
    spec = FoldSpec(models=models, provenance_data=str(two_suites))
    assert train_folds(spec, domains, spec_root, log=again.append) == folds
    assert again == []


class _Recording:
    """A real scorer, noting the domain of every step it scores."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.domains: list[str] = []

    def score_steps(self, steps: Sequence[ScreenStep]) -> list[dict[str, float]]:
        self.domains += [domain_of_id(s.trajectory_id) for s in steps]
        return self.inner.score_steps(steps)  # type: ignore[no-any-return]


def test_calibration_scores_every_step_out_of_domain(
    two_suites: Path, full_and_folds: tuple[Any, ...]
) -> None:
    models, folds, domains, _ = full_and_folds
    config = policy_config_from_dict({"tiers": {
        "L0": {"budget": 0.3, "signals": ["wm_harm_pre", "wm_harm_post", "prov_harm"]},
        "L1": {"budget": 0.1, "signals": []}, "L2": {"budget": 0.05, "signals": []}}})
    full0, full1, _ = build_parts(config, models=models, reviewer=False)
    full = [_Recording(s) for s in full0]
    fold_parts: dict[str, tuple[Any, Any]] = {}
    for d in domains:
        f0, f1, _ = build_parts(config, models={**models, **folds[d]}, reviewer=False)
        fold_parts[d] = ([_Recording(s) for s in f0], f1)
    train, val = load_split([two_suites], "train"), load_split([two_suites], "val")
    logs: list[str] = []
    policy = calibrate(config, (full, full1, None), train, val,  # type: ignore[arg-type]
                       folds=fold_parts, log=logs.append)
    assert all(not s.domains for s in full)  # the full models scored nothing
    for d, (f0, _) in fold_parts.items():
        for s in f0:
            assert s.domains and set(s.domains) == {d}
    scored = sum(len(f0[0].domains) for f0, _ in fold_parts.values())
    assert scored == len(train.steps) + len(val.steps)  # every step once, by its own fold
    assert policy.metrics["cross_fit"]["domains"] == domains
    assert any("cross-fitting over 2 domain folds" in x for x in logs)
    # how far every val step gets (no review needed): each held-out domain's own figures,
    # adding up to the whole
    per, whole = policy.metrics["val_reach_by_domain"], policy.metrics["val_reach"]
    assert sorted(per) == sorted(set(val.domains)) and whole["steps"] == len(val.steps)
    assert sum(m["steps"] for m in per.values()) == whole["steps"]
    assert sum(m["recall_L1"] * m["harmful"] for m in per.values()) == pytest.approx(
        whole["recall_L1"] * whole["harmful"])
    # and with L0's threshold at each domain's own benign quantile (what --adapt settles on
    # for that traffic): the budget's share of its benign steps, and the harmful share reached
    adapted = policy.metrics["val_reach_adapted_by_domain"]
    assert adapted and set(adapted) <= set(per)
    for m in adapted.values():
        assert abs(m["benign_share"] - 0.3) < 0.1 and 0.0 <= m["harmful_reach"] <= 1.0

    # the gate is thresholded on out-of-domain scores: its benign share on them is the budget
    rows = []
    for d, (f0, _) in fold_parts.items():
        idx = [i for i, x in enumerate(val.domains) if x == d]
        for i, r in zip(idx, f0[0].inner.score_steps([val.steps[i] for i in idx]), strict=True):
            rows.append((i, {**r, **f0[1].inner.score_steps([val.steps[i]])[0]}))
    rows.sort(key=lambda t: t[0])
    p = policy.gates[0].probability([r for _, r in rows])
    benign = p[val.y == 0]
    assert abs(float(np.mean(benign >= policy.gates[0].threshold)) - 0.3) < 0.05


def test_l1_truncated_judge_is_cross_fitted_and_weighed_out_of_domain(
    two_suites: Path, full_and_folds: tuple[Any, ...], tmp_path: Path
) -> None:
    """L1's truncated judge (``judge_fast``) gets a fold per domain like the other models,
    trained by the same recipe less that domain, and the L1 gate weighs it on the scores
    of the fold that never saw a step's domain."""
    from monitor.defaults import with_fast_judge
    from monitor.judge_recipe import JudgeRecipe
    from monitor.reviewer.train import train_recipe

    models, _, domains, _ = full_and_folds
    # the default recipe's shape, small (no evidence: its encoders are not what is tested)
    recipe = JudgeRecipe(method="full", evidence=0, max_chars=200, epochs=1.0, max_examples=4,
                         eval_examples=2, freeze_embeddings=True, layers=1, lr=1e-4)
    full_fast = train_recipe(recipe, [str(two_suites)], tmp_path / "judge_fast",
                             log=lambda _: None)
    spec = FoldSpec(models={**models, "judge_fast": str(full_fast)},
                    provenance_data=str(two_suites), judge_data=(str(two_suites),),
                    judge_recipe=recipe)
    root = Path(full_and_folds[1][domains[0]]["worldmodel"]).parent.parent
    lines: list[str] = []
    folds = train_folds(spec, domains, root, log=lines.append)
    # the world model and provenance folds were there: only the two judges are trained
    assert sum(x.startswith("cross-fit [") and " in " in x for x in lines) == 2
    for d in domains:
        info = json.loads((Path(folds[d]["judge_fast"]) / "judge.json").read_text())
        assert info["config"]["exclude_domains"] == [d]
        assert info["config"]["layers"] == 1 and info["config"]["lr"] == 1e-4

    config = with_fast_judge(policy_config_from_dict({"tiers": {
        "L0": {"budget": 0.5, "signals": ["wm_harm_pre", "prov_harm"]},
        "L1": {"budget": 0.2, "signals": []}, "L2": {"budget": 0.05, "signals": []}}}),
        full_fast)
    assert config.tiers[1].signals == ("judge_fast",)
    assert config.tiers[1].models["judge_fast"] == str(full_fast)
    fold_parts = {d: build_parts(config, models={**models, **folds[d]}, reviewer=False)[:2]
                  for d in domains}
    f1 = {d: _Recording(parts[1][0]) for d, parts in fold_parts.items()}
    fold_parts = {d: (parts[0], [f1[d]]) for d, parts in fold_parts.items()}
    full0, full1, _ = build_parts(config, models={**models, "judge_fast": str(full_fast)},
                                  reviewer=False)
    train, val = load_split([two_suites], "train"), load_split([two_suites], "val")
    policy = calibrate(config, (full0, full1, None), train, val,  # type: ignore[arg-type]
                       folds=fold_parts, log=lambda _: None)
    for d in domains:  # every step the fold's judge read was of its own held-out domain
        assert f1[d].domains and set(f1[d].domains) == {d}
    assert "judge_fast" in policy.gates[1].signals
