"""`monitor report`: recall and funnel plots (PNG) from the metrics or from label files."""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from pathlib import Path
from typing import Any

from monitor.cli.common import CliError

EPILOG = textwrap.dedent(
    """\
    sources (one of):
      --prometheus URL      a Prometheus server scraping the worker (and the paging service):
                            vigil_labelled_steps_total, vigil_steps_total,
                            vigil_page_verdicts_total, over the last --window
      --screened FILE       `monitor screen --out FILE` output, joined by (trajectory_id,
                            step_id) with the step labels of --labels files: interchange
                            trajectories (step label/category) or label records, e.g. as
                            `monitor tail vigil.labels` prints them; a later label wins

    writes into --out: recall.png (recall per tier, 95 % Wilson error bars, by origin and
    by stream), funnel.png (steps reaching L0..L3, log scale), recall_over_time.png (with
    --since) and report.json (every number, machine-readable).

    examples:
      monitor report --prometheus http://127.0.0.1:9090 --out report/
      monitor report --prometheus http://prom:9090 --window 24h --since 7d --out weekly/
      monitor screen runs.jsonl --out screened.jsonl
      monitor report --screened screened.jsonl --labels runs.jsonl --out report/
      monitor tail vigil.labels > labels.txt
      monitor report --screened screened.jsonl --labels runs.jsonl --labels labels.txt
    """
)


def cmd_report(args: argparse.Namespace) -> int:
    from dashboards.report import (
        ReportError,
        format_table,
        parse_duration,
        recall_from_files,
        recall_from_prometheus,
        recall_over_time,
        render_report,
    )

    if not args.prometheus and not args.screened and os.environ.get("VIGIL_PROMETHEUS_URL"):
        args.prometheus = os.environ["VIGIL_PROMETHEUS_URL"]
    if args.prometheus and (args.screened or args.labels):
        raise CliError("pass either --prometheus or --screened with --labels, not both")
    if not args.prometheus and not args.screened:
        raise CliError("nothing to report on: pass --prometheus URL, or --screened "
                             "FILE with --labels FILE")
    series = None
    try:
        if args.prometheus:
            from dashboards.prometheus import PrometheusClient, PrometheusError

            client = PrometheusClient(args.prometheus)
            parse_duration(args.window)
            since = parse_duration(args.since) if args.since else None
            now = time.time()
            try:
                table = recall_from_prometheus(client, args.window, at=now)
                if since is not None:
                    # ~120 points, on whole seconds, so a re-run draws the same curve
                    step = max(1.0, round(since / 120))
                    series = recall_over_time(client, now - since, now, step, args.window)
            except PrometheusError as e:
                raise CliError(str(e)) from None
        else:
            if not args.labels:
                raise CliError("--screened needs at least one --labels file (the "
                                     "screened trajectories, or label records)")
            if args.since:
                raise CliError("--since needs --prometheus (files have no time axis)")
            table = recall_from_files(Path(args.screened), [Path(p) for p in args.labels])
    except ReportError as e:
        raise CliError(str(e)) from None
    paths = render_report(table, Path(args.out), series)
    print(format_table(table))
    print()
    for p in paths:
        print(f"wrote {p}")
    return 0


def add_parser(sub: Any) -> None:
    """Add ``report`` to the ``monitor`` command line."""
    p = sub.add_parser(
        "report",
        help="recall and funnel plots (PNG) from the metrics or from label files",
        description="Recall per tier with 95 % Wilson intervals, the escalation funnel and page\n"
        "precision as PNG files and JSON, for people without Grafana: from a Prometheus\n"
        "server, or from `monitor screen` output joined with step labels.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(fn=cmd_report)
    p.add_argument("--prometheus", metavar="URL",
                   help="a Prometheus server holding vigil's metrics (default: "
                   "$VIGIL_PROMETHEUS_URL when no --screened is given)")
    p.add_argument("--window", default="1h", metavar="DURATION",
                   help="with --prometheus: count labelled steps over this window, ending now "
                   "(default 1h)")
    p.add_argument("--since", metavar="DURATION",
                   help="with --prometheus: also plot recall over this span, each point over "
                   "--window (e.g. 6h, 7d)")
    p.add_argument("--screened", metavar="FILE",
                   help="output of `monitor screen --out` (per step: its highest tier)")
    p.add_argument("--labels", metavar="FILE", action="append", default=[],
                   help="step labels: interchange trajectories or label records (repeatable; "
                   "a later label of the same step wins)")
    p.add_argument("--out", default="vigil-report", metavar="DIR",
                   help="directory for the PNGs and report.json (default: vigil-report)")
