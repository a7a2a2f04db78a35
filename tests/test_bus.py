"""Behavioural tests of the Bus, run on the in-process backend and on the real Tansu broker."""

from __future__ import annotations

import pytest

from streams.bus import Bus
from tests.streamutil import drain, poll_n


def test_publish_then_consume_keeps_key_headers_and_per_key_order(bus: Bus, unique: str) -> None:
    topic = f"{unique}.in"
    bus.ensure_topics([topic])
    for i in range(12):
        bus.publish(topic, f"v{i}".encode(), key=f"traj-{i % 3}", headers={"h": str(i).encode()})
    bus.flush()

    got = drain(bus, topic, f"{unique}.g", 12)

    assert len(got) == 12
    for m in got:
        i = int(m.value.decode()[1:])
        assert m.key == f"traj-{i % 3}"
        assert m.header("h") == str(i)
    for k in range(3):
        seq = [int(m.value.decode()[1:]) for m in got if m.key == f"traj-{k}"]
        assert seq == sorted(seq), "records of one key must stay in order"
        assert len({m.partition for m in got if m.key == f"traj-{k}"}) == 1


def test_uncommitted_records_are_redelivered_to_the_group(bus: Bus, unique: str) -> None:
    topic, group = f"{unique}.in", f"{unique}.g"
    bus.ensure_topics([topic])
    for i in range(10):
        bus.publish(topic, str(i).encode(), key=str(i))
    bus.flush()

    first = bus.consumer([topic], group)
    seen = poll_n(first, 10, timeout_s=20)
    assert len(seen) == 10
    committed = [m for m in seen if int(m.value) < 4]
    first.commit(committed)
    first.close()  # dies without committing the rest

    redelivered = {int(m.value) for m in drain(bus, topic, group, 6)}
    # everything not covered by a committed offset comes back; nothing committed does
    expected = {
        int(m.value)
        for m in seen
        if m.offset
        >= max([c.offset + 1 for c in committed if c.partition == m.partition], default=0)
    }
    assert redelivered == expected
    assert redelivered >= set(range(4, 10))


def test_committed_records_are_not_redelivered(bus: Bus, unique: str) -> None:
    topic, group = f"{unique}.in", f"{unique}.g"
    bus.ensure_topics([topic])
    for i in range(5):
        bus.publish(topic, str(i).encode(), key="k")
    bus.flush()
    assert len(drain(bus, topic, group, 5)) == 5  # drain commits

    bus.publish(topic, b"5", key="k")
    bus.flush()
    again = drain(bus, topic, group, 1, timeout_s=15)
    assert [m.value for m in again] == [b"5"]


def test_each_group_gets_every_record(bus: Bus, unique: str) -> None:
    topic = f"{unique}.in"
    bus.ensure_topics([topic])
    for i in range(6):
        bus.publish(topic, str(i).encode(), key=str(i))
    bus.flush()
    a = {m.value for m in drain(bus, topic, f"{unique}.a", 6)}
    b = {m.value for m in drain(bus, topic, f"{unique}.b", 6)}
    assert a == b == {str(i).encode() for i in range(6)}


def test_ensure_topics_is_idempotent(bus: Bus, unique: str) -> None:
    expected = {f"{unique}.x", f"{unique}.y", f"{unique}.z"}
    bus.ensure_topics([f"{unique}.x", f"{unique}.y"])
    bus.ensure_topics([f"{unique}.x", f"{unique}.y", f"{unique}.z"])  # two exist already
    on_broker = bus.ping(timeout_s=10)  # the broker's topics, by the admin client for Kafka
    assert expected <= on_broker, f"missing after ensure_topics: {sorted(expected - on_broker)}"


@pytest.mark.parametrize("size", [0, 1, 200_000])
def test_payload_bytes_survive_unchanged(bus: Bus, unique: str, size: int) -> None:
    topic = f"{unique}.in"
    bus.ensure_topics([topic])
    payload = bytes(range(256)) * (size // 256) + b"\xff" * (size % 256)
    bus.publish(topic, payload, key=None)
    bus.flush()
    (m,) = drain(bus, topic, f"{unique}.g", 1)
    assert m.value == payload and m.key is None


def test_read_before_committed_gives_the_records_behind_a_groups_commit(
    bus: Bus, unique: str
) -> None:
    """A restarted stage reads back what its group already committed, at most N a
    partition, without touching the group's offsets."""
    topic, group = f"{unique}.in", f"{unique}.g"
    bus.ensure_topics([topic])
    assert list(bus.read_before_committed(topic, group, 100)) == []  # nothing committed yet
    for i in range(9):
        bus.publish(topic, str(i).encode(), key="k")  # one key: one partition, in order
    bus.flush()
    first = bus.consumer([topic], group)
    seen = poll_n(first, 9, timeout_s=20)
    first.commit([m for m in seen if int(m.value) < 6])  # committed up to "5"
    first.close()

    assert [int(m.value) for m in bus.read_before_committed(topic, group, 100)] == list(
        range(6))
    assert [int(m.value) for m in bus.read_before_committed(topic, group, 2)] == [4, 5]
    # the group still resumes after its commit
    assert sorted(int(m.value) for m in drain(bus, topic, group, 3)) == [6, 7, 8]
