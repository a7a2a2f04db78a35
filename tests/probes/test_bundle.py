"""A bundle round trip gives identical scores; record-attached activations are used as is."""

from __future__ import annotations

from pathlib import Path

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
    probe, base = LogisticProbe(C=0.2).fit(X, y), DiffMeansProbe().fit(X, y)
    save_bundle(tmp_path / "b", info(0.7), probe, base)
    loaded_info, lp, lb = load_bundle(tmp_path / "b")
    assert loaded_info == info(0.7)
    assert lb is not None
    np.testing.assert_array_equal(lp.predict_proba(X), probe.predict_proba(X))
    np.testing.assert_array_equal(lb.predict_proba(X), base.predict_proba(X))

    scorer = ProbeScorer.load(tmp_path / "b")  # never needs the probe model here
    s = scorer.score(steps_with(X))
    np.testing.assert_array_equal(s, probe.predict_proba(X.astype(np.float64))[:, 1])
    np.testing.assert_array_equal(scorer.flag(steps_with(X)), s >= 0.7)
    assert scorer.model is None


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
