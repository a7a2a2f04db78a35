"""Fixtures of the paging-service tests: a real PostgreSQL (one fresh database per session,
one schema per test) and SQLite, tokens of every role, apps built by ``create_app``."""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from monitor.service.app import create_app
from monitor.service.auth import provision_store
from monitor.service.settings import PagingSettings
from streams.bus import InMemoryBus
from tests.service.helpers import WebhookReceiver

PG_HOST = os.environ.get("VIGIL_TEST_PG_HOST", "127.0.0.1")
PG_USER = os.environ.get("VIGIL_TEST_PG_USER", "postgres")
_schemas = itertools.count()


def _pg_admin() -> psycopg.Connection[Any]:
    return psycopg.connect(host=PG_HOST, port=5432, user=PG_USER, dbname="test", autocommit=True)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    name = f"vigil_test_{os.getpid()}"
    with _pg_admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    yield f"postgresql+psycopg://{PG_USER}@{PG_HOST}:5432/{name}"
    with _pg_admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Each API test runs on both stores: an SQLite file, and a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/paging.db"
    base = request.getfixturevalue("pg_database")
    schema = f"t{next(_schemas)}"
    with psycopg.connect(base.replace("postgresql+psycopg", "postgresql"),
                         autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{base}?options=-csearch_path%3D{schema}"


@dataclass
class Service:
    """One store with tokens of every role, and a factory for apps on it."""

    url: str
    tokens: dict[str, str]
    bus: InMemoryBus = field(default_factory=InMemoryBus)
    console: io.StringIO = field(default_factory=io.StringIO)

    def settings(self, **overrides: Any) -> PagingSettings:
        values: dict[str, Any] = {
            "database_url": self.url,
            "poll_interval_s": 0.05,
            "webhook_backoff_s": 0.2,
            "webhook_timeout_s": 2.0,
            "secret_key": "test-secret-key-for-sessions",
            "public_url": "http://testserver",
        }
        values.update(overrides)
        return PagingSettings(**values)

    def app(self, **overrides: Any) -> FastAPI:
        return create_app(self.settings(**overrides), bus=self.bus, console=self.console)

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def sqlite_service(folder: Any) -> Service:
    """An SQLite store in ``folder`` with a token of every role."""
    url = f"sqlite:///{folder}/paging.db"
    issued = provision_store(url, {f"{r}-1": r for r in ("producer", "reviewer", "admin")})
    return Service(url, {name[:-2]: token for name, token in issued.items()})


@pytest.fixture
def service(database_url: str) -> Iterator[Service]:
    issued = provision_store(database_url, {f"{r}-1": r for r in ("producer", "reviewer", "admin")})
    yield Service(database_url, {name[:-2]: token for name, token in issued.items()})


@pytest.fixture
def client(service: Service) -> Iterator[TestClient]:
    with TestClient(service.app()) as c:
        yield c


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver()
    yield r
    r.close()


@pytest.fixture
def make_receiver() -> Iterator[Callable[..., WebhookReceiver]]:
    made: list[WebhookReceiver] = []

    def make(**kwargs: Any) -> WebhookReceiver:
        r = WebhookReceiver(**kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
