"""HTTP schemas: one family per entity (``PageCreate``-style inputs, ``PagePublic`` outputs).

Request bodies derive from :class:`Body`, which refuses what a database would
choke on later (NUL characters, unpaired surrogates, NaN and infinities), so
bad input is one clear 422 and never a 500.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from streams.records import Trajectory

Severity = Literal["critical", "error", "warning", "info"]
Role = Literal["producer", "reviewer", "admin"]
EventAction = Literal["trigger", "acknowledge", "resolve"]
MATCHER_NAMES = (
    "severity",
    "source",
    "component",
    "group",
    "class",
    "policy",
    "trajectory_id",
    "execution_id",
)
MatcherName = Literal[
    "severity", "source", "component", "group", "class", "policy", "trajectory_id", "execution_id"
]
MAX_ID = 2**31 - 1

Name = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$", max_length=100)
]
Text1k = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
Label255 = Annotated[str, StringConstraints(min_length=1, max_length=255)]
DbId = Annotated[int, Field(ge=1, le=MAX_ID)]


def _bounded_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not 2000 <= value.year <= 9000 or not 2000 <= value.astimezone(UTC).year <= 9000:
        raise ValueError("timestamps must fall between the years 2000 and 9000")
    return value.astimezone(UTC)


Timestamp = Annotated[datetime, AfterValidator(_bounded_utc)]


MAX_DEPTH = 64


def check_storable(value: Any, where: str = "body", depth: int = 0) -> None:
    """Raise ValueError naming the first value a database cannot store faithfully (NUL
    characters, unpaired surrogates, NaN or infinities, nesting deeper than 64 levels)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where} contains a NUL (U+0000) character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where} contains an unpaired surrogate") from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value}; numbers must be finite")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_storable(k, f"{where} key", depth + 1)
            check_storable(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_storable(v, f"{where}.{i}", depth + 1)


class Schema(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Body(Schema):
    """Base of request bodies: unknown keys are refused, values must be storable."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        check_storable(data)
        return data


# --- errors -------------------------------------------------------------------


class Problem(Schema):
    detail: str = Field(description="one sentence: what is wrong")


class ValidationProblem(Schema):
    detail: str = Field(description="one sentence naming the first bad field")
    errors: list[dict[str, Any]] = Field(
        default_factory=list, description="every validation error, as pydantic says"
    )


# --- events (PagerDuty Events v2 in spirit) --------------------------------------


class TierScore(Schema):
    """One tier's score for the flagged step (the worker's ``Score`` record fits)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    tier: int = Field(ge=0, le=3)
    score: float = Field(ge=0.0, le=1.0)
    flagged: bool | None = None
    threshold: float | None = None
    signals: dict[str, float] = Field(default_factory=dict)


class CaseDetails(Schema):
    """``payload.custom_details``: the case a reviewer will see. Extra keys are kept."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    trajectory: Trajectory | None = Field(
        default=None, description="the trajectory so far, in the interchange format (DESIGN §2.1)"
    )
    trajectory_id: Label255 | None = None
    execution_id: Label255 | None = None
    step_id: Label255 | None = Field(default=None, description="the flagged step")
    scores: list[TierScore] = Field(default_factory=list, max_length=16)
    rubric: dict[str, Any] | None = Field(
        default=None, description="the L2 reviewer's rubric verdict, if it ran"
    )

    @model_validator(mode="after")
    def _consistent(self) -> CaseDetails:
        t = self.trajectory
        if t is None:
            return self
        if self.trajectory_id is None:
            self.trajectory_id = t.trajectory_id
        elif self.trajectory_id != t.trajectory_id:
            raise ValueError(
                f"trajectory_id {self.trajectory_id!r} differs from the trajectory's "
                f"{t.trajectory_id!r}"
            )
        if self.step_id is not None and all(s.step_id != self.step_id for s in t.steps):
            raise ValueError(
                f"step_id {self.step_id!r} is not a step of trajectory {t.trajectory_id!r}"
            )
        return self


class EventPayload(Schema):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    summary: Text1k = Field(description="one line a reviewer reads first")
    source: Label255 = Field(description="where it happened: rollout, deployment, a host ...")
    severity: Severity
    timestamp: Timestamp | None = None
    component: Label255 | None = None
    group: Label255 | None = Field(
        default=None, description="groups pages explicitly (default: execution, then trajectory)"
    )
    class_: Label255 | None = Field(default=None, alias="class")
    custom_details: CaseDetails = Field(default_factory=CaseDetails)


class EventCreate(Body):
    routing_key: Name | None = Field(
        default=None, description="escalation policy name (default: the configured policy)"
    )
    event_action: EventAction
    dedup_key: Label255 | None = Field(
        default=None,
        description="client-chosen, e.g. trajectory_id/step_id; a trigger with a known key "
        "never opens a second page",
    )
    payload: EventPayload | None = None

    @model_validator(mode="after")
    def _needs(self) -> EventCreate:
        if self.event_action == "trigger" and self.payload is None:
            raise ValueError("a trigger event needs a payload")
        if self.event_action != "trigger" and self.dedup_key is None:
            raise ValueError(f"an {self.event_action} event needs the dedup_key of its trigger")
        return self


class EventAccepted(Schema):
    status: Literal["success"] = "success"
    message: str
    dedup_key: str


# --- pages ----------------------------------------------------------------------


class AlertPublic(Schema):
    id: int
    dedup_key: str
    summary: str
    severity: Severity
    trajectory_id: str | None
    step_id: str | None
    trigger_count: int
    created_at: datetime
    last_triggered_at: datetime


class AlertDetail(AlertPublic):
    details: dict[str, Any]


class PageEventPublic(Schema):
    at: datetime
    kind: str
    actor: str | None
    message: str


class VerdictPublic(Schema):
    id: int
    page_id: int
    reviewer: str
    harmful: bool
    category: str | None
    note: str
    created_at: datetime
    published_at: datetime | None


class PagePublic(Schema):
    id: int
    status: Literal["triggered", "acknowledged", "resolved"]
    severity: Severity
    summary: str
    source: str
    group_key: str
    trajectory_id: str | None
    execution_id: str | None
    policy_name: str | None
    level: int
    loop: int
    next_escalation_at: datetime | None
    silence_id: int | None
    trigger_count: int
    alert_count: int
    opened_at: datetime
    last_triggered_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str | None
    resolved_at: datetime | None
    resolved_by: str | None


class PageDetail(PagePublic):
    labels: dict[str, Any]
    alerts: list[AlertDetail]
    events: list[PageEventPublic]
    verdicts: list[VerdictPublic]


class PageList(Schema):
    count: int = Field(description="pages matching the filter, before limit and offset")
    items: list[PagePublic]


class DeliveryAttemptPublic(Schema):
    attempt: int
    at: datetime
    duration_ms: float
    status_code: int | None
    ok: bool
    error: str | None


class NotificationPublic(Schema):
    id: int
    page_id: int
    channel_name: str
    event: str
    level: int
    status: Literal["pending", "delivered", "failed", "cancelled"]
    attempts: int
    due_at: datetime
    created_at: datetime
    delivered_at: datetime | None
    last_error: str | None
    deliveries: list[DeliveryAttemptPublic]


# --- verdicts ---------------------------------------------------------------------


class VerdictCreate(Body):
    page_id: DbId
    harmful: bool
    category: Annotated[str, StringConstraints(min_length=1, max_length=100)] | None = None
    note: Annotated[str, StringConstraints(max_length=10_000)] = ""


# --- escalation policies and channels ---------------------------------------------


class LevelSpec(Schema):
    model_config = ConfigDict(extra="forbid", from_attributes=True, allow_inf_nan=False)

    ack_timeout_s: float = Field(
        ge=0.05, le=7 * 86400, description="escalate to the next level if not acknowledged by then"
    )
    targets: list[Name] = Field(min_length=1, max_length=20, description="channel names")


class PolicyUpdate(Body):
    description: Annotated[str, StringConstraints(max_length=2000)] = ""
    repeat: int = Field(default=0, ge=0, le=9, description="extra rounds after the last level")
    levels: list[LevelSpec] = Field(min_length=1, max_length=20)


class PolicyCreate(PolicyUpdate):
    name: Name


class PolicyPublic(Schema):
    id: int
    name: str
    description: str
    repeat: int
    levels: list[LevelSpec]
    created_at: datetime


class ChannelCreate(Body):
    name: Name
    kind: Literal["webhook", "console"]
    url: Annotated[str, StringConstraints(max_length=2000)] | None = None
    secret: Annotated[str, StringConstraints(min_length=16, max_length=500)] | None = Field(
        default=None, description="HMAC-SHA256 key for the X-Vigil-Signature-256 header"
    )

    @model_validator(mode="after")
    def _complete(self) -> ChannelCreate:
        if self.kind == "webhook":
            if not self.url or not self.secret:
                raise ValueError("a webhook channel needs a url and a secret")
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"url {self.url!r} is not an http(s) URL with a host")
            if re.search(r"\s", self.url):
                raise ValueError("url may not contain whitespace")
        elif self.url or self.secret:
            raise ValueError("a console channel takes no url or secret")
        return self


class ChannelPublic(Schema):
    id: int
    name: str
    kind: str
    url: str | None
    created_at: datetime


# --- silences -------------------------------------------------------------------------


class Matcher(Schema):
    model_config = ConfigDict(extra="forbid", from_attributes=True)

    name: MatcherName
    value: Annotated[str, StringConstraints(max_length=1000)]
    regex: bool = Field(default=False, description="value is a regular expression (anchored)")
    equal: bool = Field(default=True, description="false: match pages that do NOT match")

    @model_validator(mode="after")
    def _compiles(self) -> Matcher:
        if self.regex:
            try:
                re.compile(self.value)
            except re.error as e:
                raise ValueError(f"matcher {self.name!r}: bad regular expression: {e}") from None
        return self


class SilenceCreate(Body):
    matchers: list[Matcher] = Field(min_length=1, max_length=20)
    starts_at: Timestamp | None = Field(default=None, description="default: now")
    ends_at: Timestamp | None = None
    duration_s: float | None = Field(default=None, gt=0, le=366 * 86400)
    comment: Annotated[str, StringConstraints(min_length=1, max_length=2000)]

    @model_validator(mode="after")
    def _one_end(self) -> SilenceCreate:
        if (self.ends_at is None) == (self.duration_s is None):
            raise ValueError("give exactly one of ends_at and duration_s")
        return self


class SilencePublic(Schema):
    id: int
    matchers: list[Matcher]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    active: bool


# --- tokens -----------------------------------------------------------------------------


class TokenCreate(Body):
    name: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    role: Role


class TokenPublic(Schema):
    id: int
    name: str
    role: Role
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


class TokenCreated(TokenPublic):
    token: str = Field(description="shown once; only its hash is stored")


class Me(Schema):
    name: str
    role: Role
