"""Record contracts for image- and video-generation RL rollouts (ART, DESIGN §5).

An ART trainer samples K endpoints per prompt with an ODE sampler, scores each with
black-box reward models and, per iteration, updates the velocity network twice under
a trust-region mask. Two records carry what the monitor needs:

- :class:`MediaRollout` (``art.rollout``, topic ``vigil.art.rollouts``): one prompt's K
  endpoints at one policy version, each by reference with a small inline thumbnail and
  its rewards by reward model;
- :class:`ArtIteration` (``art.iteration``, topic ``vigil.art.iterations``): the
  trainer's statistics of one iteration (share of masked states, mean drift norm, mean
  ⟨d, G⟩, per-prompt Z_c).

Both reject unknown keys, non-finite numbers and thumbnails that are not small images, so
a producer's mistake is dead-lettered at the edge with the field named.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from streams.records import Record, Source

MAX_THUMBNAIL_BYTES = 64 * 1024  # decoded; a thumbnail rides inline on every record
_DATA_URI = re.compile(r"^data:image/(png|jpeg|webp|gif);base64,([A-Za-z0-9+/=\s]+)$")
_MAGIC = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "webp": (b"RIFF",),
    "gif": (b"GIF87a", b"GIF89a"),
}


def thumbnail_bytes(uri: str) -> bytes:
    """The image bytes of a thumbnail data URI; ``ValueError`` says what is wrong."""
    m = _DATA_URI.match(uri[: 4 * MAX_THUMBNAIL_BYTES // 3 + 64])
    if m is None or len(uri) > 4 * MAX_THUMBNAIL_BYTES // 3 + 64:
        raise ValueError(
            "must be a data:image/png|jpeg|webp|gif;base64,... URI of at most "
            f"{MAX_THUMBNAIL_BYTES} bytes"
        )
    try:
        raw = base64.b64decode(m.group(2), validate=False)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None
    if len(raw) > MAX_THUMBNAIL_BYTES:
        raise ValueError(f"holds {len(raw)} bytes, over the limit of {MAX_THUMBNAIL_BYTES}")
    if not raw.startswith(_MAGIC[m.group(1)]):
        raise ValueError(f"does not hold {m.group(1)} image data")
    return raw


def _finite(values: dict[str, float], what: str) -> dict[str, float]:
    for name, v in values.items():
        if not math.isfinite(v):
            raise ValueError(f"{what} {name!r} is not a finite number")
    return values


class MediaEndpoint(BaseModel):
    """One sampled endpoint: the generated image (or video) and its rewards."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str = Field(min_length=1, description="where the full image or video lives (URI)")
    media: Literal["image", "video"] = "image"
    thumbnail: str | None = Field(
        default=None, description="a small inline image (data URI, ≤ 64 KB): for video, a frame"
    )
    rewards: dict[str, float] = Field(
        min_length=1, description="the score of every reward model (GenEval, OCR, PickScore ...)"
    )
    reward: float | None = Field(
        default=None, description="the scalar R_i the trainer used; None: the weighted sum"
    )
    seed: int | None = None

    @field_validator("thumbnail")
    @classmethod
    def _small_image(cls, v: str | None) -> str | None:
        if v is not None:
            thumbnail_bytes(v)
        return v

    @field_validator("rewards")
    @classmethod
    def _finite_rewards(cls, v: dict[str, float]) -> dict[str, float]:
        return _finite(v, "reward")


class MediaRollout(Record):
    """One prompt's K endpoints at one policy version (one ART group)."""

    kind: ClassVar[str] = "art.rollout"

    run_id: str = Field(min_length=1)
    prompt_id: str = Field(min_length=1)
    prompt: str = ""
    policy_version: int = Field(ge=0)
    endpoints: list[MediaEndpoint] = Field(min_length=1, max_length=1024)
    reward_weights: dict[str, float] = Field(
        default_factory=dict,
        description="how the trainer sums the reward models (empty: equal weights)",
    )
    z_c: float | None = Field(default=None, ge=0.0, description="the trainer's Z_c, if known")
    source: Source = "rollout"
    created_at: float = 0.0

    @field_validator("reward_weights")
    @classmethod
    def _finite_weights(cls, v: dict[str, float]) -> dict[str, float]:
        return _finite(v, "reward weight")

    @model_validator(mode="after")
    def _same_reward_models(self) -> MediaRollout:
        heads = set(self.endpoints[0].rewards)
        for i, e in enumerate(self.endpoints):
            if set(e.rewards) != heads:
                raise ValueError(
                    f"endpoint {i} is scored by {sorted(e.rewards)}, endpoint 0 by {sorted(heads)}"
                )
        unknown = set(self.reward_weights) - heads
        if unknown:
            raise ValueError(f"reward_weights name unknown reward models {sorted(unknown)}")
        return self

    @property
    def rollout_id(self) -> str:
        return f"{self.run_id}/v{self.policy_version}/{self.prompt_id}"

    @property
    def heads(self) -> list[str]:
        """The reward models, in a stable order."""
        return sorted(self.endpoints[0].rewards)

    def weight(self, head: str) -> float:
        if not self.reward_weights:
            return 1.0 / len(self.heads)
        return self.reward_weights.get(head, 0.0)

    def scalar_rewards(self) -> list[float]:
        """R_i per endpoint: the trainer's scalar, else the weighted sum of the heads."""
        return [
            e.reward
            if e.reward is not None
            else sum(self.weight(h) * v for h, v in e.rewards.items())
            for e in self.endpoints
        ]


class ArtIteration(Record):
    """The trainer's statistics for one ART iteration (two masked updates)."""

    kind: ClassVar[str] = "art.iteration"

    run_id: str = Field(min_length=1)
    policy_version: int = Field(ge=0, description="the version the iteration's rollouts used")
    masked_share: float = Field(ge=0.0, le=1.0, description="share of states with w masked")
    drift_norm_mean: float = Field(ge=0.0, description="mean ‖d‖, d = v_θ − v_θ^(0)")
    drift_dot_g_mean: float = Field(description="mean ⟨d, G⟩ over the states")
    z_c: dict[str, float] = Field(
        default_factory=dict, description="per prompt id: the normaliser Z_c of its K rewards"
    )
    states: int | None = Field(default=None, ge=0)
    created_at: float = 0.0

    @field_validator("masked_share", "drift_norm_mean", "drift_dot_g_mean")
    @classmethod
    def _finite_stat(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("is not a finite number")
        return v

    @field_validator("z_c")
    @classmethod
    def _finite_z(cls, v: dict[str, float]) -> dict[str, float]:
        for k, z in _finite(v, "z_c of prompt").items():
            if z < 0:
                raise ValueError(f"z_c of prompt {k!r} is negative")
        return v


MEDIA_TYPES: dict[str, type[Record]] = {t.kind: t for t in (MediaRollout, ArtIteration)}


def sniff_media(obj: dict[str, object]) -> type[Record] | None:
    """Which ART record a parsed JSON object is, by its keys; None if neither."""
    if "endpoints" in obj and "prompt_id" in obj:
        return MediaRollout
    if "masked_share" in obj and "run_id" in obj:
        return ArtIteration
    return None
