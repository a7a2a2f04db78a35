"""Settings of the paging service, from ``VIGIL_PAGING_*`` (read when the app is built)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class PagingSettings(BaseSettings):
    """Field ``x`` is read from ``VIGIL_PAGING_X``; ``create_app(settings)`` takes one."""

    model_config = SettingsConfigDict(env_prefix="VIGIL_PAGING_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///vigil-paging.db",
        description="SQLAlchemy URL: sqlite:///path.db (embedded) or postgresql://user@host/db",
    )
    secret_key: SecretStr | None = Field(
        default=None,
        description="signs session cookies; unset = random per process (logins end on restart)",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="a bearer token for GET /metrics only (Prometheus: authorization."
        "credentials); a reviewer or admin API token is accepted too, a producer's never "
        "(the metrics count verdicts)",
    )
    metrics_open: bool = Field(
        default=False,
        description="serve GET /metrics without a token (only where no producer can reach it)",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8000", description="base URL of the review pages, for links"
    )
    default_policy: str = Field(
        default="default", description="escalation policy for events without a routing_key"
    )
    poll_interval_s: float = Field(
        default=1.0, gt=0, le=60, description="how often due timers are looked for"
    )
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=120)
    webhook_max_attempts: int = Field(default=8, ge=1, le=50)
    webhook_backoff_s: float = Field(
        default=2.0, gt=0, description="first retry delay; doubles each attempt"
    )
    webhook_backoff_max_s: float = Field(default=600.0, gt=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    session_max_age_s: int = Field(default=12 * 3600, ge=60)
    secure_cookies: bool = Field(default=False, description="mark the session cookie HTTPS-only")
    auto_migrate: bool = Field(default=True, description="upgrade the schema on start-up")
    labels_topic: str | None = Field(
        default=None, description="where verdicts go (default: $VIGIL_TOPIC_LABELS or vigil.labels)"
    )
    publish_labels: bool = Field(
        default=True,
        description="publish verdicts to Kafka when VIGIL_KAFKA_BOOTSTRAP_SERVERS is set",
    )
    screen_policy: Path | None = Field(
        default=None,
        description="calibrated policy (`monitor calibrate`) for POST /v1/screen; unset = "
        "the endpoint answers 503",
    )
    screen_max_batch: int = Field(
        default=16, ge=1, le=256, description="most proposed actions screened in one model call"
    )
    screen_max_body_bytes: int = Field(
        default=2 * 1024 * 1024, ge=1024,
        description="larger POST /v1/screen bodies get 413 before they are read",
    )
    screen_batch_chars: int = Field(
        default=128 * 1024, ge=1024,
        description="most characters of text the models read in one batched model call "
        "(each text counts up to 16 KiB; a request over it runs alone), so that one call, "
        "and the wait of a request behind it, stays short",
    )
