"""ART (image / video generation) rollouts: the seed's formulas, the records, and the alerts on
simulated runs with and without injected failures (diversity from the shipped world model's
vision tower)."""

from __future__ import annotations

import base64
import io
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from monitor.cli.main import main as monitor_main
from monitor.rlhealth import formulas as f
from monitor.rlhealth.art import ArtMonitor, Embed, vision_embedder
from monitor.rlhealth.art_simulate import ArtFailure, render, score_alerts, simulate_art_run
from monitor.shipped import shipped_dir
from streams.media import ArtIteration, MediaRollout
from streams.records import RecordError, decode, encode


@cache
def embed() -> Embed:
    return vision_embedder(shipped_dir() / "worldmodel")


# --- formulas ----------------------------------------------------------------------------


def test_normalised_rewards_clip_to_the_unit_interval_and_equal_rewards_teach_nothing() -> None:
    r = np.array([0.0, 1.0, 2.0, 10.0])
    z = f.reward_normaliser(r)
    assert z == pytest.approx(np.std(r))
    got = f.normalised_rewards(r)
    want = 0.5 * (1 + np.clip((r - r.mean()) / z, -1, 1))
    assert got == pytest.approx(want) and got.max() == 1.0
    assert f.normalised_rewards([0.3, 0.3, 0.3]) == pytest.approx([0.5, 0.5, 0.5])
    assert f.reward_normaliser([0.3, 0.3, 0.3]) == 0.0


def test_guidance_direction_points_from_low_to_high_reward_with_unit_rms() -> None:
    x = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])  # reward grows with the first pixel
    g = f.guidance_direction([0.0, 1.0, 2.0], x)
    assert np.sqrt(np.mean(g**2)) == pytest.approx(1.0)
    assert g[0] > 0 and g[1] == 0.0
    assert f.guidance_direction([1.0, 1.0, 1.0], x) == pytest.approx([0.0, 0.0])


def test_kl_proxy_and_the_trust_region_mask() -> None:
    # ‖(1, 1) − (0, 0)‖² / (2 · 2 · 0.5²) = 2 / 1 = 2
    assert f.kl_proxy([1.0, 1.0], [0.0, 0.0], 0.5) == pytest.approx(2.0)
    g = np.array([1.0, 1.0])
    small = np.array([0.1, 0.1])  # ⟨d, G − d⟩ > 0: the update pushes further out
    assert f.trust_region_weight(0.7, 1e-4, small, g) == 0.0  # past δ and pushing: masked
    assert f.trust_region_weight(0.7, 1e-6, small, g) == 0.7  # inside the trust region
    back = np.array([2.0, 2.0])  # beyond G: the update pulls back, kept
    assert f.trust_region_weight(0.7, 1e-4, back, g) == 0.7


def test_mean_pairwise_distance() -> None:
    e = np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    assert f.mean_pairwise_distance(e) == pytest.approx((5 + 0 + 5) / 3)
    with pytest.raises(ValueError, match="at least two"):
        f.mean_pairwise_distance(e[:1])


# --- records -----------------------------------------------------------------------------


def _rollout(**overrides: object) -> dict[str, object]:
    thumb = render(np.full(6, 0.5))
    base: dict[str, object] = {
        "run_id": "r",
        "prompt_id": "p",
        "prompt": "a cat",
        "policy_version": 3,
        "endpoints": [
            {"ref": "s3://b/0.png", "thumbnail": thumb, "rewards": {"ocr": 0.1, "pick": 0.5}},
            {"ref": "s3://b/1.png", "thumbnail": thumb, "rewards": {"ocr": 0.3, "pick": 0.4}},
        ],
        "reward_weights": {"ocr": 0.25, "pick": 0.75},
    }
    return {**base, **overrides}


