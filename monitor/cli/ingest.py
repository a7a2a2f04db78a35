"""`monitor ingest otlp FILE`: OpenTelemetry GenAI traces as trajectories
(:mod:`monitor.integrations.otlp`); `monitor ingest otlp --kafka`: the Collector's Kafka
exporter topic as deployment steps, verdicts back out as spans
(:mod:`monitor.integrations.otlp_kafka`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from monitor.cli.common import CliError, add_bootstrap_servers, check_reachable, kafka_settings


def cmd_ingest_otlp(args: argparse.Namespace) -> int:
    """``monitor ingest otlp FILE``: OpenTelemetry GenAI traces as trajectories."""
    from pathlib import Path

    if args.kafka:
        if args.file:
            raise CliError("give a FILE or --kafka, not both")
        return _ingest_kafka(args)
    if not args.file:
        raise CliError("give an OTLP JSON FILE, or --kafka to read the Collector's topic")
    for flag in ("verdicts_topic", "idle_timeout"):
        if getattr(args, flag) is not None:
            raise CliError(f"--{flag.replace('_', '-')} goes with --kafka")

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


def _ingest_kafka(args: argparse.Namespace) -> int:
    """Run the spans topic's ingest (and the verdict spans, with ``--verdicts-topic``) until
    stopped or idle for ``--idle-timeout`` seconds."""
    import threading

    if args.idle_timeout is not None and args.idle_timeout <= 0:
        raise CliError(f"--idle-timeout must be positive, got {args.idle_timeout}")
    if args.verdicts_topic and args.verdicts_topic == args.topic:
        raise CliError("--verdicts-topic must differ from --topic: vigil would read its own "
                       "verdicts back as spans")
    settings = kafka_settings(args)
    check_reachable(settings)

    from monitor.integrations.otlp_kafka import OtlpIngest, VerdictSpans
    from monitor.stream.runner import stop_on_signals
    from streams.config import Topics
    from streams.kafka import KafkaBus

    def report(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    topics, stop = Topics(), threading.Event()
    stop_on_signals(stop, report)
    stages = [("ingest", OtlpIngest(topics, args.topic, args.encoding, warn=report)
               .processor(KafkaBus(settings), f"{args.group}.ingest"))]
    if args.verdicts_topic:
        stages.append(("verdicts", VerdictSpans(topics, args.verdicts_topic, args.encoding)
                       .processor(KafkaBus(settings), f"{args.group}.verdicts")))
    report(f"vigil ingest: {args.topic} ({args.encoding}) -> {topics.steps_deployment}"
           + (f"; verdicts -> {args.verdicts_topic}" if args.verdicts_topic else ""))
    done: dict[str, Any] = {}

    def run(name: str, proc: Any) -> None:
        try:
            done[name] = proc.run(stop=stop, idle_timeout_s=args.idle_timeout)
        except BaseException:
            stop.set()  # one stage failed: stop the other too, and say so below
            raise
        finally:
            proc.bus.close()

    threads = [threading.Thread(target=run, args=s, name=f"ingest-{s[0]}") for s in stages]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    for name, _ in stages:
        if name not in done:
            raise CliError(f"the {name} stage stopped with an error (see above)")
        s = done[name]
        report(f"vigil ingest: {name}: {s.consumed} messages, {s.produced} out, "
               f"{s.dead_lettered} dead-lettered")
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
    o.add_argument("file", nargs="?",
                   help="OTLP JSON: one ExportTraceServiceRequest per line, or one")
    o.add_argument("--out", help="trajectories JSON Lines (default: standard output)")
    k = o.add_argument_group(
        "from Kafka", "read the OpenTelemetry Collector's Kafka exporter topic and publish its "
        "tool spans as steps on the deployment topic, where `monitor stream` screens them; "
        "run one process per spans topic (a trace's steps stay in order)")
    k.add_argument("--kafka", action="store_true", help="read the spans topic, not a file")
    k.add_argument("--topic", default="otlp_spans",
                   help="the Collector's traces topic (default: otlp_spans)")
    k.add_argument("--encoding", choices=("otlp_proto", "otlp_json"), default="otlp_proto",
                   help="the exporter's encoding, also used for the verdicts (default: "
                   "otlp_proto)")
    k.add_argument("--verdicts-topic", metavar="TOPIC",
                   help="also write every screened OTLP step's verdict to TOPIC as a "
                   "vigil.verdict span in the step's trace (for a Collector's Kafka receiver)")
    k.add_argument("--group", default="vigil.otlp", help="consumer group prefix")
    k.add_argument("--idle-timeout", type=float, metavar="S",
                   help="stop after S seconds with nothing to read (default: run until stopped)")
    add_bootstrap_servers(k)
    o.set_defaults(fn=cmd_ingest_otlp)
