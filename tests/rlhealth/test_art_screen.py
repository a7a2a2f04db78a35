"""Screening generated images (ART): every endpoint is a step the tiers score, with the
shipped world model reading its thumbnail through the vision tower and the L0 rules reading
its prompt; and the vision tower alone embeds images for the mode-collapse signal."""

from __future__ import annotations

import base64
import io
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monitor.pipeline import Screener, StepVerdict, load_screener
from monitor.rlhealth.art_steps import media_step_events
from monitor.screening import ScreenStep, screen_step_of
from monitor.shipped import shipped_dir, shipped_policy
from monitor.stream.history import TrajectoryHistory
from monitor.stream.screen import StepHistories
from streams.media import MediaEndpoint, MediaRollout
from streams.records import StepEvent, decode, encode
from worldmodel.vision import ImageEmbedder

BUNDLE = shipped_dir() / "worldmodel"
PROMPT = "a striped poster with a red disc"


def png(pixels: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def pattern(hue: float, freq: float, disc_x: float, size: int = 32) -> np.ndarray:
    """A 32×32 RGB pattern: coloured stripes and a disc in the complementary colour."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    stripes = 0.5 + 0.5 * np.sin(2 * math.pi * (1 + 7 * freq) * (xx + 0.3 * yy))
    colour = 0.5 + 0.5 * np.cos(2 * math.pi * (hue - np.array([0.0, 1 / 3, 2 / 3])))
    img = stripes[..., None] * colour
    img[(xx - (0.2 + 0.6 * disc_x)) ** 2 + (yy - 0.5) ** 2 < 0.04] = 1.0 - colour
    return img * 255


def rollout(thumbnails: Sequence[str | None], *, version: int = 0, prompt: str = PROMPT,
            prompt_id: str = "p0") -> MediaRollout:
    return MediaRollout(
        run_id="run-1", prompt_id=prompt_id, prompt=prompt, policy_version=version,
        endpoints=[MediaEndpoint(ref=f"s3://art/run-1/v{version}/{prompt_id}/{i}.png",
                                 thumbnail=t, seed=version * 1024 + i,
                                 rewards={"clipscore": 0.61 + 0.01 * i, "ocr": 0.2})
                   for i, t in enumerate(thumbnails)],
        reward_weights={"clipscore": 0.7, "ocr": 0.3})


def screen_steps(events: Sequence[StepEvent]) -> list[ScreenStep]:
    """The steps as the stream's screen stage builds them: each with the earlier steps of
    its trajectory that it has seen."""
    history = TrajectoryHistory()
    out = []
    for e in events:
        out.append(screen_step_of(e, history.before(e)))
        history.add(e.trajectory_id, [(e.step, None)])
    return out


@pytest.fixture(scope="module")
def screener() -> Screener:
    policy = shipped_policy()
    assert policy is not None, "no shipped models: make models"
    return load_screener(policy, reviewer=False)


@pytest.fixture(scope="module")
def embedder() -> ImageEmbedder:
    return ImageEmbedder.load(BUNDLE)


# --- the image embedder ----------------------------------------------------------------------


def test_distinct_images_embed_apart_and_a_perturbed_copy_close(
    embedder: ImageEmbedder, tmp_path: Path
) -> None:
    a = pattern(0.05, 0.2, 0.3)
    b = pattern(0.6, 0.8, 0.8)
    noisy = a + np.random.default_rng(0).normal(0.0, 6.0, a.shape)
    z = embedder.embed([png(a), png(b), png(noisy)])
    assert z.shape == (3, embedder.config.latent_dim) and z.dtype == np.float32
    assert np.allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    far, near = np.linalg.norm(z[0] - z[1]), np.linalg.norm(z[0] - z[2])
    assert far > 5 * near > 0

    # a file read by its path embeds as its data URI does, whatever the batch size
    Image.fromarray(a.astype(np.uint8)).save(tmp_path / "a.png")
    one_by_one = ImageEmbedder.load(BUNDLE, batch_size=1, image_base=tmp_path)
    assert np.allclose(one_by_one.embed(["a.png", png(b)]), z[:2], atol=1e-5)


def test_a_narrower_spread_of_images_has_a_smaller_mean_pairwise_distance(
    embedder: ImageEmbedder,
) -> None:
    """What the mode-collapse signal measures: K images drawn around one concept with a
    shrinking spread come closer together in the embedding."""
    rng = np.random.default_rng(1)

    def spread_of(concept: np.ndarray, spread: float) -> float:
        params = np.clip(concept + spread * rng.standard_normal((8, 3)), 0.0, 1.0)
        z = embedder.embed([png(pattern(*p)) for p in params])
        d = np.linalg.norm(z[:, None] - z[None], axis=-1)
        return float(d[np.triu_indices(8, 1)].mean())

    for concept in rng.uniform(0.25, 0.75, size=(3, 3)):
        wide, narrow, collapsed = (spread_of(concept, s) for s in (0.12, 0.01, 0.0))
        assert wide > 3 * narrow > 0 and collapsed < 1e-6


def test_a_bundle_without_a_vision_tower_is_refused_in_one_sentence(tmp_path: Path) -> None:
    cfg = json.loads((BUNDLE / "config.json").read_text())
    cfg["model"]["use_images"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shutil.copy(BUNDLE / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="has no vision tower"):
        ImageEmbedder.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a world-model bundle"):
        ImageEmbedder.load(tmp_path / "missing")


# --- endpoints as steps ---------------------------------------------------------------------


def test_every_endpoint_is_a_step_of_the_prompts_trajectory() -> None:
    thumbs = [png(pattern(0.1 * i, 0.3, 0.5)) for i in range(3)]
    r = rollout([*thumbs[:2], None], version=2)
    events = media_step_events(r)
    assert [e.trajectory_id for e in events] == ["art/run-1/p0"] * 3
    assert [e.step.step_id for e in events] == ["v2-e0", "v2-e1", "v2-e2"]
    assert [e.step.index for e in events] == [2048, 2049, 2050]  # after every v1 step
    assert [e.final for e in events] == [False, False, True]  # the group ends, not the prompt
    assert {e.meta["execution_id"] for e in events} == {"run-1/v2/p0"}
    first = events[0]
    assert (first.source, first.task) == ("rollout", PROMPT)
    tool = first.step.action.tool
    assert tool is not None and tool.name == "generate_image"
    assert tool.arguments == {"prompt": PROMPT, "seed": 2048}
    assert PROMPT in first.step.action.text
    assert first.step.result is not None and first.step.result.screenshot == thumbs[0]
    assert "clipscore 0.610, ocr 0.200; reward 0.487" in first.step.result.text
    assert events[2].step.result is not None and events[2].step.result.screenshot is None
    # each step sees what the one before produced, as text
    assert events[1].step.observation.text == first.step.result.text
    assert events[1].step.observation.screenshot is None
    media = (first.step.model_extra or {})["media"]
    assert media == {"run_id": "run-1", "prompt_id": "p0", "policy_version": 2, "endpoint": 0,
                     "endpoints": 3, "kind": "image", "ref": "s3://art/run-1/v2/p0/0.png",
                     "seed": 2048, "rewards": {"clipscore": 0.61, "ocr": 0.2},
                     "reward": pytest.approx(0.487)}
    assert decode(encode(first), StepEvent) == first  # the media rides the steps topic

    video = r.model_copy(update={"endpoints": [r.endpoints[0].model_copy(
        update={"media": "video"})]})
    [step] = media_step_events(video)
    assert step.step.action.tool is not None and step.step.action.tool.name == "generate_video"


def test_the_stream_keeps_a_prompts_history_across_policy_versions() -> None:
    """A group's last endpoint closes its execution (one rollout verdict per group) but not the
    prompt's trajectory: the next version's endpoints are screened against the earlier ones."""
    thumbs = [png(pattern(0.2, 0.4, 0.1 * i)) for i in range(3)]
    histories = StepHistories(100)
    v0 = media_step_events(rollout(thumbs, version=0))
    steps, pending = histories.steps(v0)
    histories.commit(v0, pending)
    assert [s.step_id for s in steps[2].history] == ["v0-e0", "v0-e1"]
    v1 = media_step_events(rollout(thumbs, version=1))
    steps, pending = histories.steps(v1)
    histories.commit(v1, pending)
    assert [s.step_id for s in steps[0].history] == ["v0-e0", "v0-e1", "v0-e2"]
    assert [s.step_id for s in steps[2].history] == ["v0-e1", "v0-e2", "v1-e0", "v1-e1"]
    # a final step that ends its own trajectory still frees its history
    ended = v0[-1].model_copy(update={"trajectory_id": "t-done", "meta": {}})
    _, pending = histories.steps([ended])
    histories.commit([ended], pending)
    assert histories.history.before(ended) == []


# --- L0 with the shipped models -----------------------------------------------------------


def _l0(screener: Screener, r: MediaRollout) -> list[StepVerdict]:
    return screener.screen(screen_steps(media_step_events(r)), through=0)


def test_l0_reads_the_generated_image_through_the_vision_tower(screener: Screener) -> None:
    """Same prompt, same rewards, same texts: only the last endpoint's thumbnail differs, and
    the world model's surprise and post-action harm move with it; the text signals do not."""
    bright = png(pattern(0.1, 0.3, 0.5))
    earlier = [png(pattern(0.1, 0.3, 0.1 * i)) for i in range(3)]
    got = {name: _l0(screener, rollout([*earlier, last]))[-1]
           for name, last in (("bright", bright), ("dark", png(np.zeros((32, 32, 3)))),
                              ("none", None))}
    for v in got.values():
        assert v.tier in (0, 1) and 0.0 <= v.score <= 1.0
        assert {"wm_surprise", "wm_harm_post", "rule_destructive"} <= set(v.signals)
    image_signals = ("wm_surprise", "wm_harm_post")
    for a, b in (("bright", "dark"), ("bright", "none"), ("dark", "none")):
        assert any(abs(got[a].signals[k] - got[b].signals[k]) > 1e-3 for k in image_signals), (
            a, b)
        assert got[a].score != got[b].score
        for k in ("wm_harm_pre", "wm_relational_harm", "rule_destructive"):
            assert got[a].signals[k] == pytest.approx(got[b].signals[k], abs=1e-5), k


def test_a_prompt_the_rules_match_scores_higher_at_l0(screener: Screener) -> None:
    thumbs = [png(pattern(0.3, 0.5, 0.1 * i)) for i in range(3)]
    plain = _l0(screener, rollout(thumbs))
    wiping = _l0(screener, rollout(
        thumbs, prompt="a poster telling admins to wipe the backups and delete every user"))
    for p, w in zip(plain, wiping, strict=True):
        assert (p.signals["rule_destructive"], w.signals["rule_destructive"]) == (0.0, 1.0)
        assert w.score > p.score
