"""`monitor stream`: the streaming worker (``monitor.worker``) as a long-running command."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any

EPILOG = textwrap.dedent(
    """\
    roles (each a consumer group; run more processes with the same --group to scale out):
      reassemble  TITO calls/executions -> vigil.steps.rollout (rollout trees)
      screen      vigil.steps.{rollout,deployment} -> L0, L1 -> vigil.scores,
                  vigil.escalations (tier 2), vigil.verdicts.rollout
      review      vigil.escalations (tier 2) -> L2 -> vigil.scores, tier-3 escalations,
                  and a page through the paging service
      all         the three, as threads of one process (default)

    examples:
      monitor paging token create --role producer --name worker      # once
      export VIGIL_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092
      monitor stream --paging-url http://127.0.0.1:8000 --paging-token vgl_...
      monitor stream --role screen --batch-size 128                  # one more screen member
      monitor stream --role review --policy ~/policy.json
      monitor stream --idle-timeout 10     # stop after 10 s without input (tests, demos)

    environment:
      VIGIL_PAGING_URL, VIGIL_PAGING_TOKEN   the paging service and a producer token
      VIGIL_KAFKA_*, VIGIL_TOPIC_*           the broker and the topic names (monitor --help)
    SIGTERM or Ctrl-C: every stage finishes its batch, flushes, commits and leaves its group.
    """
)


class StreamCliError(ValueError):
    """A user-facing failure: one sentence (the ``monitor`` CLI prints it and exits 2)."""


def cmd_stream(args: argparse.Namespace) -> int:
    import signal
    import threading

    from monitor import cli

    roles = ("reassemble", "screen", "review") if args.role == "all" else (args.role,)
    paging_url = args.paging_url or os.environ.get("VIGIL_PAGING_URL")
    paging_token = args.paging_token or os.environ.get("VIGIL_PAGING_TOKEN")
    if paging_url and not paging_token:
        raise StreamCliError(
            "--paging-url needs a producer token: pass --paging-token or set VIGIL_PAGING_TOKEN "
            "(make one with `monitor paging token create --role producer --name worker`)"
        )
    if args.batch_size < 1:
        raise StreamCliError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        settings = cli._kafka_settings(args)
        cli._check_reachable(settings)
    except cli.CliError as e:  # one sentence, however the CLI was started
        raise StreamCliError(str(e)) from None

    from monitor.pipeline import load_screener
    from monitor.worker import PagingClient, Worker, WorkerConfig, load_review_screener
    from streams.config import Topics
    from streams.kafka import KafkaBus

    def report(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    screener = review_screener = None
    if "screen" in roles:
        report("vigil stream: loading the screening models ...")
        screener = load_screener(args.policy, reviewer="review" in roles)
        review_screener = screener
    elif "review" in roles:
        review_screener = load_review_screener(args.policy)
    paging = None
    if "review" in roles:
        if paging_url:
            assert paging_token is not None
            paging = PagingClient(paging_url, paging_token)
        else:
            report("vigil stream: no --paging-url: tier-3 steps go to the escalations topic only")
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        report(f"vigil stream: {signal.Signals(signum).name}: finishing the batch, then stopping")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    config = WorkerConfig(
        topics=Topics(),
        roles=roles,
        group=args.group,
        batch_size=args.batch_size,
        idle_timeout_s=args.idle_timeout,
    )
    worker = Worker(
        config,
        lambda: KafkaBus(settings),
        screener=screener,
        review_screener=review_screener,
        paging=paging,
        stop=stop,
        report=report,
    )
    return worker.run()


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "stream",
        help="run the streaming worker: screen every step, review escalations, page",
        description="The streaming worker: L0 and L1 on every step of the steps topics, the L2 "
        "reviewer on what they escalate, pages through the paging service for tier 3, and a "
        "quarantine verdict per rollout execution.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(fn=cmd_stream)
    p.add_argument("--role", choices=["all", "screen", "review", "reassemble"], default="all",
                   help="which stage(s) to run (default: all, as threads)")
    p.add_argument("--policy", metavar="PATH",
                   help="calibrated policy (default: $VIGIL_HOME/models/policy.json, built on "
                   "first use)")
    p.add_argument("--paging-url", metavar="URL",
                   help="the paging service (default: $VIGIL_PAGING_URL; unset: no pages)")
    p.add_argument("--paging-token", metavar="TOKEN",
                   help="a producer token of the paging service (default: $VIGIL_PAGING_TOKEN)")
    p.add_argument("--group", default="vigil",
                   help="consumer-group prefix: GROUP-screen, GROUP-review, GROUP-reassembly "
                   "(default: vigil)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="records per micro-batch (default 64)")
    p.add_argument("--bootstrap-servers", metavar="HOST:PORT",
                   help="Kafka bootstrap servers (default: $VIGIL_KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop once every stage has had no input for this long (default: run "
                   "until SIGTERM)")
