"""The paging store (SQLAlchemy 2). Timers are rows: ``pages.next_escalation_at`` and
``notifications.due_at``; a restarted service finds them where it left them.

A **page** is one case a human handles: all alerts of one trajectory (or one
execution, or one explicit ``group``) while it is open. An **alert** is one
trigger ``dedup_key`` (the worker sends ``trajectory_id/step_id``); a key is
unique for ever, so a redelivered trigger never opens a second page.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ROLES = ("producer", "reviewer", "admin")
SEVERITIES = ("critical", "error", "warning", "info")  # most severe first
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
OPEN = ("triggered", "acknowledged")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both databases (SQLite keeps no zone: stored as naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class ApiToken(Base):
    """An API token; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(20))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class Channel(Base):
    """Where notifications go: a signed webhook, or the service's console."""

    __tablename__ = "channels"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    kind: Mapped[str] = mapped_column(String(20))
    url: Mapped[str | None] = mapped_column(String(2000))
    secret: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime]


class EscalationPolicy(Base):
    """Ordered levels of on-call reviewers; the whole list runs ``1 + repeat`` times."""

    __tablename__ = "escalation_policies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    repeat: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    levels: Mapped[list[EscalationLevel]] = relationship(
        back_populates="policy",
        order_by="EscalationLevel.position",
        cascade="all, delete-orphan",
    )


class EscalationLevel(Base):
    __tablename__ = "escalation_levels"
    __table_args__ = (UniqueConstraint("policy_id", "position"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    policy_id: Mapped[int] = mapped_column(
        ForeignKey("escalation_policies.id", ondelete="CASCADE")
    )
    position: Mapped[int] = mapped_column(Integer)
    ack_timeout_s: Mapped[float] = mapped_column(Float)
    targets: Mapped[list[Any]] = mapped_column(JSON)  # channel names
    policy: Mapped[EscalationPolicy] = relationship(back_populates="levels")


class Silence(Base):
    """Alertmanager-style: pages matching every matcher between the bounds notify no one."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(primary_key=True)
    matchers: Mapped[list[Any]] = mapped_column(JSON)
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime] = mapped_column(index=True)
    created_by: Mapped[str] = mapped_column(String(100))
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]


class Page(Base):
    __tablename__ = "pages"
    __table_args__ = (
        # at most one open page per group: concurrent triggers of one trajectory meet here
        Index(
            "uq_pages_open_group",
            "group_key",
            unique=True,
            sqlite_where=text("status <> 'resolved'"),
            postgresql_where=text("status <> 'resolved'"),
        ),
        Index("ix_pages_status_severity", "status", "severity"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    group_key: Mapped[str] = mapped_column(String(400))
    status: Mapped[str] = mapped_column(String(20))
    severity: Mapped[str] = mapped_column(String(20))
    summary: Mapped[str] = mapped_column(String(1024))
    source: Mapped[str] = mapped_column(String(255))
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    trajectory_id: Mapped[str | None] = mapped_column(String(255), index=True)
    execution_id: Mapped[str | None] = mapped_column(String(255))
    policy_id: Mapped[int | None] = mapped_column(
        ForeignKey("escalation_policies.id", ondelete="SET NULL")
    )
    level: Mapped[int] = mapped_column(Integer, default=0)
    loop: Mapped[int] = mapped_column(Integer, default=0)
    next_escalation_at: Mapped[datetime | None] = mapped_column(index=True)
    silence_id: Mapped[int | None] = mapped_column(ForeignKey("silences.id", ondelete="SET NULL"))
    trigger_count: Mapped[int] = mapped_column(Integer, default=1)
    alert_count: Mapped[int] = mapped_column(Integer, default=1)
    opened_at: Mapped[datetime]
    last_triggered_at: Mapped[datetime]
    acknowledged_at: Mapped[datetime | None]
    acknowledged_by: Mapped[str | None] = mapped_column(String(100))
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[str | None] = mapped_column(String(100))

    policy: Mapped[EscalationPolicy | None] = relationship()
    silence: Mapped[Silence | None] = relationship()
    alerts: Mapped[list[Alert]] = relationship(back_populates="page", order_by="Alert.id")
    events: Mapped[list[PageEvent]] = relationship(order_by="PageEvent.id")
    verdicts: Mapped[list[Verdict]] = relationship(order_by="Verdict.id")

    @property
    def is_open(self) -> bool:
        return self.status in OPEN

    @property
    def policy_name(self) -> str | None:
        return self.policy.name if self.policy is not None else None


class Alert(Base):
    """One trigger ``dedup_key`` (one flagged step) and the case data it carried."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("pages.id", ondelete="CASCADE"), index=True)
    dedup_key: Mapped[str] = mapped_column(String(255), unique=True)
    summary: Mapped[str] = mapped_column(String(1024))
    severity: Mapped[str] = mapped_column(String(20))
    trajectory_id: Mapped[str | None] = mapped_column(String(255))
    step_id: Mapped[str | None] = mapped_column(String(255))
    details: Mapped[dict[str, Any]] = mapped_column(JSON)
    trigger_count: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime]
    last_triggered_at: Mapped[datetime]

    page: Mapped[Page] = relationship(back_populates="alerts")


class PageEvent(Base):
    """The page's timeline: opened, grouped, notified, escalated, acknowledged, ..."""

    __tablename__ = "page_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("pages.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(40))
    actor: Mapped[str | None] = mapped_column(String(100))
    message: Mapped[str] = mapped_column(Text, default="")


class Notification(Base):
    """One message to one channel; retried with backoff until delivered or out of attempts."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_status_due", "status", "due_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("pages.id", ondelete="CASCADE"), index=True)
    channel_id: Mapped[int | None] = mapped_column(
        ForeignKey("channels.id", ondelete="SET NULL")
    )
    channel_name: Mapped[str] = mapped_column(String(100))
    event: Mapped[str] = mapped_column(String(40))
    level: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20))  # pending, delivered, failed, cancelled
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    due_at: Mapped[datetime]
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)

    channel: Mapped[Channel | None] = relationship()
    deliveries: Mapped[list[DeliveryAttempt]] = relationship(order_by="DeliveryAttempt.id")


class DeliveryAttempt(Base):
    """The delivery log: every attempt, its status code or error, and how long it took."""

    __tablename__ = "delivery_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    notification_id: Mapped[int] = mapped_column(
        ForeignKey("notifications.id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime]
    duration_ms: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)


class Verdict(Base):
    """A reviewer's label for a case; ``published_at`` is set once it is on the labels topic."""

    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(primary_key=True)
    page_id: Mapped[int] = mapped_column(ForeignKey("pages.id", ondelete="CASCADE"), index=True)
    reviewer: Mapped[str] = mapped_column(String(100))
    harmful: Mapped[bool] = mapped_column(Boolean)
    category: Mapped[str | None] = mapped_column(String(100))
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]
    published_at: Mapped[datetime | None] = mapped_column(index=True)
