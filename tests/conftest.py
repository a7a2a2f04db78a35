"""Shared fixtures: one real Tansu broker per test session, and both bus backends."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

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
