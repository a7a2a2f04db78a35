"""The ``monitor`` command line. Subcommands import what they need, so ``--help`` is instant."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.config import KafkaSettings

EPILOG = textwrap.dedent(
    """\
    examples:
      monitor broker                      # embedded Kafka-protocol broker on 127.0.0.1:9092
      export VIGIL_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092
      monitor replay runs.jsonl           # trajectories -> vigil.steps.<source>, one event a step
      monitor replay rollouts.jsonl --topic vigil.tito.calls    # TITO call and end records
      monitor tail vigil.steps.deployment --max 5
      monitor demo                        # everything above, on the embedded defaults

    configuration (environment):
      VIGIL_KAFKA_BOOTSTRAP_SERVERS  host:port list of your Kafka cluster
      VIGIL_KAFKA_SECURITY_PROTOCOL, VIGIL_KAFKA_SASL_MECHANISM, VIGIL_KAFKA_SASL_PLAIN_USERNAME,
      VIGIL_KAFKA_SASL_PLAIN_PASSWORD, VIGIL_KAFKA_SSL_CAFILE, ...  SASL / TLS options
      VIGIL_TOPIC_<NAME>             topic names, e.g. VIGIL_TOPIC_SCORES=team.scores
    """
)


class CliError(Exception):
    """A user-facing failure: printed as one sentence, exit status 2."""


def _kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    from streams.config import KafkaSettings

    settings = KafkaSettings()
    if getattr(args, "bootstrap_servers", None):
        settings = settings.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
    if not settings.bootstrap_servers:
        raise CliError(
            "no broker to talk to: pass --bootstrap-servers, set VIGIL_KAFKA_BOOTSTRAP_SERVERS, "
            "or start one with `monitor broker`"
        )
    return settings


def _check_reachable(settings: KafkaSettings) -> None:
    import socket

    assert settings.bootstrap_servers
    for server in settings.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=3).close()
            return
        except (OSError, ValueError):
            continue
    raise CliError(f"cannot reach a Kafka broker at {settings.bootstrap_servers}")


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


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(0.5):
        pass


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
    settings = _kafka_settings(args)
    _check_reachable(settings)
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

    settings = _kafka_settings(args)
    _check_reachable(settings)
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


def cmd_demo(args: argparse.Namespace) -> int:
    from monitor.demo import run_demo

    return run_demo(limit=args.show)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="monitor",
        description="vigil: real-time safety screening for LLM agent trajectories.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(
        name: str,
        fn: Callable[[argparse.Namespace], int],
        help: str,
        example: str,
        kafka: bool = False,
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(fn=fn)
        if kafka:
            p.add_argument(
                "--bootstrap-servers",
                metavar="HOST:PORT",
                help="Kafka bootstrap servers (default: $VIGIL_KAFKA_BOOTSTRAP_SERVERS)",
            )
        return p

    p = add(
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

    p = add(
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

    p = add(
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

    from monitor import (
        dashboards_cli,
        probes_cli,
        report_cli,
        rlhealth_cli,
        screen_cli,
        stream_cli,
        worldmodel_cli,
    )
    from monitor.service.cli import add_parser as add_paging

    worldmodel_cli.add_parser(sub)
    probes_cli.add_parser(sub)
    rlhealth_cli.add_parser(sub)
    screen_cli.add_parser(sub)
    stream_cli.add_parser(sub)
    add_paging(sub)
    dashboards_cli.add_parser(sub)
    report_cli.add_parser(sub)

    p = add(
        "demo",
        cmd_demo,
        "start the embedded broker and run the sample data through vigil",
        "monitor demo",
    )
    p.add_argument("--show", type=int, default=3, help="records to print per topic")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        return int(args.fn(args))
    except CliError as e:
        print(f"monitor {args.command}: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"monitor {args.command}: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except ValueError as e:  # RecordError and settings errors: one sentence
        print(f"monitor {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
