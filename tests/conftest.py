"""Shared fixtures: one real Tansu broker per test session, both bus backends, and topics of
a test's own."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker
from streams.bus import Bus, InMemoryBus
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from tests.built import built_once

_ids = itertools.count()


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def kafka_settings(broker: EmbeddedBroker) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="vigil-test")


@pytest.fixture
def unique() -> str:
    """A name no other test uses (topics and groups outlive a test on the shared broker)."""
    return f"t{os.getpid()}-{next(_ids)}"


@pytest.fixture
def topics(unique: str) -> Topics:
    """Every topic of this test's own (topics outlive a test on the session broker)."""
    return Topics(**{name: f"{unique}.{name}" for name in Topics.model_fields})


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.broker)])
def bus(request: pytest.FixtureRequest) -> Iterator[Bus]:
    """Each behavioural bus test runs on the in-process backend and on the real broker."""
    b: Bus
    if request.param == "memory":
        b = InMemoryBus(partitions=3)
    else:
        b = KafkaBus(request.getfixturevalue("kafka_settings"))
    yield b
    b.close()


@pytest.fixture(scope="session")
def small_agentdojo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real AgentDojo transition build (banking for training, slack held out)."""
    from worldmodel.datasets.agentdojo.build import build_agentdojo

    return built_once(tmp_path_factory, "agentdojo-small", lambda out: build_agentdojo(
        out, suites=["banking", "slack"], attacks=["important_instructions"],
        max_user_tasks=6, max_injection_tasks=3, progress=False))


@pytest.fixture(scope="session")
def tiny_worldmodel_bundle(small_agentdojo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small world-model bundle trained on ``small_agentdojo`` (4 epochs, ~30 s)."""
    from worldmodel.model import JEPAConfig
    from worldmodel.train import TrainConfig, train

    small = JEPAConfig(latent_dim=32, hidden_dim=64, history=2, predictor_layers=1,
                       predictor_heads=2, use_images=False)

    def build(folder: Path) -> None:
        train(TrainConfig(data=[str(small_agentdojo)], out=str(folder / "wm"), epochs=4,
                          batch_size=32, text_cache=str(folder / "textcache"), model=small),
              log=lambda _: None)

    return built_once(tmp_path_factory, "bundle", build) / "wm"


@pytest.fixture(scope="session")
def tiny_probe_bundle(small_agentdojo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A probe bundle on the real Gemma-3-270M, layer 3 only, 160 training steps (~1 min)."""
    from probes.models import load_probe_model
    from probes.pipeline import train_probe

    def build(folder: Path) -> None:
        train_probe(load_probe_model(), small_agentdojo, folder / "probe", layers=[3],
                    train_limit=160, n_splits=3, cache_dir=folder / "probe-cache",
                    log=lambda _: None)

    return built_once(tmp_path_factory, "probes", build) / "probe"


@pytest.fixture(scope="session")
def tiny_policy(
    small_agentdojo: Path,
    tiny_worldmodel_bundle: Path,
    tiny_probe_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A calibrated tier policy over the tiny bundles, without the L2 reviewer (the gate
    into L3 then stacks L0 and L1 signals only). Budgets are wide so a small stream
    reaches every tier."""
    from monitor.defaults import DefaultSizes, calibrate_default
    from monitor.tiers import policy_config_from_dict

    config = policy_config_from_dict(
        {"tiers": {"L0": {"budget": 0.5}, "L1": {"budget": 0.2}, "L2": {"budget": 0.1,
                                                                        "signals": []}}}
    )
    from monitor.defaults import train_default_provenance

    def build(folder: Path) -> None:
        train_default_provenance(small_agentdojo, folder / "prov", log=lambda _: None)
        calibrate_default(
            config, [str(small_agentdojo)], folder / "policy.json",
            models={"worldmodel": str(tiny_worldmodel_bundle),
                    "probes": str(tiny_probe_bundle), "provenance": str(folder / "prov")},
            sizes=DefaultSizes(1, (3,), 160, 300, 20), reviewer=False, log=lambda _: None,
        )

    return built_once(tmp_path_factory, "policy", build) / "policy.json"


@pytest.fixture(scope="session")
def narrow_policy(
    small_agentdojo: Path,
    tiny_worldmodel_bundle: Path,
    tiny_probe_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The tiny policy with a narrow paging budget (so few benign trajectories are flagged by
    a step) and a trajectory budget of 25 %: the trajectory threshold has a share to spend."""
    from monitor.defaults import DefaultSizes, calibrate_default
    from monitor.tiers import policy_config_from_dict

    config = policy_config_from_dict(
        {"trajectory_budget": 0.25,
         "tiers": {"L0": {"budget": 0.5}, "L1": {"budget": 0.2},
                   "L2": {"budget": 0.01, "signals": []}}}
    )

    def build(folder: Path) -> None:
        calibrate_default(
            config, [str(small_agentdojo)], folder / "policy.json",
            models={"worldmodel": str(tiny_worldmodel_bundle),
                    "probes": str(tiny_probe_bundle)},
            sizes=DefaultSizes(1, (3,), 160, 300, 20), reviewer=False, log=lambda _: None,
        )

    return built_once(tmp_path_factory, "narrow-policy", build) / "policy.json"
