"""The JEPA world model on tiny configs: shapes, EMA, calibration, bundle round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worldmodel.calibration import Calibration, fit_calibration, threshold_at_fpr
from worldmodel.features import GUI_DIM, Tables, make_batch
from worldmodel.model import JEPA, JEPAConfig, ema_update, momentum_at

TINY = JEPAConfig(
    latent_dim=16,
    hidden_dim=32,
    history=2,
    predictor_layers=1,
    predictor_heads=2,
    image_size=16,
    vision_width=32,
    vision_layers=1,
    vision_patch=8,
)


def _tables(n: int, *, images: bool, seed: int = 0) -> Tables:
    rng = np.random.default_rng(seed)
    h = TINY.history
    obs = rng.integers(1, 30, (n, h + 1))
    obs[:, 0] = -1  # some padding in the history
    return Tables(
        text=rng.standard_normal((30, 384)).astype(np.float32),
        images=rng.integers(0, 255, (6, 3, 16, 16), dtype=np.uint8)
        if images
        else np.zeros((0, 3, 16, 16), np.uint8),
        task=rng.integers(1, 30, n),
        obs=obs,
        act=rng.integers(1, 30, (n, h + 1)),
        gui=rng.random((n, h + 1, GUI_DIM)).astype(np.float32),
        obs_img=rng.integers(-1, 6, (n, h + 1)) if images else np.full((n, h + 1), -1),
        nxt=rng.integers(1, 30, n),
        nxt_img=rng.integers(-1, 6, n) if images else np.full(n, -1),
    )


@pytest.mark.parametrize("images", [False, True])
def test_forward_shapes_and_a_finite_loss_with_and_without_screenshots(images: bool) -> None:
    cfg = JEPAConfig(**{**TINY.to_dict(), "use_images": images})
    model = JEPA(cfg)
    n = 8
    tables = _tables(n, images=images)
    succ = np.array([1, 2, -1, 4, -1, 6, 7, -1])
    batch = make_batch(tables, np.arange(n), cfg, labels=np.arange(n) % 2, successor=succ)
    out = model(batch)
    assert out.pred.shape == out.target.shape == (n, cfg.latent_dim)
    assert out.error.shape == out.harm_pre_logit.shape == out.harm_post_logit.shape == (n,)
    assert torch.isfinite(out.loss) and out.parts["rollout"] > 0
    out.loss.backward()
    assert all(p.grad is None for p in model.target.parameters()), "target gets no gradient"
    assert model.predictor.out[1].weight.grad is not None


@settings(max_examples=25, deadline=None)
@given(st.floats(0.0, 0.999), st.integers(0, 1000))
def test_ema_moves_every_target_parameter_toward_the_online_one(momentum: float, seed: int) -> None:
    torch.manual_seed(seed)
    model = JEPA(JEPAConfig(**{**TINY.to_dict(), "use_images": False}))
    with torch.no_grad():
        for p in model.context.parameters():
            p.add_(torch.randn_like(p))
    before = [t.clone() for t in model.target.parameters()]
    ema_update(model.target, model.context, momentum)
    for b, t, o in zip(before, model.target.parameters(), model.context.parameters(), strict=True):
        dist_before = (b - o).abs()
        dist_after = (t - o).abs()
        assert torch.all(dist_after <= dist_before + 1e-6)
        assert torch.allclose(t, momentum * b + (1 - momentum) * o, atol=1e-6)


def test_momentum_schedule_runs_from_start_to_end() -> None:
    assert momentum_at(TINY, 0, 100) == pytest.approx(TINY.ema_momentum[0])
    assert momentum_at(TINY, 100, 100) == pytest.approx(TINY.ema_momentum[1])
    values = [momentum_at(TINY, s, 100) for s in range(101)]
    assert values == sorted(values)


def test_surprise_is_a_conformal_p_value_against_normal_errors() -> None:
    rng = np.random.default_rng(0)
    normal = rng.exponential(1.0, 999)
    cal = fit_calibration(
        errors=normal,
        harm_pre=rng.standard_normal(999),
        harm_post=rng.standard_normal(999),
        labels=np.zeros(999, int),
        normal=np.ones(999, bool),
        gui=np.zeros(999, bool),
    )
    s = cal.surprise(np.array([0.0, np.median(normal), 1e9]), np.zeros(3, bool))
    assert s[0] == pytest.approx(0.0, abs=1e-9) and s[1] == pytest.approx(0.5, abs=0.01)
    assert s[2] == pytest.approx(1 - 1 / 1000)
    fresh = rng.exponential(1.0, 5000)  # exchangeable normal errors: surprise ~ uniform
    assert np.mean(cal.surprise(fresh, np.zeros(5000, bool)) > 0.99) < 0.02
    rt = Calibration.from_dict(cal.to_dict())
    assert np.array_equal(
        rt.surprise(fresh[:50], np.zeros(50, bool)), cal.surprise(fresh[:50], np.zeros(50, bool))
    )


def test_threshold_at_fpr_lets_through_at_most_that_share_of_benign_scores() -> None:
    scores = np.random.default_rng(1).random(1000)
    thr = threshold_at_fpr(scores, 0.01)
    assert (scores >= thr).mean() <= 0.01
    assert (scores >= threshold_at_fpr(scores, 0.05)).mean() > 0.04


def test_injection_detector_finds_the_instruction_piece_whatever_surrounds_it() -> None:
    from worldmodel.relational import InjectionDetector

    rng = np.random.default_rng(0)
    text = rng.standard_normal((50, 384)).astype(np.float32)
    direction = rng.standard_normal(384).astype(np.float32)
    text[40:] += 3 * direction  # rows 40.. are "instruction-like" pieces
    chunk_lists = [[i % 40, (i + 7) % 40] for i in range(60)]
    y = np.zeros(60, int)
    for i in range(0, 60, 3):  # every third observation has one injected piece among benign ones
        chunk_lists[i].append(40 + i % 10)
        y[i] = 1
    det = InjectionDetector(epochs=200).fit(text, chunk_lists[:40], y[:40])
    s = det.score(text, chunk_lists[40:])
    assert s[y[40:] == 1].min() > s[y[40:] == 0].max()
    again = InjectionDetector.from_dict(det.to_dict())
    assert np.array_equal(again.score(text, chunk_lists), det.score(text, chunk_lists))
    with pytest.raises(RuntimeError, match="not fitted"):
        InjectionDetector().score(text, chunk_lists)