def test_a_media_rollout_round_trips_and_sums_its_reward_models() -> None:
    r = decode(json.dumps(_rollout()), MediaRollout)
    assert decode(encode(r), MediaRollout) == r
    assert r.rollout_id == "r/v3/p" and r.heads == ["ocr", "pick"]
    assert r.scalar_rewards() == pytest.approx([0.25 * 0.1 + 0.75 * 0.5, 0.25 * 0.3 + 0.75 * 0.4])


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"endpoints": []}, "endpoints", "at least 1"),
        ({"policy_version": -1}, "policy_version", "greater than or equal"),
        ({"reward_weights": {"clip": 1.0}}, None, "unknown reward models ['clip']"),
        ({"thumbnail": "https://x/y.png"}, "endpoints.0.thumbnail", "data:image/png"),
        ({"thumbnail": "data:image/png;base64,aGVsbG8="}, "endpoints.0.thumbnail", "png image"),
        ({"rewards": {"ocr": 0.1}}, None, "endpoint 1 is scored by"),
    ],
)
def test_a_bad_media_rollout_is_one_sentence_naming_the_field(
    change: dict[str, object], field: str | None, words: str
) -> None:
    obj = _rollout()
    if "thumbnail" in change or "rewards" in change:
        eps = [dict(e) for e in obj["endpoints"]]  # type: ignore[attr-defined]
        eps[0 if "thumbnail" in change else 1].update(change)
        obj["endpoints"] = eps
    else:
        obj.update(change)
    with pytest.raises(RecordError) as e:
        decode(json.dumps(obj), MediaRollout)
    assert "invalid art.rollout record" in str(e.value) and words in str(e.value)
    if field is not None:
        assert e.value.field == field


def test_a_thumbnail_over_the_size_limit_is_refused() -> None:
    from PIL import Image

    noise = np.random.default_rng(0).integers(0, 255, (200, 200, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG")
    big = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    obj = _rollout()
    obj["endpoints"] = [{"ref": "x", "thumbnail": big, "rewards": {"ocr": 0.1, "pick": 0.1}}]
    obj["reward_weights"] = {}
    with pytest.raises(RecordError, match="64 KB|65536"):
        decode(json.dumps(obj), MediaRollout)


def test_an_iteration_record_refuses_a_share_out_of_range() -> None:
    ok = {"run_id": "r", "policy_version": 1, "masked_share": 0.1, "drift_norm_mean": 0.2,
          "drift_dot_g_mean": 0.01, "z_c": {"p": 0.1}}  # fmt: skip
    assert decode(json.dumps(ok), ArtIteration).z_c == {"p": 0.1}
    with pytest.raises(RecordError) as e:
        decode(json.dumps({**ok, "masked_share": 1.5}), ArtIteration)
    assert e.value.field == "masked_share"


# --- alerts on simulated runs ------------------------------------------------------------


def _alerts(failures: tuple[ArtFailure, ...], iterations: int, seed: int = 0) -> dict:  # type: ignore[type-arg]
    run = simulate_art_run(iterations=iterations, prompts=4, failures=failures, seed=seed)
    monitor = ArtMonitor(embed=embed())
    for r in run.records:
        monitor.observe(r)
    monitor.finish()
    assert len(monitor.closed) == iterations
    return score_alerts(run, monitor.alerts)


@pytest.mark.parametrize("kind", ["mask", "collapse", "gamed_head"])
def test_every_injected_failure_alerts_within_three_iterations(kind: str) -> None:
    got = _alerts((ArtFailure(kind, 14),), iterations=20)  # type: ignore[arg-type]
    delay = got["delays"][kind]
    assert delay is not None and delay <= 3, got
    assert got["false_alarms"] == 0, got


def test_a_clean_run_raises_no_alert() -> None:
    got = _alerts((), iterations=60, seed=3)
    assert got["false_alarms"] == 0, got


# --- the command -------------------------------------------------------------------------


def test_simulate_art_then_report_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "art.jsonl"
    args = ["rlhealth", "--simulate-art", str(run), "--iterations", "16",
            "--art-failure", "gamed_head:10"]  # fmt: skip
    assert monitor_main(args) == 0
    assert "gamed_head from iteration 10" in capsys.readouterr().out
    out = tmp_path / "report.json"
    assert monitor_main(["rlhealth", "--file", str(run), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "image generation (ART): 128 rollouts of 8 prompts, 16 versions" in text
    assert "[art_reward_divergence] reward model ocr (weight 0.2 in the reward)" in text
    art = json.loads(out.read_text())["art"]
    assert [v["version"] for v in art["versions"]] == list(range(16))
    assert all(v["diversity_mean"] is not None for v in art["versions"])

    assert monitor_main(["rlhealth", "--simulate-art", str(run), "--art-failure", "melt:3"]) == 2
    assert "expected KIND:ONSET with KIND one of mask, collapse, gamed_head" in (
        capsys.readouterr().err
    )
