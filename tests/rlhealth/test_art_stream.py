"""ART rollouts through `monitor replay` and `monitor rlhealth` on the real Tansu broker: alerts
on the scores topic, every generated endpoint on the rollout steps topic, bad records
dead-lettered, and open versions never committed past."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from monitor.rlhealth.art import ArtConfig, ArtMonitor
from monitor.rlhealth.art_simulate import ArtFailure, simulate_art_run
from monitor.rlhealth.art_stream import ArtStream
from streams.bus import Message
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.media import MediaRollout
from streams.processor import H_DLQ_REASON
from streams.records import Score, StepEvent, decode, encode, write_jsonl
from tests.streamutil import drain

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.broker
def test_art_rollouts_stream_to_alerts_screened_steps_and_dead_letters(
    kafka_settings: KafkaSettings, topics: Topics, unique: str, tmp_path: Path
) -> None:
    # the stream closes a version once a later one came and it was idle 1 s: the alert's
    # version (<= 13) is closed and published before the last one (15) ever is
    run = simulate_art_run(
        iterations=16, prompts=3, k=4, failures=(ArtFailure("gamed_head", 10),), seed=2
    )
    path = tmp_path / "art.jsonl"
    write_jsonl(path, run.records)
    env = {
        **os.environ,
        **{f"VIGIL_TOPIC_{k.upper()}": v for k, v in topics.model_dump().items()},
        "VIGIL_KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers or "",
    }
    monitor = [sys.executable, "-m", "monitor.cli"]
    replay = subprocess.run(
        [*monitor, "replay", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert f"{3 * 16:>8} records -> {topics.art_rollouts}" in replay.stdout
    assert f"{16:>8} records -> {topics.art_iterations}" in replay.stdout
    bus = KafkaBus(kafka_settings)
    bad = encode(run.records[0]).replace(b'"thumbnail":"data:image/png', b'"thumbnail":"http:x', 1)
    bus.publish(topics.art_rollouts, bad, key="bad")
    bus.flush()

    stream = subprocess.run(
        [*monitor, "rlhealth", "--group", f"{unique}.rl", "--idle-timeout", "4",
         "--close-after", "1.0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert stream.returncode == 0, stream.stderr
    assert topics.art_rollouts in stream.stdout and "dead-lettered 1" in stream.stdout
    assert "[art_reward_divergence] reward model ocr" in stream.stdout

    # every endpoint went on to the tiers once, as a rollout step with its thumbnail
    n_steps = 16 * 3 * 4
    steps = [decode(m.value, StepEvent)
             for m in drain(bus, topics.steps_rollout, f"{unique}.st", n_steps)]  # fmt: skip
    assert len(steps) == n_steps
    assert Counter(s.trajectory_id for s in steps) == {f"art/art-sim/p{c:03d}": 16 * 4
                                                       for c in range(3)}  # fmt: skip
    assert all(s.source == "rollout" and s.step.result and s.step.result.screenshot
               for s in steps)  # fmt: skip
    # the alert as a flagged score, subject the gamed reward model
    published = int(re.search(r"published (\d+)", stream.stdout).group(1))  # type: ignore[union-attr]
    out = drain(bus, topics.scores, f"{unique}.sc", published - n_steps)
    scores = [decode(m.value, Score) for m in out]
    alerts = [s for s in scores if "rl_alert_art_reward_divergence" in s.signals]
    assert alerts and all(s.flagged for s in alerts), stream.stdout[-2000:]
    assert alerts[0].trajectory_id.startswith("rlhealth/art_reward_divergence/")
    assert alerts[0].trajectory_id.endswith("/ocr")
    dead = drain(bus, topics.deadletter, f"{unique}.d", 1)
    assert len(dead) == 1
    reason = dead[0].header(H_DLQ_REASON) or ""
    assert "art.rollout" in reason and "endpoints.0.thumbnail" in reason, reason
    bus.close()


def test_open_versions_hold_their_offsets_until_they_close() -> None:
    """Commits never pass the first record of a version still in memory."""
    run = simulate_art_run(iterations=3, prompts=2, k=2)
    rollouts = [r for r in run.records if isinstance(r, MediaRollout)]
    art = ArtStream(Topics(), ArtMonitor(ArtConfig(close_lag=1)), publish_steps=False)
    for offset, r in enumerate(rollouts[:2]):  # version 0, partitions 0 and 1
        art.handle(r, Message("t", offset % 2, 10 + offset, "k", encode(r)))
    assert art.hold() == {("t", 0): 10, ("t", 1): 11}
    art.handle(rollouts[2], Message("t", 0, 12, "k", encode(rollouts[2])))  # version 1
    assert art.hold() == {("t", 0): 12}  # version 0 closed: only version 1 is held
    art.flush()
    assert art.hold() == {}
