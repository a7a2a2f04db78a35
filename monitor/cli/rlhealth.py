"""`monitor rlhealth`: RL rollout health from the TITO and ART topics, or offline from a file."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from monitor.cli.common import (
    CliError,
    add_bootstrap_servers,
    check_reachable,
    kafka_settings,
)

EPILOG = textwrap.dedent(
    """\
    examples:
      monitor rlhealth --file rollouts.jsonl --phi 1 --mu 2          # offline report
      monitor rlhealth --file rollouts.jsonl --json > report.json
      monitor rlhealth --simulate run.jsonl                            # a synthetic run to try
      monitor rlhealth --simulate-art art.jsonl --art-failure collapse:20 --iterations 40
      monitor rlhealth --file art.jsonl                # image-generation (ART) rollouts too
      monitor rlhealth --bootstrap-servers 127.0.0.1:9092 --metrics-port 9108
                                        # stream vigil.tito.* -> vigil.scores, /metrics

    The stream publishes one L0 score per execution (signals rl_staleness,
    rl_drift_abs_nats_max, rl_out_of_trust_share, rl_mismatch_abs_mean, ...) and
    one flagged score per alert (rl_alert_<kind>) to the scores topic; bad records
    go to the dead-letter topic. Image- and video-generation rollouts (ART:
    vigil.art.rollouts, vigil.art.iterations) raise the art_* alerts, and each
    generated endpoint goes to vigil.steps.rollout for the tiers to screen.
    """
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``rlhealth`` to the ``monitor`` command line."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "rlhealth",
        help="RL rollout health: staleness, execution shape, drift, mismatch, reward integrity",
        description="RL rollout health from the TITO topics (or a TITO file): staleness, "
        "execution shape, off-policy drift, rollout-training mismatch and reward integrity, "
        "as alerts, L0 scores and Prometheus metrics.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--file", metavar="FILE.jsonl", help="compute offline from a TITO file")
    src.add_argument(
        "--simulate", metavar="OUT.jsonl", help="write a synthetic RL run with a collapse"
    )
    src.add_argument(
        "--simulate-art",
        metavar="OUT.jsonl",
        help="write a synthetic image-generation (ART) run, with --art-failure injected",
    )
    add_bootstrap_servers(p)
    p.add_argument("--group", default="vigil-rlhealth", help="consumer group (default %(default)s)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port (0: any free port; default: off)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address for /metrics")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="stop after this many seconds with no input (default: run until Ctrl-C)",
    )
    p.add_argument("--grace", type=float, default=1.0, help="seconds to wait for late calls")
    p.add_argument(
        "--close-after",
        type=float,
        default=30.0,
        help="stream: judge a version once idle this many seconds (default %(default)s)",
    )
    p.add_argument("--no-publish", action="store_true", help="do not publish scores")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--out", metavar="REPORT.json", help="also write the full report here")
    a = p.add_argument_group("image / video generation (ART)")
    a.add_argument(
        "--art-failure",
        action="append",
        default=[],
        metavar="KIND:ONSET",
        help="--simulate-art: inject mask, collapse or gamed_head from iteration ONSET "
        "(repeatable)",
    )
    a.add_argument("--iterations", type=int, default=40, help="--simulate-art: iterations")
    a.add_argument(
        "--image-embedder",
        default="worldmodel",
        metavar="BUNDLE|worldmodel|none",
        help="the vision encoder whose distances measure endpoint diversity: the default "
        "world model (default), a world-model bundle folder, or none (no collapse alert)",
    )
    a.add_argument("--no-art", action="store_true", help="stream: do not read the ART topics")
    g = p.add_argument_group("the run's configuration and alert bounds")
    g.add_argument("--phi", type=float, default=1.0, help="extra dispatch, batch units")
    g.add_argument("--mu", type=int, default=1, help="training steps per burst")
    g.add_argument("--staleness-tolerance", type=float, default=0.5)
    g.add_argument("--j-max", type=int, default=5, help="trajectories admitted per execution")
    g.add_argument("--trust-delta", type=float, default=0.8, help="trust region |rho - 1| <= d")
    g.add_argument("--drift-growth", type=float, default=1.5, help="alert factor per version")
    g.add_argument("--drift-min-nats", type=float, default=1.0)
    g.add_argument("--mismatch-reference", type=float, default=None, help="D_ref (nats/token)")
    g.add_argument("--mismatch-spike", type=float, default=1.0, help="alert on (D-Dref)/Dref")
    p.set_defaults(fn=cmd_rlhealth)
    return p


def _config(args: argparse.Namespace, *, stream: bool) -> Any:
    from monitor.rlhealth.alerts import AlertConfig
    from monitor.rlhealth.stream import RLHealthConfig

    if args.mu < 1 or args.phi < 0 or args.j_max < 0:
        raise ValueError("--mu must be >= 1, --phi >= 0 and --j-max >= 0")
    return RLHealthConfig(
        j_max=args.j_max,
        trust_delta=args.trust_delta,
        alerts=AlertConfig(
            phi=args.phi,
            mu=args.mu,
            staleness_tolerance=args.staleness_tolerance,
            drift_growth=args.drift_growth,
            drift_min_nats=args.drift_min_nats,
            mismatch_reference=args.mismatch_reference,
            mismatch_spike=args.mismatch_spike,
        ),
        close_lag=None if stream else 1,
        close_after_s=args.close_after if stream else None,
    )


def format_report(report: dict[str, Any]) -> str:
    """The report as a few readable lines."""
    lines = [f"executions: {report['executions']}  (late samples: {report['late_samples']})"]
    st = report["staleness"]
    obs = st["observed_mean"]
    lines.append(
        f"staleness: observed mean {obs:.3f}" if obs is not None else "staleness: no versions"
    )
    if st["observed_mean_after_warmup"] is not None:
        lines[-1] += f" ({st['observed_mean_after_warmup']:.3f} after the warm-up)"
    lines[-1] += f", expected phi + (mu - 1)/2 = {st['expected']:.3f}, histogram {st['histogram']}"
    sh = report["shape"]
    d = sh["duration_s"]
    if d:
        lines.append(
            f"duration: p50 {d['p50']:.0f}s p90 {d['p90']:.0f}s p99 {d['p99']:.0f}s "
            f"max {d['max']:.0f}s; timed out {sh['timed_out']}"
        )
    if sh["timeout_reward"]:
        lines.append(f"timed-out partial reward: mean {sh['timeout_reward']['mean']:.3f}")
    ratio = sh["dedup_ratio"]
    lines.append(
        f"trajectories: {sh['leaves']} leaves, {sh['admitted']} admitted "
        f"{sh['admitted_by_role']}, {sh['dropped_over_j_max']} over J_max; "
        f"nodes {sh['node_occurrences']} occurrences vs {sh['unique_nodes']} unique"
        + (f" (ratio {ratio:.3f})" if ratio is not None else "")
    )
    for v in report["versions"]:
        drift = v["drift_abs_mean"]
        lines.append(
            f"  version {v['version']:>4}: {v['samples']:>4} samples"
            + (f", staleness {v['staleness_mean']:.2f}" if v["staleness_mean"] is not None else "")
            + (f", |M| {drift:.3f} nats" if drift is not None else "")
            + (
                f", out-of-trust {v['out_of_trust_share']:.4f}"
                if v["out_of_trust_share"] is not None
                else ""
            )
            + (f", reward {v['reward_mean']:.3f}" if v["reward_mean"] is not None else "")
        )
    lines.append(f"groups: {report['groups']['seen']}, flagged {len(report['groups']['flagged'])}")
    lines.append(f"alerts: {len(report['alerts'])}")
    lines += [f"  [{a['kind']}] {a['message']}" for a in report["alerts"]]
    if "art" in report:
        lines += format_art(report["art"])
    return "\n".join(lines)


def format_art(art: dict[str, Any]) -> list[str]:
    """The ART part of the report: one line per version, then its alerts."""
    lines = [
        f"image generation (ART): {art['rollouts']} rollouts of {art['prompts']} prompts, "
        f"{len(art['versions'])} versions (late {art['late']}, duplicates {art['duplicates']})"
    ]
    for v in art["versions"]:
        parts = [f"  version {v['version']:>4}: reward"]
        parts.append(f"{v['reward_mean']:.3f}" if v["reward_mean"] is not None else "-")
        for key, label, fmt in (
            ("masked_share", "masked", "{:.1%}"),
            ("drift_norm_mean", "|d|", "{:.3g}"),
            ("no_signal_share", "no signal", "{:.0%}"),
            ("diversity_mean", "diversity", "{:.3g}"),
        ):
            if v[key] is not None:
                parts.append(f", {label} " + fmt.format(v[key]))
        lines.append(" ".join(parts).replace(" ,", ","))
    lines.append(f"ART alerts: {len(art['alerts'])}")
    lines += [f"  [{a['kind']}] {a['message']}" for a in art["alerts"]]
    return lines


def _emit(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))


def _art_failures(specs: list[str]) -> tuple[Any, ...]:
    from monitor.rlhealth.art_simulate import FAILURE_KINDS, ArtFailure

    out = []
    for spec in specs:
        kind, _, onset = spec.partition(":")
        if kind not in FAILURE_KINDS or not onset.isdigit():
            raise CliError(
                f"--art-failure {spec!r}: expected KIND:ONSET with KIND one of "
                f"{', '.join(FAILURE_KINDS)} and ONSET an iteration number"
            )
        out.append(ArtFailure(kind, int(onset)))  # type: ignore[arg-type]
    return tuple(out)


def _simulate_art(args: argparse.Namespace) -> int:
    from monitor.rlhealth.art_simulate import simulate_art_run
    from streams.records import write_jsonl

    failures = _art_failures(args.art_failure)
    if args.iterations < 1:
        raise CliError("--iterations must be >= 1")
    run = simulate_art_run(iterations=args.iterations, failures=failures)
    n = write_jsonl(args.simulate_art, run.records)
    injected = ", ".join(f"{f.kind} from iteration {f.onset}" for f in failures) or "none"
    print(
        f"wrote {n} records ({run.iterations} iterations of {run.prompts} prompts x {run.k} "
        f"endpoints) to {args.simulate_art}; failures injected: {injected}"
    )
    return 0


def _art_monitor(args: argparse.Namespace, *, stream: bool, metrics: Any = None) -> Any:
    """The ART monitor, its diversity measured by ``--image-embedder``."""
    from monitor.rlhealth.art import ArtConfig, ArtMonitor

    embed = None
    if args.image_embedder != "none":
        from monitor.rlhealth.art import vision_embedder
        from monitor.shipped import shipped_dir
        from vigil.paths import worldmodel_bundle

        path = args.image_embedder
        if path == "worldmodel":  # the one the screening policy uses: trained here, or shipped
            trained = worldmodel_bundle()
            path = trained if (trained / "config.json").exists() else shipped_dir() / "worldmodel"
        try:
            embed = vision_embedder(path)
        except FileNotFoundError as e:
            raise CliError(f"--image-embedder: {e}") from None
    config = ArtConfig(
        close_lag=None if stream else 1, close_after_s=args.close_after if stream else None
    )
    return ArtMonitor(config, metrics, embed=embed)


def cmd_rlhealth(args: argparse.Namespace) -> int:
    """``monitor rlhealth``: simulate a run, report on a file, or stream from the topics."""
    if args.simulate_art:
        return _simulate_art(args)
    if args.simulate:
        from monitor.rlhealth.simulate import simulate_rl_run
        from streams.records import write_jsonl

        run = simulate_rl_run(phi=args.phi, mu=args.mu)
        n = write_jsonl(args.simulate, run.records)
        print(
            f"wrote {n} records ({run.executions} executions, {run.calls} calls) to "
            f"{args.simulate}; drift grows from version {run.drift_onset}, rewards collapse "
            f"at {run.collapse_at}"
        )
        return 0
    if args.file:
        return _offline(args)
    return _stream(args)


def _offline(args: argparse.Namespace) -> int:
    from monitor.rlhealth.stream import RLHealthMonitor, monitor_records
    from streams.replay import read_records

    monitor = RLHealthMonitor(_config(args, stream=False))
    art = _art_monitor(args, stream=False)
    monitor_records(read_records(args.file), monitor, art=art)
    _emit(_with_art(monitor.report(), art), args)
    return 0


def _with_art(report: dict[str, Any], art: Any) -> dict[str, Any]:
    return {**report, "art": art.report()} if art is not None and art.rollouts else report


def _stream(args: argparse.Namespace) -> int:
    import signal
    import threading

    from prometheus_client import CollectorRegistry, start_http_server

    from monitor.rlhealth.metrics import RLHealthMetrics
    from monitor.rlhealth.stream import RLHealthMonitor, rlhealth_processor
    from streams.config import Topics
    from streams.kafka import KafkaBus

    settings = kafka_settings(args)
    check_reachable(settings)
    config = _config(args, stream=True)
    registry = CollectorRegistry()
    metrics = RLHealthMetrics(registry)
    monitor = RLHealthMonitor(config, metrics)
    art = None if args.no_art else _art_monitor(args, stream=True, metrics=metrics)
    topics = Topics()
    bus = KafkaBus(settings)
    server = None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        bus.ensure_topics(
            [topics.tito_calls, topics.tito_executions, topics.scores, topics.deadletter]
            + ([] if art is None else [topics.art_rollouts, topics.art_iterations,
                                       topics.steps_rollout])
        )
        if args.metrics_port is not None:
            server, _ = start_http_server(args.metrics_port, args.metrics_host, registry=registry)
            port = server.server_port
            print(f"metrics on http://{args.metrics_host}:{port}/metrics", flush=True)
        proc, _ = rlhealth_processor(
            bus,
            topics,
            monitor,
            args.group,
            grace_s=args.grace,
            publish_scores=not args.no_publish,
            max_record_bytes=max(settings.max_record_bytes, 8 * 1_048_576),
            art=art,
        )
        art_topics = "" if art is None else f", {topics.art_rollouts}, {topics.art_iterations}"
        print(
            f"rlhealth: consuming {topics.tito_calls}, {topics.tito_executions}{art_topics} "
            f"as {args.group}",
            flush=True,
        )
        stats = proc.run(stop=stop, idle_timeout_s=args.idle_timeout)
    finally:
        if server is not None:
            server.shutdown()
        bus.close()
    monitor.finish()  # judge the open versions for the summary (nothing more is published)
    if art is not None:
        art.finish()
    print(
        f"consumed {stats.consumed}, dead-lettered {stats.dead_lettered}, "
        f"published {stats.produced}",
        flush=True,
    )
    _emit(_with_art(monitor.report(), art), args)
    return 0
