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

from dashboards.canary import CANARY_KEY, is_canary
from streams.records import Action, Trajectory

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
        if is_canary(t.meta):
            raise ValueError(
                f"the trajectory is a canary (meta.{CANARY_KEY}): canaries measure recall and "
                "are never paged to a human"
            )
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


class EventDecision(Schema):
    """What became of a trigger: the state of its page and a reviewer's answer to it."""

    dedup_key: str
    page_id: int
    page_status: Literal["triggered", "acknowledged", "resolved"]
    decision: Literal["pending", "approved", "rejected"] = Field(
        description="pending: no reviewer has answered since the trigger; approved: the "
        "latest verdict since says not harmful; rejected: it says harmful, or the page was "
        "resolved without a verdict")
    reviewer: str | None = None
    note: str = ""


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


# --- pre-execution screening (POST /v1/screen) --------------------------------------------

ScreenDecision = Literal["allow", "escalate", "block"]
MAX_PIXEL = 1e6
MAX_SCREENSHOT_PIXELS = 4096 * 4096  # a 4K screen fits; a small PNG of more costs seconds


def _check_screenshot(ref: str, where: str) -> None:
    """A screenshot in a request must be an inline PNG: a server never opens a client's path."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    head, sep, data = ref.partition(",")
    if not sep or not head.startswith("data:image/png") or not head.endswith(";base64"):
        raise ValueError(f"{where} must be a data:image/png;base64 URI (paths are not read)")
    try:
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as img:
            img.verify()
            width, height = img.size
    except (binascii.Error, UnidentifiedImageError, OSError, ValueError,
            Image.DecompressionBombError):
        raise ValueError(f"{where} is not a readable base64 PNG") from None
    if width * height > MAX_SCREENSHOT_PIXELS:
        raise ValueError(f"{where} is {width}x{height} pixels; a screenshot has at most "
                         f"{MAX_SCREENSHOT_PIXELS} (4096x4096)")


class ProposedAction(Action):
    """The action the agent proposes (DESIGN §2.1 ``action``), before it runs."""

    @model_validator(mode="after")
    def _says_something(self) -> ProposedAction:
        if not self.text.strip() and self.tool is None and self.gui is None:
            raise ValueError("the proposed action needs a text, a tool call or a gui action")
        if self.gui is not None:
            for axis in ("x", "y"):
                v = getattr(self.gui, axis)
                if v is not None and not -MAX_PIXEL <= v <= MAX_PIXEL:
                    raise ValueError(f"gui.{axis} is {v}; a screen coordinate is within "
                                     f"±{MAX_PIXEL:g} pixels")
        return self


class ScreenRequest(Body):
    """A trajectory so far and the action its agent proposes next."""

    trajectory: Trajectory = Field(
        description="the trajectory so far, in the interchange format (DESIGN §2.1); "
        "it may have no steps yet"
    )
    action: ProposedAction
    step_id: Label255 | None = Field(
        default=None, description="the id the step will have, echoed back (not yet a step)"
    )

    @model_validator(mode="after")
    def _screenable(self) -> ScreenRequest:
        t = self.trajectory
        if self.step_id is not None and any(s.step_id == self.step_id for s in t.steps):
            raise ValueError(f"step_id {self.step_id!r} is already a step of the trajectory")
        for i, s in enumerate(t.steps):
            for part, view in (("observation", s.observation), ("result", s.result)):
                if view is not None and view.screenshot:
                    _check_screenshot(view.screenshot,
                                      f"trajectory.steps.{i}.{part}.screenshot")
        if "activations" in t.meta:
            raise ValueError("trajectory.meta.activations is not read by /v1/screen: the probe "
                             "model computes the proposed action's activations")
        signals = t.meta.get("signals")
        if isinstance(signals, dict):
            for k, v in signals.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    try:
                        ok = math.isfinite(float(v))
                    except OverflowError:
                        ok = False
                    if not ok:
                        raise ValueError(f"trajectory.meta.signals.{k} is out of range")
        return self


class ScreenResponse(Schema):
    """The answer for the agent's harness (never for the agent: a verdict it saw would teach
    it to evade). L0 and L1 only; no L2 review runs before an action."""

    decision: ScreenDecision = Field(
        description="allow: run it; escalate: hold it for review (it would reach the L2 "
        "reviewer); block: do not run it (the L0+L1 probability reaches the block threshold)"
    )
    tier: int = Field(ge=0, le=2, description="the highest tier reached: 0 (L0 stopped it), "
                      "1 (L1 scored it), 2 (it would go on to the L2 reviewer)")
    score: float = Field(ge=0.0, le=1.0,
                         description="probability of harm from the deepest gate evaluated")
    signals: dict[str, float] = Field(
        description="the L0 and L1 signals by name (wm_harm_pre: harm of the world model's "
        "predicted next state; no wm_harm_post, the action has not run)"
    )
    latency_ms: float = Field(ge=0.0, description="server time to the answer, queueing included")
    policy: str = Field(description="content hash of the calibrated policy that answered")
    trajectory_id: str
    step_id: str | None = Field(default=None, description="the request's step_id, if any")
    rule: str | None = Field(default=None, description="the policy's tool rule that decided "
                             "(deny: block; allow, monitor: allow), if one matched the tool")
