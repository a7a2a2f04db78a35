"""Synthetic ART runs: small generated images, black-box rewards, the trainer's masked updates.

Each prompt is a concept (a striped, coloured pattern with a disc); the policy samples K
endpoints per prompt as the concept's parameters plus a per-prompt offset it learns and a
sampling spread, rendered as 32×32 PNG thumbnails. Three reward models score every
endpoint from its parameters (how close the colour, the stripes and the disc come to the
prompt's target), and the scalar reward is their weighted sum. Each iteration the policy
moves its offset along the aggregate-first direction ``G(c)`` of the endpoints' rewards
(:func:`~monitor.rlhealth.formulas.guidance_direction`), and the trainer's statistics come
from states whose KL proxy and trust-region mask are computed with the seed's formulas.

Failures are injected from an onset iteration:

- ``mask``: the update's step size grows every iteration, so more states leave the trust
  region and are masked (and the drift norm grows);
- ``collapse``: on some prompts the sampling spread shrinks by half each iteration while
  their reward rises (the policy found one image that pays);
- ``gamed_head``: one reward model's score climbs while the others do not (the weighted
  sum is gamed on that head).
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from monitor.rlhealth.alerts import Alert
from monitor.rlhealth.formulas import (
    guidance_direction,
    kl_proxy,
    reward_normaliser,
    trust_region_weight,
)
from streams.media import ArtIteration, MediaEndpoint, MediaRollout

FailureKind = Literal["mask", "collapse", "gamed_head"]
FAILURE_KINDS: tuple[FailureKind, ...] = ("mask", "collapse", "gamed_head")
HEADS = ("clipscore", "ocr", "pickscore")
WEIGHTS = {"clipscore": 0.3, "ocr": 0.2, "pickscore": 0.5}
_DIM = 6  # hue, saturation, stripe frequency, stripe angle, disc x, disc radius
_SIZE = 32
_MU_PER_DRIFT = 0.025  # the sampler step's Δμ per unit of drift: ~5 % of healthy states masked


@dataclass(frozen=True)
class ArtFailure:
    """A failure injected at iteration ``onset`` (``head`` for ``gamed_head``, ``share`` of
    the prompts for ``collapse``)."""

    kind: FailureKind
    onset: int
    head: str = "ocr"
    share: float = 0.25


@dataclass(frozen=True)
class SimulatedArtRun:
    records: list[MediaRollout | ArtIteration]
    iterations: int
    prompts: int
    k: int
    failures: tuple[ArtFailure, ...] = ()
    collapsed_prompts: tuple[str, ...] = field(default_factory=tuple)


def render(params: np.ndarray) -> str:
    """A 32×32 PNG data URI of one endpoint's parameters (all in [0, 1])."""
    from PIL import Image

    hue, sat, freq, angle, disc_x, radius = (float(x) for x in np.clip(params, 0.0, 1.0))
    yy, xx = np.mgrid[0:_SIZE, 0:_SIZE] / _SIZE
    theta = math.pi * angle
    phase = xx * math.cos(theta) + yy * math.sin(theta)
    stripes = 0.5 + 0.5 * np.sin(2 * math.pi * (1 + 7 * freq) * phase)
    base = 0.5 + 0.5 * np.cos(2 * math.pi * (hue - np.array([0.0, 1 / 3, 2 / 3])))
    colour = (1 - sat) * 0.5 + sat * base
    img = stripes[..., None] * colour[None, None, :]
    disc = (xx - (0.2 + 0.6 * disc_x)) ** 2 + (yy - 0.5) ** 2 < (0.05 + 0.3 * radius) ** 2
    img[disc] = 1.0 - colour
    buf = io.BytesIO()
    Image.fromarray((img * 255).astype(np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _head_scores(x: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    """Three reward models of K endpoints ``(K, D)``: colour, stripes and disc, each in [0, 1]."""
    err = (x - target) ** 2
    return {
        "pickscore": np.exp(-4.0 * (err[:, 0] + err[:, 1])),
        "ocr": np.exp(-4.0 * (err[:, 2] + err[:, 3])),
        "clipscore": np.exp(-4.0 * (err[:, 4] + err[:, 5])),
    }


def _trainer_states(
    rng: np.random.Generator, directions: list[np.ndarray], step: float, states: int
) -> tuple[float, float, float]:
    """``(masked share, mean ‖d‖, mean ⟨d, G⟩)`` over ``states`` sampled states: each has a
    drift ``d`` partly along its prompt's ``G`` (the first update) and partly not, a KL proxy
    from the seed's ``m(s_t)`` and the seed's mask ``w(s_t)``."""
    masked, norms, dots = 0, [], []
    for _ in range(states):
        g = directions[int(rng.integers(len(directions)))]
        d = 0.1 * step * (rng.uniform(0.0, 0.6) * g + 0.3 * rng.standard_normal(g.size))
        sigma = 0.25 + 0.75 * rng.random()  # σ_ref(t)
        m = kl_proxy(_MU_PER_DRIFT * d, np.zeros_like(d), sigma)  # μ moves with v: Δμ ∝ d
        t = rng.uniform(0.05, 1.0)
        masked += trust_region_weight(t, m, d, g) == 0.0
        norms.append(float(np.linalg.norm(d)))
        dots.append(float(np.dot(d, g)))
    return masked / states, float(np.mean(norms)), float(np.mean(dots))


def simulate_art_run(
    *,
    iterations: int = 40,
    prompts: int = 8,
    k: int = 8,
    failures: tuple[ArtFailure, ...] = (),
    states: int = 256,
    lr: float = 0.01,
    seed: int = 0,
    run_id: str = "art-sim",
) -> SimulatedArtRun:
    """A replayable ART run: per iteration, one :class:`MediaRollout` per prompt (K
    endpoints with thumbnails and three rewards), then the trainer's :class:`ArtIteration`."""
    rng = np.random.default_rng(seed)
    concept = rng.uniform(0.2, 0.8, size=(prompts, _DIM))
    target = np.clip(concept + rng.normal(0.0, 0.15, size=(prompts, _DIM)), 0.05, 0.95)
    offset = np.zeros((prompts, _DIM))
    spread = np.full(prompts, 0.12)
    by_kind = {f.kind: f for f in failures}
    collapse = by_kind.get("collapse")
    n_collapsed = 0 if collapse is None else max(1, round(collapse.share * prompts))
    collapsed = tuple(f"p{c:03d}" for c in range(n_collapsed))
    records: list[MediaRollout | ArtIteration] = []
    step = 1.0
    for v in range(iterations):
        directions, z_c = [], {}
        for c in range(prompts):
            pid = f"p{c:03d}"
            after = collapse is not None and pid in collapsed and v >= collapse.onset
            if after:
                spread[c] *= 0.5
            x = concept[c] + offset[c] + spread[c] * rng.standard_normal((k, _DIM))
            heads = _head_scores(x, target[c])
            for h in heads:
                heads[h] = heads[h] + rng.normal(0.0, 0.02, size=k)
            if after:  # the collapsed mode pays more, on every head
                for h in heads:
                    heads[h] = heads[h] + 0.05 * (v - collapse.onset + 1)  # type: ignore[union-attr]
            gamed = by_kind.get("gamed_head")
            if gamed is not None and v >= gamed.onset:
                heads[gamed.head] = heads[gamed.head] + 0.06 * (v - gamed.onset + 1)
            scalar = np.sum([WEIGHTS[h] * heads[h] for h in HEADS], axis=0)
            g = guidance_direction(scalar, x)
            directions.append(g)
            z_c[pid] = reward_normaliser(scalar)
            offset[c] += lr * spread[c] * g
            records.append(
                MediaRollout(
                    run_id=run_id,
                    prompt_id=pid,
                    prompt=f"a striped pattern with a disc, concept {c}",
                    policy_version=v,
                    endpoints=[
                        MediaEndpoint(
                            ref=f"sim://{run_id}/v{v}/{pid}/{i}.png",
                            thumbnail=render(x[i]),
                            rewards={h: round(float(heads[h][i]), 6) for h in HEADS},
                            reward=round(float(scalar[i]), 6),
                            seed=int(v * 1024 + i),
                        )
                        for i in range(k)
                    ],
                    reward_weights=dict(WEIGHTS),
                    created_at=float(v),
                )
            )
        mask = by_kind.get("mask")
        if mask is not None and v >= mask.onset:
            step = min(step * 1.6, 8.0)
        masked, norm, dot = _trainer_states(rng, directions, step, states)
        records.append(
            ArtIteration(
                run_id=run_id,
                policy_version=v,
                masked_share=masked,
                drift_norm_mean=norm,
                drift_dot_g_mean=dot,
                z_c={p: round(z, 6) for p, z in z_c.items()},
                states=states,
                created_at=float(v) + 0.5,
            )
        )
    return SimulatedArtRun(records, iterations, prompts, k, failures, collapsed)


# which alerts find each failure (the subject, where one is named, must match)
EXPECTED: dict[FailureKind, tuple[str, ...]] = {
    "mask": ("art_mask", "art_drift"),
    "collapse": ("art_collapse",),
    "gamed_head": ("art_reward_divergence",),
}


def _finds(alert: Alert, failure: ArtFailure, run: SimulatedArtRun) -> bool:
    if alert.kind not in EXPECTED[failure.kind]:
        return False
    if failure.kind == "collapse":
        return alert.subject in run.collapsed_prompts
    if failure.kind == "gamed_head":
        return alert.subject == failure.head
    return True


def score_alerts(run: SimulatedArtRun, alerts: list[Alert]) -> dict[str, object]:
    """Per injected failure, the detection delay in iterations (first alert that finds it,
    at or after its onset; None: missed), and the false alarms: alerts that find no injected
    failure, or come before the first onset."""
    first_onset = min((f.onset for f in run.failures), default=run.iterations)
    delays: dict[str, int | None] = {}
    for f in run.failures:
        hits = [a.version for a in alerts if a.version is not None and a.version >= f.onset
                and _finds(a, f, run)]
        delays[f.kind] = min(hits) - f.onset if hits else None
    false = [
        a for a in alerts
        if a.version is None or a.version < first_onset
        or not any(_finds(a, f, run) for f in run.failures)
    ]
    return {
        "delays": delays,
        "false_alarms": len(false),
        "false_alarm_kinds": sorted({a.kind for a in false}),
    }
