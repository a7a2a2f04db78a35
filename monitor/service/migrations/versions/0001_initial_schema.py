"""initial schema, and the defaults a fresh install pages through

The ``console`` channel and a ``default`` escalation policy (one level: the
console, re-notified every 10 minutes, three rounds) make an empty install page
somebody; replace them through ``/api/v1/policies`` and ``/api/v1/channels``.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "channels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=True),
        sa.Column("secret", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_channels")),
        sa.UniqueConstraint("name", name=op.f("uq_channels_name")),
    )
    op.create_table(
        "escalation_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_escalation_policies")),
        sa.UniqueConstraint("name", name=op.f("uq_escalation_policies_name")),
    )
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_index(op.f("ix_silences_ends_at"), "silences", ["ends_at"], unique=False)
    op.create_table(
        "escalation_levels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("policy_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("ack_timeout_s", sa.Float(), nullable=False),
        sa.Column("targets", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["policy_id"],
            ["escalation_policies.id"],
            name=op.f("fk_escalation_levels_policy_id_escalation_policies"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_escalation_levels")),
        sa.UniqueConstraint("policy_id", "position", name=op.f("uq_escalation_levels_policy_id")),
    )
    op.create_table(
        "pages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("group_key", sa.String(length=400), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("severity", sa.String(length=20), nullable=False),
        sa.Column("summary", sa.String(length=1024), nullable=False),
        sa.Column("source", sa.String(length=255), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("trajectory_id", sa.String(length=255), nullable=True),
        sa.Column("execution_id", sa.String(length=255), nullable=True),
        sa.Column("policy_id", sa.Integer(), nullable=True),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("loop", sa.Integer(), nullable=False),
        sa.Column("next_escalation_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silence_id", sa.Integer(), nullable=True),
        sa.Column("trigger_count", sa.Integer(), nullable=False),
        sa.Column("alert_count", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_triggered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acknowledged_by", sa.String(length=100), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_by", sa.String(length=100), nullable=True),
        sa.ForeignKeyConstraint(
            ["policy_id"],
            ["escalation_policies.id"],
            name=op.f("fk_pages_policy_id_escalation_policies"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["silence_id"],
            ["silences.id"],
            name=op.f("fk_pages_silence_id_silences"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pages")),
    )
    op.create_index(
        op.f("ix_pages_next_escalation_at"), "pages", ["next_escalation_at"], unique=False
    )
    op.create_index("ix_pages_status_severity", "pages", ["status", "severity"], unique=False)
    op.create_index(op.f("ix_pages_trajectory_id"), "pages", ["trajectory_id"], unique=False)
    op.create_index(
        "uq_pages_open_group",
        "pages",
        ["group_key"],
        unique=True,
        sqlite_where=sa.text("status <> 'resolved'"),
        postgresql_where=sa.text("status <> 'resolved'"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("dedup_key", sa.String(length=255), nullable=False),
        sa.Column("summary", sa.String(length=1024), nullable=False),
        sa.Column("severity", sa.String(length=20), nullable=False),
        sa.Column("trajectory_id", sa.String(length=255), nullable=True),
        sa.Column("step_id", sa.String(length=255), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("trigger_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_triggered_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["page_id"], ["pages.id"], name=op.f("fk_alerts_page_id_pages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_alerts_dedup_key")),
    )
    op.create_index(op.f("ix_alerts_page_id"), "alerts", ["page_id"], unique=False)
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("channel_id", sa.Integer(), nullable=True),
        sa.Column("channel_name", sa.String(length=100), nullable=False),
        sa.Column("event", sa.String(length=40), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["channels.id"],
            name=op.f("fk_notifications_channel_id_channels"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["page_id"],
            ["pages.id"],
            name=op.f("fk_notifications_page_id_pages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
    )
    op.create_index(op.f("ix_notifications_page_id"), "notifications", ["page_id"], unique=False)
    op.create_index(
        "ix_notifications_status_due", "notifications", ["status", "due_at"], unique=False
    )
    op.create_table(
        "page_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["page_id"], ["pages.id"], name=op.f("fk_page_events_page_id_pages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_page_events")),
    )
    op.create_index(op.f("ix_page_events_page_id"), "page_events", ["page_id"], unique=False)
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("reviewer", sa.String(length=100), nullable=False),
        sa.Column("harmful", sa.Boolean(), nullable=False),
        sa.Column("category", sa.String(length=100), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["page_id"], ["pages.id"], name=op.f("fk_verdicts_page_id_pages"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_verdicts")),
    )
    op.create_index(op.f("ix_verdicts_page_id"), "verdicts", ["page_id"], unique=False)
    op.create_index(op.f("ix_verdicts_published_at"), "verdicts", ["published_at"], unique=False)
    op.create_table(
        "delivery_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("notification_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["notification_id"],
            ["notifications.id"],
            name=op.f("fk_delivery_attempts_notification_id_notifications"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_attempts")),
    )
    op.create_index(
        op.f("ix_delivery_attempts_notification_id"),
        "delivery_attempts",
        ["notification_id"],
        unique=False,
    )
    _seed_defaults()


def _seed_defaults() -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    meta = sa.MetaData()
    stamp = sa.DateTime(timezone=True)
    channels = sa.Table(
        "channels",
        meta,
        sa.Column("id", sa.Integer),
        sa.Column("name", sa.String),
        sa.Column("kind", sa.String),
        sa.Column("created_at", stamp),
    )
    policies = sa.Table(
        "escalation_policies",
        meta,
        sa.Column("id", sa.Integer),
        sa.Column("name", sa.String),
        sa.Column("description", sa.Text),
        sa.Column("repeat", sa.Integer),
        sa.Column("created_at", stamp),
    )
    levels = sa.Table(
        "escalation_levels",
        meta,
        sa.Column("policy_id", sa.Integer),
        sa.Column("position", sa.Integer),
        sa.Column("ack_timeout_s", sa.Float),
        sa.Column("targets", sa.JSON),
    )
    if op.get_bind().dialect.name == "sqlite":
        now = now.replace(tzinfo=None)  # stored as naive UTC there (models.UTCDateTime)
    op.bulk_insert(channels, [{"id": 1, "name": "console", "kind": "console", "created_at": now}])
    op.bulk_insert(
        policies,
        [
            {
                "id": 1,
                "name": "default",
                "repeat": 2,
                "created_at": now,
                "description": "fresh-install default: the console, every 10 minutes, three rounds",
            }
        ],
    )
    op.bulk_insert(
        levels, [{"policy_id": 1, "position": 0, "ack_timeout_s": 600.0, "targets": ["console"]}]
    )
    if op.get_bind().dialect.name == "postgresql":  # explicit ids do not move the sequences
        for table in ("channels", "escalation_policies"):
            op.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT max(id) FROM {table}))"
            )


def downgrade() -> None:
    op.drop_index(op.f("ix_delivery_attempts_notification_id"), table_name="delivery_attempts")
    op.drop_table("delivery_attempts")
    op.drop_index(op.f("ix_verdicts_published_at"), table_name="verdicts")
    op.drop_index(op.f("ix_verdicts_page_id"), table_name="verdicts")
    op.drop_table("verdicts")
    op.drop_index(op.f("ix_page_events_page_id"), table_name="page_events")
    op.drop_table("page_events")
    op.drop_index("ix_notifications_status_due", table_name="notifications")
    op.drop_index(op.f("ix_notifications_page_id"), table_name="notifications")
    op.drop_table("notifications")
    op.drop_index(op.f("ix_alerts_page_id"), table_name="alerts")
    op.drop_table("alerts")
    op.drop_index(
        "uq_pages_open_group",
        table_name="pages",
        sqlite_where=sa.text("status <> 'resolved'"),
        postgresql_where=sa.text("status <> 'resolved'"),
    )
    op.drop_index(op.f("ix_pages_trajectory_id"), table_name="pages")
    op.drop_index("ix_pages_status_severity", table_name="pages")
    op.drop_index(op.f("ix_pages_next_escalation_at"), table_name="pages")
    op.drop_table("pages")
    op.drop_table("escalation_levels")
    op.drop_index(op.f("ix_silences_ends_at"), table_name="silences")
    op.drop_table("silences")
    op.drop_table("escalation_policies")
    op.drop_table("channels")
    op.drop_table("api_tokens")
