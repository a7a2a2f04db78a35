"""`monitor demo`: the main job on the embedded defaults, end to end on a real broker.

Starts the embedded Tansu broker, replays the packaged sample trajectories and
TITO rollout records through it (plus one malformed record, to show the
dead-letter path), rebuilds the rollout trees from the TITO topics, and prints
what flowed on every topic.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from importlib import resources
from pathlib import Path

from streams.broker import EmbeddedBroker
from streams.bus import Bus, Message
from streams.config import KafkaSettings, Topics
from streams.kafka import KafkaBus
from streams.processor import H_DLQ_REASON
from streams.replay import replay_file
from streams.rollouts import TreeSummary, reassembly_processor


def sample_path(name: str) -> Path:
    return Path(str(resources.files("monitor") / "data" / name))


def _read_everything(bus: Bus, topics: list[str], idle_s: float = 2.0) -> dict[str, list[Message]]:
    consumer = bus.consumer(topics, f"vigil-demo-reader-{time.time_ns()}")
    by_topic: dict[str, list[Message]] = defaultdict(list)
    last = None
    try:
        while True:
            batch = consumer.poll(0.3)
            for m in batch:
                by_topic[m.topic].append(m)
            if batch or (last is None and consumer.assigned):
                last = time.monotonic()
            if last is not None and time.monotonic() - last > idle_s:
                return by_topic
    finally:
        consumer.close()


def _describe(m: Message) -> str:
    reason = m.header(H_DLQ_REASON)
    if reason:
        return f"dead letter from {m.header('vigil-dlq-topic')}: {reason}"
    try:
        obj = json.loads(m.value)
    except ValueError:
        return repr(m.value[:80])
    if "step" in obj:
        s = obj["step"]
        tool = (s["action"].get("tool") or {}).get("name")
        call = f" -> {tool}()" if tool else ""
        return (
            f"{obj['trajectory_id']} step {s['step_id']} [{s['role']}] "
            f"{s['action']['text'][:60]!r}{call}"
        )
    if "call_id" in obj:
        return (
            f"{obj['execution_id']} call {obj['call_id']} [{obj['role']}] "
            f"{len(obj['input_ids'])} tokens in, {len(obj['output_ids'])} out"
        )
    if "reward" in obj:
        return f"{obj['execution_id']} ended: reward {obj['reward']}, timed out {obj['timed_out']}"
    return m.value[:100].decode("utf-8", "replace")


def run_demo(limit: int = 3) -> int:
    topics = Topics()
    print("vigil demo: starting the embedded broker (Tansu, memory only) ...")
    with EmbeddedBroker() as broker:
        bus = KafkaBus(
            KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="vigil-demo")
        )
        bus.ensure_topics(topics.all())
        print(f"  broker on {broker.bootstrap_servers}; topics: {', '.join(topics.all())}")

        for name in ("sample_trajectories.jsonl", "sample_tito.jsonl"):
            report = replay_file(sample_path(name), bus, topics)
            sent = ", ".join(f"{n} -> {t}" for t, n in sorted(report.published.items()))
            print(f"replayed {name}: {report.lines} lines ({sent})")
        bus.publish(
            topics.tito_calls,
            b'{"execution_id": "exec-broken", "call_id": "c1", "inp',
            key="exec-broken",
        )
        bus.flush()
        print("published one truncated TITO record (it should be dead-lettered)")

        print("rebuilding rollout trees from the TITO topics ...")

        def show(t: TreeSummary) -> None:
            print(
                f"  {t.execution_id}: {t.unique_nodes} unique calls, {t.leaves} leaf "
                f"trajectories, {t.node_occurrences} node occurrences "
                f"({t.node_occurrences - t.unique_nodes} shared-prefix duplicates screened "
                f"once), reward {t.reward}"
            )

        proc, _ = reassembly_processor(
            bus, topics, "vigil-demo-reassembly", grace_s=0.5, on_tree=show
        )
        stats = proc.run(idle_timeout_s=2.0)
        print(
            f"  {stats.consumed} TITO records in, {stats.produced} rollout step events out, "
            f"{stats.dead_lettered} dead-lettered"
        )

        flowed = _read_everything(bus, topics.all())
        print("\nwhat flowed:")
        for topic in topics.all():
            msgs = flowed.get(topic, [])
            print(f"  {topic}: {len(msgs)} records")
            for m in msgs[:limit]:
                print(f"      {_describe(m)}")
            if len(msgs) > limit:
                print(f"      ... {len(msgs) - limit} more")
        bus.close()
    print(
        "\nbroker stopped. Screening (tiers L0-L3) plugs in between the steps topics and "
        "vigil.scores."
    )
    return 0
