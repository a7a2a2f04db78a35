"""`monitor broker`, `monitor replay` and `monitor tail`: the broker and its topics."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from monitor.cli.common import CliError, add_command, check_reachable, kafka_settings


def cmd_broker(args: argparse.Namespace) -> int:
    from streams.broker import BrokerError, EmbeddedBroker
    from streams.config import KafkaSettings, Topics
    from streams.kafka import KafkaBus

    def create_topics(broker: EmbeddedBroker) -> None:
        bus = KafkaBus(KafkaSettings(bootstrap_servers=broker.bootstrap_servers))
        bus.ensure_topics(Topics().all())
        bus.close()

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with EmbeddedBroker(port=args.port, host=args.host, storage=args.storage) as broker:
            create_topics(broker)
            kept = f"kept in {args.storage}" if broker.durable else "memory only"
            print(f"broker ready on {broker.bootstrap_servers} ({kept}; Ctrl-C stops it)")
            print(f"  export VIGIL_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap_servers}", flush=True)
            broker.supervise(stop, restart=args.restart, on_restart=create_topics)
            print("stopping broker", file=sys.stderr)
    except BrokerError as e:
        raise CliError(str(e)) from None
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from monitor.progress import Progress
    from streams.config import Topics
    from streams.kafka import KafkaBus
    from streams.records import RecordError
    from streams.replay import read_records, replay_file

    try:  # a bad file is reported before any broker is needed
        for _ in read_records(args.file):
            pass
    except RecordError as e:
        raise CliError(f"{args.file}: {e}") from None
    settings = kafka_settings(args)
    check_reachable(settings)
    topics = Topics()
    bus = KafkaBus(settings)
    try:
        if args.create_topics:
            bus.ensure_topics([*topics.all(), *([args.topic] if args.topic else [])])
        with Progress(f"replaying {args.file}") as progress:
            report = replay_file(
                args.file,
                bus,
                topics,
                topic=args.topic,
                source=args.source,
                on_record=progress.advance,
            )
    finally:
        bus.close()
    for topic, n in sorted(report.published.items()):
        print(f"{n:>8} records -> {topic}")
    print(f"{report.lines} lines, {report.total} records published")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    import time
    import uuid

    from streams.kafka import KafkaBus

    settings = kafka_settings(args)
    check_reachable(settings)
    bus = KafkaBus(settings)
    group = args.group or f"vigil-tail-{uuid.uuid4().hex[:8]}"
    consumer = bus.consumer([args.topic], group)
    shown = 0
    last = time.monotonic()
    try:
        while args.max is None or shown < args.max:
            batch = consumer.poll(0.5)
            if not batch:
                if not args.follow and consumer.assigned and time.monotonic() - last > args.idle:
                    break
                continue
            last = time.monotonic()
            for m in batch:
                if args.max is not None and shown >= args.max:
                    break
                print(_format_message(m, args.headers), flush=True)
                shown += 1
            if args.group:
                consumer.commit(batch)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
        bus.close()
    print(f"{shown} records from {args.topic}", file=sys.stderr)
    return 0


def _format_message(m: object, headers: bool) -> str:
    from streams.bus import Message
    from streams.processor import H_DLQ_REASON

    assert isinstance(m, Message)
    value = m.value.decode("utf-8", "replace")
    prefix = f"{m.topic}[{m.partition}]@{m.offset} key={m.key}"
    reason = m.header(H_DLQ_REASON)
    if reason:
        prefix += f" reason={reason!r}"
    if headers:
        prefix += " " + " ".join(
            f"{k}={v.decode('utf-8', 'replace')}" for k, v in m.headers.items()
        )
    return f"{prefix} {value}"


def add_parser(sub: Any) -> None:
    """Add ``broker``, ``replay`` and ``tail`` to the ``monitor`` command line."""
    p = add_command(
        sub,
        "broker",
        cmd_broker,
        "run the embedded Kafka-protocol broker (Tansu) in the foreground",
        "monitor broker --port 9092 --storage file:///var/lib/vigil/broker --restart",
    )
    p.add_argument("--port", type=int, default=9092, help="port to listen on (default 9092)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--storage",
        metavar="URL",
        default="memory://tansu/",
        help="memory:// (default, lost on exit), file:///DIR (topics, records and committed "
        "offsets kept in DIR across restarts), or another Tansu storage URL",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="if Tansu dies, start it again on the same port (default: exit non-zero)",
    )

    p = add_command(
        sub,
        "replay",
        cmd_replay,
        "publish a JSON Lines file of trajectories or TITO records",
        "monitor replay examples/trajectories.jsonl --topic vigil.steps.deployment",
        kafka=True,
    )
    p.add_argument("file", help="JSON Lines: interchange trajectories, or TITO call/end records")
    p.add_argument("--topic", help="destination for steps or TITO calls (default: by record kind)")
    p.add_argument(
        "--source",
        choices=["rollout", "deployment", "benchmark"],
        help="override the trajectories' source",
    )
    p.add_argument(
        "--no-create-topics",
        dest="create_topics",
        action="store_false",
        help="do not create missing topics first",
    )

    p = add_command(
        sub,
        "tail",
        cmd_tail,
        "print the records of a topic",
        "monitor tail vigil.deadletter --max 10",
        kafka=True,
    )
    p.add_argument("topic")
    p.add_argument("--max", type=int, default=None, help="stop after N records")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new records")
    p.add_argument(
        "--idle",
        type=float,
        default=3.0,
        help="without --follow, stop after this many seconds with nothing new",
    )
    p.add_argument("--group", help="consume as this group and commit (default: read, no commit)")
    p.add_argument("--headers", action="store_true", help="print every header")
