"""A bundle round trip gives identical scores and holds nothing that runs code when loaded;
record-attached activations are used as is."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probes.bundle import BundleInfo, ProbeScorer, load_bundle, save_bundle
from probes.capture import ProbeStep, Template
from probes.estimators import DiffMeansProbe, LogisticProbe
from worldmodel.datasets.format import Transition, View


def info(threshold: float = 0.5) -> BundleInfo:
    t = Template()
    return BundleInfo(
        layer=6,
        pooling="last",
        template=t.to_dict(),
        template_hash=t.hash,
        model_id="policy-7b",
        model_hash="abc123",
        model_path="",
        threshold=threshold,
        target_fpr=0.01,
        estimator="LogisticProbe()",
    )


def steps_with(X: np.ndarray, model: str = "policy-7b") -> list[ProbeStep]:
    return [
        ProbeStep(
            task="t",
            observation="o",
            action=f"a{i}",
            activations={6: x.tolist()},
            activations_model=model,
            activations_pooling="last",
        )
        for i, x in enumerate(X)
    ]


def test_bundle_round_trip_gives_identical_scores(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 24)).astype(np.float32)
    y = (X[:, 0] + 0.3 * rng.normal(size=200) > 0.5).astype(int)
    probe = LogisticProbe(C=0.2, class_weight="balanced").fit(X, y)
    base = DiffMeansProbe(standardize=True).fit(X, y)
    save_bundle(tmp_path / "b", info(0.7), probe, base)
    # a bundle travels: arrays as safetensors, the rest JSON, no pickle
    assert sorted(f.name for f in (tmp_path / "b").iterdir()) == [
        "bundle.json", "probe.json", "probe.safetensors"
    ]
    loaded_info, lp, lb = load_bundle(tmp_path / "b")
    assert loaded_info == info(0.7)
    assert type(lp) is LogisticProbe and type(lb) is DiffMeansProbe
    assert lp.get_params() == probe.get_params() and lb.get_params() == base.get_params()
    X_new = rng.normal(size=(50, 24))  # rows the probes never saw
    for loaded, fitted in ((lp, probe), (lb, base)):
        for rows in (X, X_new):
            np.testing.assert_array_equal(loaded.predict_proba(rows), fitted.predict_proba(rows))
            np.testing.assert_array_equal(loaded.predict(rows), fitted.predict(rows))

    scorer = ProbeScorer.load(tmp_path / "b")  # never needs the probe model here
    s = scorer.score(steps_with(X))
    np.testing.assert_array_equal(s, probe.predict_proba(X.astype(np.float64))[:, 1])
    np.testing.assert_array_equal(scorer.flag(steps_with(X)), s >= 0.7)
    assert scorer.model is None


def test_a_bundle_without_a_baseline_loads_none(tmp_path: Path) -> None:
    X = np.random.default_rng(2).normal(size=(40, 6))
    y = np.arange(40) % 2
    save_bundle(tmp_path / "b", info(), DiffMeansProbe().fit(X, y), LogisticProbe().fit(X, y))
    probe = LogisticProbe().fit(X, y)
    save_bundle(tmp_path / "b", info(), probe)  # retrained in place, now without one
    _, lp, lb = load_bundle(tmp_path / "b")
    assert lb is None and type(lp) is LogisticProbe
    np.testing.assert_array_equal(lp.predict_proba(X), probe.predict_proba(X))


class _RunsOnLoad:
    """A pickle that makes the folder ``marker`` when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_a_version_1_bundle_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    old = tmp_path / "b"
    old.mkdir()
    (old / "bundle.json").write_text(json.dumps({**asdict(info()), "version": 1}))
    for name in ("probe.joblib", "baseline.joblib"):
        (old / name).write_bytes(pickle.dumps(_RunsOnLoad(tmp_path / f"ran-{name}")))
    with pytest.raises(
        ValueError, match=r"probe\.joblib: a pickled probe .*retrain .*`monitor probes train`"
    ):
        ProbeScorer.load(old)
    assert not list(tmp_path.glob("ran-*"))

    X = np.random.default_rng(3).normal(size=(20, 4))
    save_bundle(old, info(), LogisticProbe().fit(X, np.arange(20) % 2))  # retrained in place
    assert not list(old.glob("*.joblib"))
    assert ProbeScorer.load(old).probe.n_features_in_ == 4


def test_activations_from_another_model_are_not_used(tmp_path: Path) -> None:
    X = np.random.default_rng(1).normal(size=(20, 8))
    y = np.arange(20) % 2
    save_bundle(tmp_path / "b", info(), LogisticProbe().fit(X, y))
    scorer = ProbeScorer.load(tmp_path / "b", model_path=tmp_path / "no-such-model")
    assert scorer._attached(steps_with(X, model="other-model")[0]) is None
    assert scorer._attached(steps_with(X)[0]) is not None


def test_transition_meta_activations_become_step_activations() -> None:
    t = Transition(
        transition_id="x/0",
        trajectory_id="x",
        split="test",
        index=0,
        task="pay rent",
        observation=View("balance 10"),
        action_text="send_money(to='evil')",
        next_observation=View(""),
        history=(("hi", "get_balance()"),),
        meta={
            "activations": {"model_id": "policy-7b", "pooling": "last", "layers": {"6": [0.5, 1.5]}}
        },
    )
    s = ProbeStep.from_transition(t)
    assert s.activations == {6: [0.5, 1.5]} and s.activations_model == "policy-7b"
    text = Template().render(s)
    assert text.startswith("Task: pay rent\nEarlier:\n> hi\n< get_balance()\nObservation:")
    assert text.endswith("Action: send_money(to='evil')")


def test_missing_bundle_fails_with_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a probe bundle"):
        ProbeScorer.load(tmp_path)
