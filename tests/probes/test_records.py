"""Representation re-use: a probe trained and scored on activations the records carry.

The activations are the real Gemma-3-270M's (standing in for the policy's own), attached as
``meta.activations = {"model_id", "pooling", "layers": {"4": [...], "6": [...]}}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from probes.bundle import ProbeScorer
from probes.capture import extract, identity_hash
from probes.models import ProbeModel
from probes.pipeline import load_steps, train_probe
from worldmodel.datasets.format import DatasetWriter, read_manifest, read_transitions

LAYERS = (4, 6)


@pytest.fixture(scope="module")
def with_activations(
    pm: ProbeModel, tiny_banking: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny dataset again, every step carrying Gemma's mean-pooled layers 4 and 6."""
    rows = list(read_transitions(tiny_banking))
    steps = load_steps(tiny_banking, sorted({t.split for t in rows})).steps
    by_id = {s.step_id: s for s in steps}
    feats = extract(pm, [by_id[t.transition_id] for t in rows], LAYERS, progress=False)
    out = tmp_path_factory.mktemp("agentdojo-with-activations")
    with DatasetWriter(out, read_manifest(tiny_banking)) as w:
        for i, t in enumerate(rows):
            acts = {
                "model_id": pm.model_id,
                "pooling": "mean",
                "layers": {str(layer): feats[(layer, "mean")][i].tolist() for layer in LAYERS},
            }
            w.add(dataclasses.replace(t, meta={**t.meta, "activations": acts}))
    return out


def test_train_from_records_needs_no_model_and_scores_them(
    pm: ProbeModel, tiny_banking: Path, with_activations: Path, tmp_path: Path
) -> None:
    from monitor.cli.probes import add_parser

    ap = argparse.ArgumentParser(prog="monitor")
    add_parser(ap.add_subparsers(dest="command"))
    bundle = tmp_path / "bundle"
    args = ap.parse_args(
        ["probes", "train", "--from-records", "--data", str(with_activations), "--out", str(bundle)]
    )
    assert args.fn(args) == 0
    info = json.loads((bundle / "bundle.json").read_text())
    assert (info["source"], info["model_id"], info["pooling"]) == ("records", pm.model_id, "mean")
    assert info["layer"] in LAYERS
    assert info["model_hash"] == identity_hash(pm.model_id, 640)
    assert {r["layer"] for r in info["sweep"]["rows"]} == set(LAYERS)

    # records carrying the same model's activations are scored without any probe model ...
    scorer = ProbeScorer.load(bundle, model_path=tmp_path / "no-such-model")
    val = load_steps(with_activations, ["val"])
    s = scorer.score(val.steps)
    assert scorer.model is None
    from probes.sweep import auroc

    assert auroc(val.y, s) == pytest.approx(info["metrics"]["val"]["auroc"])
    # ... and the attached vectors are read at the right layer: the same probe on Gemma's
    # activations computed here, for the same steps without attachments, gives the same scores
    bare = load_steps(tiny_banking, ["val"]).steps
    live = extract(pm, bare, [info["layer"]], progress=False)[(info["layer"], "mean")]
    np.testing.assert_allclose(s, scorer.score_features(live), atol=1e-5)

    # a record without them cannot be scored by a records bundle: one clear sentence
    with pytest.raises(ValueError, match="carries no activations of gemma-3-270m.*no probe model"):
        scorer.score(bare[:1])


def test_records_missing_activations_are_refused_by_name(
    tiny_banking: Path, tmp_path: Path
) -> None:
    with pytest.raises(
        ValueError, match=r"steps in train carry no activations \(meta.activations\)"
    ):
        train_probe(None, tiny_banking, tmp_path / "b", log=lambda m: None)
