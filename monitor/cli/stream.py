"""`monitor stream`: the streaming worker (``monitor.stream``) as a long-running command."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any

from monitor.cli.common import CliError, add_bootstrap_servers, check_reachable, kafka_settings

EPILOG = textwrap.dedent(
    """\
    roles (each a consumer group; run more processes with the same --group to scale out):
      reassemble  TITO calls/executions -> vigil.steps.rollout (rollout trees)
      screen      vigil.steps.{rollout,deployment} -> L0 -> vigil.scores (tier 0, at once),
                  vigil.steps.l0 (every step with its L0 verdict), vigil.labels
      probe       vigil.steps.l0 -> L1 on what L0 escalated -> vigil.scores (tier 1),
                  vigil.escalations (tier 2), vigil.verdicts.rollout
      review      vigil.escalations (tier 2) -> L2 -> vigil.scores, tier-3 escalations,
                  and a page through the paging service
      recall      vigil.labels + vigil.scores -> recall per tier (vigil_labelled_steps_total)
      all         the five, as threads of one process (default); --role takes several

    examples:
      monitor paging token create --role producer --name worker      # once
      export VIGIL_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092
      monitor stream --paging-url http://127.0.0.1:8000 --paging-token vgl_...
      monitor stream --role screen --batch-size 256                  # one more L0 member
      monitor stream --role probe                                    # one more L1 member
      monitor stream --role review --policy ~/policy.json
      monitor stream --idle-timeout 10     # stop after 10 s without input (tests, demos)
      monitor stream --metrics-port 9108 --canary-rate 0.01   # /metrics, 1 canary per 100 steps

    metrics, health and canaries:
      --metrics-port serves Prometheus metrics on http://HOST:PORT/metrics (names in the
      README) and readiness on http://HOST:PORT/healthz: 200 while the broker answers and
      every stage's outputs are acknowledged, 503 with the reasons (JSON) while not. A lost
      broker is reported within seconds (an ALERT line, vigil_broker_up 0); the stages
      wait for it, publish again and resume, committing nothing meanwhile.
      --canary-rate R injects R known-harmful canary trajectories per real step
      (from --canaries, default $VIGIL_HOME/data/canaries.jsonl, built from the training
      split on first use); canaries are screened like real steps, never paged and never in
      a rollout verdict, and their recall is on the dashboards.

    environment:
      VIGIL_PAGING_URL, VIGIL_PAGING_TOKEN   the paging service and a producer token
      VIGIL_KAFKA_*, VIGIL_TOPIC_*           the broker and the topic names (monitor --help)
    SIGTERM or Ctrl-C: every stage finishes its batch, flushes, commits and leaves its group.
    """
)


def cmd_stream(args: argparse.Namespace) -> int:
    """``monitor stream``: check the options and the broker, load the models, run the worker."""
    import threading

    from monitor.stream.runner import ROLES

    roles = ROLES if "all" in args.role else tuple(dict.fromkeys(args.role))
    paging_url = args.paging_url or os.environ.get("VIGIL_PAGING_URL")
    paging_token = args.paging_token or os.environ.get("VIGIL_PAGING_TOKEN")
    if paging_url and not paging_token:
        raise CliError(
            "--paging-url needs a producer token: pass --paging-token or set VIGIL_PAGING_TOKEN "
            "(make one with `monitor paging token create --role producer --name worker`)"
        )
    if args.batch_size < 1:
        raise CliError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.adapt and args.adapt_window < 8:
        raise CliError(f"--adapt-window must be at least 8 scores, got {args.adapt_window}")
    if not 0.0 <= args.canary_rate <= 1.0:
        raise CliError(f"--canary-rate must be in [0, 1], got {args.canary_rate}")
    if args.canary_rate > 0 and "screen" not in roles:
        raise CliError("--canary-rate needs the screen stage (--role screen or all)")
    if args.execution_timeout <= 0:
        raise CliError(f"--execution-timeout must be positive, got {args.execution_timeout}")
    if args.metrics_port is None and os.environ.get("VIGIL_METRICS_PORT"):
        try:
            args.metrics_port = int(os.environ["VIGIL_METRICS_PORT"])
        except ValueError:
            got = os.environ["VIGIL_METRICS_PORT"]
            raise CliError(f"VIGIL_METRICS_PORT must be a port number, got {got!r}") from None
    settings = kafka_settings(args)
    check_reachable(settings)

    from monitor.stream.build import build_worker
    from monitor.stream.paging import PagingClient
    from monitor.stream.runner import WorkerConfig, stop_on_signals
    from streams.config import Topics
    from streams.kafka import KafkaBus

    def report(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    metrics = registry = None
    if args.metrics_port is not None:
        from prometheus_client import CollectorRegistry

        from dashboards.metrics import WorkerMetrics

        registry = CollectorRegistry()
        metrics = WorkerMetrics(registry)
    stop = threading.Event()
    config = WorkerConfig(
        topics=Topics(),
        roles=roles,
        group=args.group,
        batch_size=args.batch_size,
        idle_timeout_s=args.idle_timeout,
        execution_timeout_s=args.execution_timeout,
        adapt_window=args.adapt_window if args.adapt else None,
    )
    worker = build_worker(
        config,
        lambda: KafkaBus(settings),
        policy=args.policy,
        paging=PagingClient(paging_url, paging_token) if paging_url and paging_token else None,
        canary_rate=args.canary_rate,
        canaries=args.canaries,
        metrics=metrics,
        stop=stop,
        report=report,
    )
    stop_on_signals(stop, report)
    if args.metrics_port is not None:
        from dashboards.serve import serve_metrics

        assert registry is not None
        try:
            serve_metrics(registry, args.metrics_host, args.metrics_port, health=worker.health)
        except OSError as e:
            raise CliError(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {e}"
            ) from None
        base = f"http://{args.metrics_host}:{args.metrics_port}"
        report(f"vigil stream: metrics on {base}/metrics, health on {base}/healthz")
    return worker.run()


def add_parser(sub: Any) -> None:
    """Add ``stream`` to the ``monitor`` command line."""
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
    p.add_argument("--role", nargs="+", choices=["all", "reassemble", "screen", "probe", "review",
                                                 "recall"],
                   default=["all"], metavar="ROLE",
                   help="which stage(s) to run, as threads: reassemble, screen (L0), probe "
                   "(L1), review (L2), recall, or all (default)")
    p.add_argument("--policy", metavar="PATH",
                   help="calibrated policy (default: $VIGIL_HOME/models/policy.json, built on "
                   "first use)")
    p.add_argument("--paging-url", metavar="URL",
                   help="the paging service (default: $VIGIL_PAGING_URL; unset: no pages)")
    p.add_argument("--paging-token", metavar="TOKEN",
                   help="a producer token of the paging service (default: $VIGIL_PAGING_TOKEN)")
    p.add_argument("--group", default="vigil",
                   help="consumer-group prefix: GROUP-screen, GROUP-probe, GROUP-review, ... "
                   "(default: vigil)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="records per micro-batch (default 64)")
    add_bootstrap_servers(p)
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop once every stage has had no input for this long (default: run "
                   "until SIGTERM)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (default: $VIGIL_METRICS_PORT; "
                   "unset: no /metrics)")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--execution-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="a rollout execution with no new record for this long gets a verdict "
                   "marked incomplete, so it holds commits no longer (default 600)")
    p.add_argument("--adapt", action="store_true",
                   help="move each gate's threshold to hold its budget on this stream's own "
                   "scores (sliding-window quantile sketch; never above the score that keeps "
                   "canary recall at the calibrated threshold's); exported as "
                   "vigil_gate_threshold{kind=\"live\"}")
    p.add_argument("--adapt-window", type=int, default=20_000, metavar="STEPS",
                   help="with --adapt: the window of latest scores each gate keeps")
    p.add_argument("--canary-rate", type=float, default=0.0, metavar="R",
                   help="canary trajectories injected per real step (default 0: none)")
    p.add_argument("--canaries", metavar="PATH",
                   help="canary set (JSON Lines trajectories; default: "
                   "$VIGIL_HOME/data/canaries.jsonl, built from the training split)")
