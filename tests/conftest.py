"""Shared fixtures: one real Tansu broker per test session, and both bus backends."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.broker import EmbeddedBroker
from streams.bus import Bus, InMemoryBus
from streams.config import KafkaSettings
from streams.kafka import KafkaBus

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
    from worldmodel.agentdojo_data import build_agentdojo

    out = tmp_path_factory.mktemp("agentdojo-small")
    build_agentdojo(out, suites=["banking", "slack"], attacks=["important_instructions"],
                    max_user_tasks=6, max_injection_tasks=3, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_worldmodel_bundle(small_agentdojo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small world-model bundle trained on ``small_agentdojo`` (4 epochs, ~30 s)."""
    from worldmodel.model import JEPAConfig
    from worldmodel.train import TrainConfig, train

    out = tmp_path_factory.mktemp("bundle") / "wm"
    small = JEPAConfig(latent_dim=32, hidden_dim=64, history=2, predictor_layers=1,
                       predictor_heads=2, use_images=False)
    train(TrainConfig(data=[str(small_agentdojo)], out=str(out), epochs=4, batch_size=32,
                      text_cache=str(tmp_path_factory.mktemp("textcache")), model=small),
          log=lambda _: None)
    return out
