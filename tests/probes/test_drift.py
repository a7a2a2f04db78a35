"""Task drift on the real Gemma-3-270M and real AgentDojo steps (banking and travel).

A probe fitted on one suite's deltas (with − without the newest observation) must flag
the other suite's injected observations; the bundle must survive JSON; the L1 scorer must
give every step a probability; a missing bundle must say how to build one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from probes.drift import (
    BUNDLE_FILE,
    DriftBundle,
    DriftEncoder,
    DriftScorer,
    DriftTemplate,
    fit_probe,
    load_drift_data,
    train_drift,
)

# a small template and early layers (the forward pass stops at the deepest): the CPU budget
TEMPLATE = DriftTemplate(task_tokens=48, history=1, history_obs_tokens=32, action_tokens=24,
                         obs_tokens=160)
LAYERS = (4, 6)
PROBE_LAYER, C = 6, 0.01
LONG = 400  # characters: past the template's observation budget, the model sees a cut text
BANKING, TRAVEL = "agentdojo/banking", "agentdojo/travel"


@pytest.fixture(scope="module")
def lm():  # type: ignore[no-untyped-def]
    from vigil.lm import load_language_model

    return load_language_model(threads=2)


@pytest.fixture(scope="module")
def two_suites(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real AgentDojo build: banking and travel, 4 user tasks, 2 injection tasks each."""
    from worldmodel.datasets.agentdojo.build import build_agentdojo

    out = tmp_path_factory.mktemp("agentdojo-two-suites")
    build_agentdojo(out, suites=["banking", "travel"], attacks=["important_instructions"],
                    max_user_tasks=4, max_injection_tasks=2, progress=False, augment=False)
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("drift-cache")


def _auroc(y: np.ndarray, s: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, s))


def test_probe_fitted_on_one_suite_flags_the_others_injections(
    lm, two_suites: Path, cache: Path  # type: ignore[no-untyped-def]
) -> None:
    d = load_drift_data(two_suites)
    enc = DriftEncoder(lm, TEMPLATE, cache_dir=cache)
    feats = enc.features(d.steps, LAYERS)
    assert feats.delta.shape == (len(d.steps), len(LAYERS), lm.hidden_size)
    # each distinct prompt ran once: fewer than two a step, as steps share their contexts
    assert enc.stats.computed == enc.stats.prompts < 2 * len(d.steps)
    dom = np.asarray(d.domains)
    X = feats.columns([PROBE_LAYER])
    for fit, held in ((BANKING, TRAVEL), (TRAVEL, BANKING)):
        a, b = dom == fit, dom == held
        assert 0 < d.y[b].sum() < b.sum()
        s = fit_probe(X[a], d.y[a], C).decision_function(X[b])
        assert _auroc(d.y[b], s) > 0.9, f"fitted on {fit}, scored on {held}"
        # injected observations are long, so length alone ranks them well; among the long
        # observations length says little, and the probe must still tell them apart
        long = d.obs_chars[b] > LONG
        y, length = d.y[b][long], np.log1p(d.obs_chars[b][long])
        assert 0 < y.sum() < len(y)
        assert _auroc(y, s[long]) > _auroc(y, length) + 0.15, f"{held}: no better than length"

    # a second pass reads every prompt from the cache and gives the same deltas
    again = DriftEncoder(lm, TEMPLATE, cache_dir=cache)
    np.testing.assert_array_equal(again.features(d.steps, LAYERS).delta, feats.delta)
    assert again.stats.computed == 0


def test_bundle_round_trips_and_scores_steps_as_trained(
    lm, two_suites: Path, cache: Path, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    from monitor.calibrate import screen_step_of_transition
    from monitor.scorers.drift import DriftSignals, drift_features
    from worldmodel.datasets.format import read_transitions

    bundle = train_drift(lm, two_suites, tmp_path / "drift", template=TEMPLATE, layers=LAYERS,
                         Cs=(0.01, 0.1), cache_dir=cache, log=lambda _: None)
    text = (tmp_path / "drift" / BUNDLE_FILE).read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the bundle"))  # strict JSON
    loaded = DriftBundle.load(tmp_path / "drift")
    assert loaded == bundle
    assert set(loaded.layers) <= set(LAYERS) and loaded.model_hash == lm.model_hash
    assert set(loaded.lodo["auroc_by_domain"]) == {BANKING, TRAVEL}

    rows = list(read_transitions(two_suites, ["train", "val"]))
    steps = [screen_step_of_transition(t) for t in rows]
    y = np.array([t.injected for t in rows])
    signals = DriftSignals(DriftScorer.load(tmp_path / "drift", lm=lm, cache_dir=cache))
    out = signals.score_steps(steps)
    assert len(out) == len(steps)
    p = np.array([o["drift_task"] for o in out])
    assert ((p >= 0) & (p <= 1)).all()
    assert _auroc(y, p) > 0.9  # in-domain: the steps it was fitted on
    # the bench's raw features of the same ScreenSteps are what the bundle scores
    feats = drift_features(steps, lm, layers=loaded.layers, template=TEMPLATE, cache_dir=cache)
    np.testing.assert_allclose(loaded.probability(feats.columns(loaded.layers)), p, atol=1e-6)


def test_missing_bundle_names_the_folder_and_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monitor.scorers.drift import DriftSignals

    monkeypatch.setenv("VIGIL_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        DriftSignals.load({})
    assert str(tmp_path / "models" / "drift") in str(e.value)
    assert "monitor probes train-drift" in str(e.value)
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        DriftSignals.load({"drift": tmp_path / "elsewhere"})
