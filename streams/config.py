"""Connection and topic settings, from the environment (never read at import time).

``VIGIL_KAFKA_BOOTSTRAP_SERVERS`` unset means "use the embedded broker"; set
it (and the SASL/SSL options) and the same code talks to a production cluster.
Topic names are ``VIGIL_TOPIC_<NAME>`` (DESIGN §2.3 gives the defaults).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class KafkaSettings(BaseSettings):
    """How to reach Kafka. Field ``x`` is read from ``VIGIL_KAFKA_X``."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_KAFKA_", extra="ignore")

    bootstrap_servers: str | None = Field(
        default=None, description="host:port[,host:port]; unset = start the embedded broker"
    )
    client_id: str = "vigil"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    partitions: int = Field(default=3, ge=1, description="partitions for topics vigil creates")
    max_record_bytes: int = Field(
        default=1_048_576, ge=1024, description="larger input records are dead-lettered"
    )
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 2000
    request_timeout_ms: int = 30_000
    max_block_ms: int = Field(
        default=10_000, ge=100, description="longest a publish waits for topic metadata")
    reconnect_backoff_max_ms: int = Field(
        default=1_000, ge=50,
        description="longest wait between reconnects (a returned broker is used within it)")
    metadata_max_age_ms: int = Field(
        default=5_000, ge=100,
        description="how often clients refresh metadata (finds topics made on a new broker)")

    def client_options(self) -> dict[str, Any]:
        """Options common to kafka-python producers, consumers and admin clients."""
        opts: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            "reconnect_backoff_max_ms": self.reconnect_backoff_max_ms,
        }
        if self.sasl_mechanism:
            opts["sasl_mechanism"] = self.sasl_mechanism
            opts["sasl_plain_username"] = self.sasl_plain_username
            opts["sasl_plain_password"] = self.sasl_plain_password
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, key):
                opts[key] = getattr(self, key)
        if self.security_protocol in ("SSL", "SASL_SSL"):
            opts["ssl_check_hostname"] = self.ssl_check_hostname
        return opts


class Topics(BaseSettings):
    """Topic names; ``VIGIL_TOPIC_SCORES=my.scores`` overrides one."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_TOPIC_", extra="ignore")

    steps_rollout: str = "vigil.steps.rollout"
    steps_deployment: str = "vigil.steps.deployment"
    steps_l0: str = "vigil.steps.l0"  # L0 -> L1: every step with its L0 verdict
    tito_calls: str = "vigil.tito.calls"
    tito_executions: str = "vigil.tito.executions"
    art_rollouts: str = "vigil.art.rollouts"  # generated-media rollouts (streams.media)
    art_iterations: str = "vigil.art.iterations"  # ART trainer statistics per iteration
    scores: str = "vigil.scores"
    escalations: str = "vigil.escalations"
    verdicts_rollout: str = "vigil.verdicts.rollout"
    labels: str = "vigil.labels"
    deadletter: str = "vigil.deadletter"
    gates: str = "vigil.gates"  # the screen stage's live gate sketches (--adapt)

    def all(self) -> list[str]:
        return list(self.model_dump().values())
