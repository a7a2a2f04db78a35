"""`monitor ingest otlp FILE`: OpenTelemetry GenAI traces as trajectories
(:mod:`monitor.integrations.otlp`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from monitor.cli.common import CliError


def cmd_ingest_otlp(args: argparse.Namespace) -> int:
    """``monitor ingest otlp FILE``: OpenTelemetry GenAI traces as trajectories."""
    from pathlib import Path

    from monitor.integrations.otlp import read_otlp_file, trajectories_from_otlp

    src = Path(args.file)
    if not src.exists():
        raise CliError(f"{src}: no such file")
    runs = trajectories_from_otlp(read_otlp_file(src),
                                  warn=lambda m: print(f"{src}: {m}", file=sys.stderr))
    text = "".join(t.model_dump_json() + "\n" for t in runs)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    print(f"{src}: {len(runs)} traces with tool calls, "
          f"{sum(len(t.steps) for t in runs)} steps" + (f"; wrote {args.out}" if args.out
                                                        else ""), file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    i = sub.add_parser("ingest", help="turn other systems' records into trajectories")
    isub = i.add_subparsers(dest="format", metavar="FORMAT", required=True)
    o = isub.add_parser(
        "otlp", help="OpenTelemetry GenAI traces (OTLP JSON) as trajectories",
        description="One trajectory per trace: its execute_tool spans (GenAI semantic "
        "conventions) or OpenInference TOOL spans, in start order, as steps; the task from "
        "the first chat / invoke_agent (or LLM / AGENT) span's input messages. `monitor "
        "screen` reads such a file directly.")
    o.add_argument("file", help="OTLP JSON: one ExportTraceServiceRequest per line, or one")
    o.add_argument("--out", help="trajectories JSON Lines (default: standard output)")
    o.set_defaults(fn=cmd_ingest_otlp)
