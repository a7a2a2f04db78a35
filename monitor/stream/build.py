"""One function wires a streaming worker: :func:`build_worker`.

``monitor stream``, ``monitor demo``, the tests and the benches all build their worker
here, so the stages, their consumer groups and their options are the same everywhere::

    worker = build_worker(WorkerConfig(roles=("screen", "probe", "review")),
                          lambda: KafkaBus(settings),
                          policy=None, paging=PagingClient(url, token))
    worker.run()
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from monitor.stream.runner import ROLES, StageFactory, Worker, WorkerConfig
from monitor.stream.screen import ScreenedStep, ScreenStage
from monitor.stream.stats import Report, WorkerStats, stderr
from streams.bus import Bus

if TYPE_CHECKING:
    from dashboards.canary import CanaryInjector
    from dashboards.metrics import WorkerMetrics
    from monitor.pipeline import Screener
    from monitor.stream.paging import PagingClient
    from streams.rollouts import TreeSummary


def build_worker(
    config: WorkerConfig,
    bus_factory: Callable[[], Bus],
    *,
    policy: str | Path | None = None,
    screener: Screener | None = None,
    paging: PagingClient | None = None,
    canary_rate: float = 0.0,
    canaries: str | Path | None = None,
    metrics: WorkerMetrics | None = None,
    stop: threading.Event | None = None,
    report: Report = stderr,
    on_step: Callable[[ScreenedStep], None] | None = None,
    on_tree: Callable[[TreeSummary], None] | None = None,
) -> Worker:
    """The worker running ``config.roles``, each stage over its own bus from ``bus_factory``.

    ``screener``: the screening pipeline; without one it is loaded from ``policy`` (default
    ``$VIGIL_HOME/models/policy.json``): the whole screener when the screen (L0) or probe
    (L1) stage runs, the policy and the L2 reviewer alone for a review-only worker. The
    screen and probe stages of one worker share it, each with its own live gates.
    ``paging``: where tier-3 steps page a human (None: they go to the escalations topic
    only). ``canary_rate`` > 0 injects
    canaries from ``canaries`` (default: the set built from the training split).
    """
    unknown = set(config.roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role {sorted(unknown)[0]!r}: choose from {', '.join(ROLES)}")
    if canary_rate > 0 and "screen" not in config.roles:
        raise ValueError("canaries need the screen stage (--role screen or all)")
    screens = bool({"screen", "probe"} & set(config.roles))
    if screener is None and screens:
        from monitor.defaults import ensure_policy
        from monitor.pipeline import load_screener

        path = ensure_policy(policy, log=report)
        report("vigil stream: loading the screening models ...")
        screener = load_screener(path, reviewer="review" in config.roles)
    elif screener is None and "review" in config.roles:
        from monitor.pipeline import load_review_screener

        screener = load_review_screener(policy)
    if "review" in config.roles and paging is None:
        report("vigil stream: no --paging-url: tier-3 steps go to the escalations topic only")
    injector = _canaries(canaries, canary_rate, report) if canary_rate > 0 else None
    if "recall" in config.roles and metrics is None:  # the counts need somewhere to go
        from prometheus_client import CollectorRegistry

        from dashboards.metrics import WorkerMetrics

        metrics = WorkerMetrics(CollectorRegistry())

    stats = WorkerStats()
    topics, bs = config.topics, config.batch_size
    stages: dict[str, StageFactory] = {}
    recall = None
    if "reassemble" in config.roles:
        from streams.rollouts import reassembly_processor

        def count_tree(t: TreeSummary) -> None:
            stats.add("trees")
            if t.incomplete and metrics is not None:
                metrics.rollout_timeouts.labels(stage="reassemble").inc()
            if on_tree is not None:
                on_tree(t)

        stages["reassemble"] = lambda bus: reassembly_processor(
            bus, topics, config.group_of("reassemble"), grace_s=config.grace_s,
            on_tree=count_tree, open_timeout_s=config.execution_timeout_s,
            max_open=config.max_open_executions,
        )[0]
    if screens and config.adapt_window:
        report(f"vigil stream: gate thresholds adapt to the stream's last "
               f"{config.adapt_window} scores at each gate (--adapt)")
    if "screen" in config.roles:
        assert screener is not None
        l0 = _with_live_gates(screener, config.adapt_window)
        screen = ScreenStage(l0, topics, stats=stats, report=report, metrics=metrics,
                             canaries=injector, execution_timeout_s=config.execution_timeout_s,
                             max_open_executions=config.max_open_executions)
        stages["screen"] = lambda bus: screen.processor(
            bus, config.group_of("screen"), batch_size=bs)
    if "probe" in config.roles:
        from monitor.stream.probe import ProbeStage

        assert screener is not None
        l1 = _with_live_gates(screener, config.adapt_window)
        probe = ProbeStage(l1, topics, stats=stats, report=report, on_step=on_step,
                           metrics=metrics, execution_timeout_s=config.execution_timeout_s,
                           max_open_executions=config.max_open_executions)
        stages["probe"] = lambda bus: probe.processor(
            bus, config.group_of("probe"), batch_size=bs)
    if "review" in config.roles:
        from monitor.stream.review import ReviewStage

        assert screener is not None
        review = ReviewStage(screener, topics, paging=paging, stats=stats, report=report,
                             metrics=metrics)
        stages["review"] = lambda bus: review.processor(
            bus, config.group_of("review"), batch_size=max(1, min(bs, 16)))
    if "recall" in config.roles:
        from dashboards.ground_truth import LabelJoin
        from dashboards.metrics import HARM_CATEGORIES
        from monitor.stream.recall import RecallStage

        assert metrics is not None
        categories = {str(c.meta.get("category") or "none")
                      for c in (injector.canaries if injector is not None else ())}
        metrics.init_label_groups(set(HARM_CATEGORIES) | categories)
        recall = RecallStage(topics, LabelJoin(metrics, config.recall_max_steps), report=report)
        stages["recall"] = lambda bus: recall.processor(bus, config.group_of("recall"))
    return Worker(config, bus_factory, stages, stats=stats, stop=stop, report=report,
                  metrics=metrics, recall=recall)


def _with_live_gates(screener: Screener, window: int | None) -> Screener:
    """``screener`` for one stage: the same models, its own timings, and live gates of its
    own (the screen stage sketches gate 0, the probe stage gates 1 and 2)."""
    import copy
    from dataclasses import replace

    live = copy.deepcopy(screener.live)
    if window:
        from monitor.adaptive import LiveGates

        live = LiveGates(screener.policy, window=window)
    return replace(screener, live=live, timings={})


def _canaries(path: str | Path | None, rate: float, report: Report) -> CanaryInjector:
    from dashboards.canary import CanaryInjector, load_canary_set

    if path is None:
        from monitor.defaults import ensure_default_canaries

        path = ensure_default_canaries(log=report)
    injector = CanaryInjector(load_canary_set(path), rate)
    report(f"vigil stream: injecting canaries at {rate:g} per step "
           f"({len(injector.canaries)} in {path})")
    return injector
