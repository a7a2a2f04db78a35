"""Training the world model on a small real AgentDojo build: no collapse, a usable bundle."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from worldmodel.datasets.format import read_transitions
from worldmodel.features import step_input
from worldmodel.model import JEPA, JEPAConfig
from worldmodel.score import WorldModelScorer, save_weights

ROOT = Path(__file__).resolve().parents[2]
SMALL = JEPAConfig(
    latent_dim=32, hidden_dim=64, history=2, predictor_layers=1, predictor_heads=2, use_images=False
)


@pytest.fixture(scope="module")
def data(small_agentdojo: Path) -> Path:
    return small_agentdojo


@pytest.fixture(scope="module")
def bundle(tiny_worldmodel_bundle: Path) -> Path:
    return tiny_worldmodel_bundle


def test_training_writes_a_complete_bundle_without_collapse(bundle: Path, data: Path) -> None:
    for name in ("model.safetensors", "config.json", "calibration.json", "data.json",
                 "metrics.json"):
        assert (bundle / name).exists(), name
    # a bundle travels: nothing in it may run code when loaded
    assert not [f.name for f in bundle.iterdir() if f.suffix in {".pt", ".pkl", ".joblib", ".bin"}]
    metrics = json.loads((bundle / "metrics.json").read_text())
    assert len(metrics["history"]) == 4
    first, last = metrics["history"][0], metrics["history"][-1]
    assert last["loss"] < first["loss"], "training reduces the loss"
    assert metrics["val"]["embedding_std"] > 0.05, "target embeddings did not collapse"
    assert metrics["val"]["effective_rank"] > 2.0  # a collapsed embedding has rank ~1
    recorded = json.loads((bundle / "data.json").read_text())
    assert str(data) in recorded and recorded[str(data)]["hash"]
    config = json.loads((bundle / "config.json").read_text())
    assert config["model"]["latent_dim"] == 32 and config["epochs"] == 4
    assert config["mask_tools"] is True  # the default: actions read without tool names


def test_only_train_and_val_rows_are_read_for_fitting(bundle: Path, data: Path) -> None:
    metrics = json.loads((bundle / "metrics.json").read_text())
    n_fit = sum(1 for t in read_transitions(data, ["train"]))
    assert metrics["train_rows"] == n_fit
    assert not any(
        t.split == "train" and t.meta.get("suite") == "slack" for t in read_transitions(data)
    )


def test_bundle_round_trip_gives_identical_scores(bundle: Path, data: Path) -> None:
    steps = [step_input(t) for t in read_transitions(data, ["test_slack"])][:40]
    a = WorldModelScorer.load(bundle).score(steps)
    b = WorldModelScorer.load(bundle).score(steps)
    assert a == b
    assert all(0.0 <= s.harm_pre <= 1.0 and s.surprise is not None for s in a)
    assert all(s.relational_harm is not None and s.injection is not None for s in a)


def test_weights_written_to_a_bundle_score_as_the_model_in_memory(
    bundle: Path, data: Path, tmp_path: Path
) -> None:
    steps = [step_input(t) for t in read_transitions(data, ["test_slack"])][:40]
    trained = WorldModelScorer.load(bundle)
    torch.manual_seed(1)
    model = JEPA(trained.config)  # other weights than the bundle's
    copy = shutil.copytree(bundle, tmp_path / "wm")
    save_weights(model, copy)
    in_memory = WorldModelScorer(
        model, trained.calibration, trained.encoder, relational=trained.relational,
        mask_tools=trained.mask_tools,
    )  # fmt: skip
    expected = in_memory.score(steps)
    assert WorldModelScorer.load(copy).score(steps) == expected
    assert trained.score(steps) != expected  # the scores do come from the written weights


class _RunsOnLoad:
    """A pickle that makes the folder ``marker`` when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_a_bundle_of_pickled_weights_is_refused_unread(bundle: Path, tmp_path: Path) -> None:
    old = shutil.copytree(bundle, tmp_path / "old")
    (old / "model.safetensors").unlink()
    (old / "model.pt").write_bytes(pickle.dumps(_RunsOnLoad(tmp_path / "ran")))
    with pytest.raises(
        ValueError, match=r"model\.pt: pickled .*retrain .*`monitor worldmodel train`"
    ):
        WorldModelScorer.load(old)
    assert not (tmp_path / "ran").exists()


def test_pre_execution_scoring_needs_no_next_observation(bundle: Path, data: Path) -> None:
    from dataclasses import replace

    steps = [
        replace(step_input(t), next_observation=None) for t in read_transitions(data, ["val"])
    ][:10]
    scores = WorldModelScorer.load(bundle).score(steps)
    assert all(s.harm_post is None and s.surprise is None for s in scores)
    assert all(0.0 <= s.harm_pre <= 1.0 for s in scores)


def test_scorer_refuses_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError, match="not a world-model bundle .*monitor worldmodel train"
    ):
        WorldModelScorer.load(tmp_path)


def test_cli_eval_reports_held_out_metrics(bundle: Path, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor.cli",
            "worldmodel",
            "eval",
            "--model",
            str(bundle),
            "--data",
            str(data),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    slack = result["splits"]["agentdojo/test_slack"]
    assert slack["steps"] > 0 and slack["harmful"] > 0
    assert 0.0 <= slack["harm_auroc_pre"] <= 1.0
    assert "agentdojo/test_slack:" in run.stdout
    assert not any(k.endswith("/train") or k.endswith("/val") for k in result["splits"])
    assert np.isfinite(slack["surprise_auroc_injected"])


def test_cli_builds_data_and_trains_a_bundle_under_vigil_home(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "VIGIL_HOME": str(tmp_path / "home")}
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor.cli",
            "worldmodel",
            "build-data",
            "agentdojo",
            "--suites",
            "banking",
            "--max-user-tasks",
            "4",
            "--max-injection-tasks",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    data = tmp_path / "home" / "data" / "agentdojo"
    assert (data / "manifest.json").exists()
    assert "train:" in build.stdout and "harmful" in build.stdout
    trained = subprocess.run(
        [
            sys.executable,
            "-m",
            "monitor.cli",
            "worldmodel",
            "train",
            "--epochs",
            "1",
            "--latent-dim",
            "32",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr
    assert "epoch 1:" in trained.stderr  # progress as it trains
    bundle = tmp_path / "home" / "models" / "worldmodel"
    assert json.loads((bundle / "config.json").read_text())["model"]["latent_dim"] == 32
    assert (tmp_path / "home" / "cache" / "text").is_dir()


def test_cli_train_without_data_says_how_to_build_it(tmp_path: Path) -> None:
    import os

    run = subprocess.run(
        [sys.executable, "-m", "monitor.cli", "worldmodel", "train"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "VIGIL_HOME": str(tmp_path)},
    )
    assert run.returncode == 2
    assert "monitor worldmodel build-data agentdojo" in run.stderr
