"""The integrations' tests decide with the tiny policy's real screener plus tool rules, so a
call is blocked (deny) or allowed (allow) whatever the tiny models score."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from monitor.tiers import CalibratedPolicy
from monitor.tool_rules import ToolRules


@pytest.fixture(scope="module")
def ruled_policy_with(tiny_policy: Path, tmp_path_factory: pytest.TempPathFactory
                      ) -> Callable[[Mapping[str, Any]], Path]:
    """Writes the tiny policy with the given ``tools`` section; returns its path."""

    def make(tools: Mapping[str, Any]) -> Path:
        policy = CalibratedPolicy.load(tiny_policy)
        rules = ToolRules.from_dict(tools, ValueError)
        return replace(policy, config=replace(policy.config, tools=rules)).save(
            tmp_path_factory.mktemp("ruled") / "policy.json")

    return make


@pytest.fixture(scope="module")
def bank_screen(ruled_policy_with: Callable[[Mapping[str, Any]], Path]) -> Any:
    """The screener's check_action with send_money denied and read_file allowed."""
    from monitor.pipeline import load_screener

    path = ruled_policy_with({"rules": [{"match": "send_money", "action": "deny"},
                                        {"match": "read_file", "action": "allow"}]})
    return load_screener(path, reviewer=False).check_action


def consume_steps(kafka_settings: Any, topic: str, group: str, n: int,
                  timeout: float = 30) -> list[Any]:
    """The first ``n`` step events on ``topic`` (read by a consumer group of its own)."""
    import time

    from streams.kafka import KafkaBus
    from streams.records import StepEvent, decode

    bus = KafkaBus(kafka_settings)
    consumer = bus.consumer([topic], group)
    events: list[StepEvent] = []
    end = time.monotonic() + timeout
    while len(events) < n and time.monotonic() < end:
        events += [decode(m.value, StepEvent) for m in consumer.poll(0.3)]
    bus.close()
    return events
