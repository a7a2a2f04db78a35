"""The ``monitor`` command line: the parser of every command group, and ``main``.

Each group lives in its own module of :mod:`monitor.cli` and adds itself with
``add_parser(subparsers)``; commands import what they need when they run, so ``--help`` is
instant.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Sequence

from monitor.cli.common import CliError, add_command

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


def cmd_demo(args: argparse.Namespace) -> int:
    """``monitor demo``: the embedded broker, default models and sample data, end to end."""
    from monitor.demo import run_demo

    return run_demo(limit=args.show)


def build_parser() -> argparse.ArgumentParser:
    """The ``monitor`` parser with every command; imports no command's heavy dependencies."""
    from monitor.cli import (
        broker,
        dashboards,
        hook,
        ingest,
        likelihood,
        mcp,
        models,
        probes,
        provenance,
        report,
        reviewer,
        rlhealth,
        screen,
        stream,
        worldmodel,
    )
    from monitor.service.cli import add_parser as add_paging

    parser = argparse.ArgumentParser(
        prog="monitor",
        description="vigil: real-time safety screening for LLM agent trajectories.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    broker.add_parser(sub)
    worldmodel.add_parser(sub)
    provenance.add_parser(sub)
    probes.add_parser(sub)
    likelihood.add_parser(sub)
    rlhealth.add_parser(sub)
    screen.add_parser(sub)
    stream.add_parser(sub)
    mcp.add_parser(sub)
    hook.add_parser(sub)
    ingest.add_parser(sub)
    add_paging(sub)
    dashboards.add_parser(sub)
    report.add_parser(sub)
    reviewer.add_parser(sub)
    models.add_parser(sub)
    p = add_command(
        sub,
        "demo",
        cmd_demo,
        "start the embedded broker and run the sample data through vigil",
        "monitor demo",
    )
    p.add_argument("--show", type=int, default=3, help="records to print per topic")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``monitor`` on ``argv``; a user-facing failure is one sentence and exit status 2."""
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
