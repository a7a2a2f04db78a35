"""The dashboards as built: what a Grafana user sees, and every query run by a real Prometheus."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from dashboards import boards
from dashboards.metrics import ORIGINS, STREAMS, WorkerMetrics
from dashboards.prometheus import LocalPrometheus, PrometheusError
from monitor.rlhealth.metrics import RLHealthMetrics
from monitor.rlhealth.signals import ArtVersionSignals
from streams.broker import free_port

UIDS = {"vigil-overview", "vigil-recall", "vigil-rl-health"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def models() -> dict[str, dict[str, Any]]:
    return boards.build_dashboards()


def _panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in model["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def _variables(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in model["templating"]["list"]}


def test_three_dashboards_with_stable_uids_tags_and_datasource_variable(
        models: dict[str, dict[str, Any]]) -> None:
    assert set(models) == UIDS
    for uid, m in models.items():
        assert m["uid"] == uid
        assert m["tags"] == ["vigil"]
        assert m["title"].startswith("vigil — ")
        ds = _variables(m)["datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        assert ds["current"]["value"] == boards.DATASOURCE_UID == "vigil-prometheus"


def test_stream_and_window_variables(models: dict[str, dict[str, Any]]) -> None:
    for uid in ("vigil-overview", "vigil-recall"):
        stream = _variables(models[uid])["stream"]
        assert stream["type"] == "query"
        assert stream["query"] == "label_values(vigil_steps_total, stream)"
        assert stream["datasource"] == DATASOURCE
        assert stream["includeAll"] and stream["multi"] and stream["allValue"] == ".*"
        assert stream["current"]["value"] == "$__all"
    window = _variables(models["vigil-recall"])["window"]
    assert window["type"] == "custom" and window["query"] == "1h,6h,24h,7d"
    assert window["current"]["value"] == "1h"
    assert [o["value"] for o in window["options"]] == ["1h", "6h", "24h", "7d"]
    assert "stream" not in _variables(models["vigil-rl-health"])  # the vigil_rl_* have none


def test_every_panel_queries_prometheus_through_the_datasource_variable(
        models: dict[str, dict[str, Any]]) -> None:
    for uid, m in models.items():
        ids = [p["id"] for p in _panels(m)]
        assert len(ids) == len(set(ids)), uid
        for p in _panels(m):
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, (uid, p["title"])
            if p["type"] == "row":
                continue
            assert p["targets"], f"{uid}: panel {p['title']!r} has no query"
            assert p["datasource"] == DATASOURCE
            ref_ids = [t["refId"] for t in p["targets"]]
            assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids), (uid, p["title"])
            for t in p["targets"]:
                assert t["datasource"] == DATASOURCE, (uid, p["title"])
                assert t["expr"].strip(), (uid, p["title"])


def test_stream_filters_are_regex_matchers(models: dict[str, dict[str, Any]]) -> None:
    exprs = [e for m in models.values() for _, e in boards.panel_queries(m)]
    uses = [e for e in exprs if "$stream" in e]
    assert uses
    for e in uses:  # "All" is .* and a multi-value selection a|b: both need =~
        assert re.findall(r'stream\s*(=~|!~|=|!=)\s*"\$stream"', e) == ["=~"] * e.count("$stream")


def test_range_panels_are_instant_and_time_series_slide(models: dict[str, dict[str, Any]]) -> None:
    for uid, m in models.items():
        for p in _panels(m):
            for t in p.get("targets") or []:
                if "$__range" in t["expr"]:
                    assert p["type"] in ("stat", "bargauge", "table"), (uid, p["title"])
                    assert t["instant"] is True, (uid, p["title"])
                if p["type"] == "timeseries":
                    assert t["range"] is True, (uid, p["title"])
    recall_series = [p for p in _panels(models["vigil-recall"])
                     if p["type"] == "timeseries" and "recall" in p["title"]]
    assert len(recall_series) == 3  # canary, dataset and human labels
    for p in recall_series:
        exprs = [t["expr"] for t in p["targets"]]
        assert len(exprs) == 9  # L1..L3: recall, lower, upper
        assert all("[$window]" in e for e in exprs)


def test_recall_panels_carry_wilson_intervals(models: dict[str, dict[str, Any]]) -> None:
    panels = {p["title"]: p for p in _panels(models["vigil-recall"])}
    canary = panels["Canary recall per tier (window $window)"]
    legends = [t["legendFormat"] for t in canary["targets"]]
    assert legends[:3] == ["L1 recall", "L1 lower", "L1 upper"]
    assert all('origin="canary"' in t["expr"] for t in canary["targets"])
    assert "sqrt(" in canary["targets"][1]["expr"]
    precision = panels["Page precision"]
    assert [t["legendFormat"] for t in precision["targets"]] == ["precision", "lower", "upper"]
    fp = panels["Benign escalation rate per tier (window $window)"]
    assert all('label="0"' in t["expr"] for t in fp["targets"])


def test_every_contract_metric_is_on_a_dashboard(models: dict[str, dict[str, Any]]) -> None:
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    RLHealthMetrics(registry)
    names = {"vigil_pages", "vigil_pages_opened_total", "vigil_page_verdicts_total",
             "vigil_webhook_deliveries_total"}
    for family in registry.collect():
        names.add({"counter": f"{family.name}_total", "histogram": f"{family.name}_bucket"}
                  .get(family.type, family.name))
    text = "\n".join(e for m in models.values() for _, e in boards.panel_queries(m))
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", text))
    assert not missing, f"metrics on no dashboard: {missing}"


def test_panel_queries_reaches_into_collapsed_rows(models: dict[str, dict[str, Any]]) -> None:
    nested = {"panels": [
        {"type": "stat", "title": "top", "targets": [{"expr": "up"}]},
        {"type": "row", "title": "details", "collapsed": True, "panels": [
            {"type": "timeseries", "title": "inner", "targets": [
                {"expr": "rate(a[5m])"}, {"expr": "rate(b[5m])"}]}]},
        {"type": "row", "title": "empty", "collapsed": False, "panels": []}]}
    assert boards.panel_queries(nested) == [
        ("top", "up"), ("inner", "rate(a[5m])"), ("inner", "rate(b[5m])")]
    for m in models.values():
        n_targets = sum(len(p.get("targets") or []) for p in _panels(m))
        assert len(boards.panel_queries(m)) == n_targets


def test_substitute_variables() -> None:
    sub = boards.substitute_variables
    assert sub('sum(rate(x{stream=~"$stream"}[$__rate_interval]))') == \
        'sum(rate(x{stream=~".*"}[5m]))'
    assert sub("increase(x[$__range]) / increase(y[${window}])", "1h") == \
        "increase(x[1h]) / increase(y[1h])"
    assert sub("x[$__interval] * $__range_s", "2m") == "x[2m] * 120"
    assert sub('y{s=~"${stream:regex}"}', stream="a|b") == 'y{s=~"a|b"}'
    assert sub('label_replace(x, "t", "$1", "s", "(.*)")') == \
        'label_replace(x, "t", "$1", "s", "(.*)")'
    with pytest.raises(ValueError, match="unknown template variable"):
        sub("x{a=\"$nope\"}")


# ---------------------------------------------------------------------------------------------
# a real Prometheus


@pytest.fixture(scope="module")
def prometheus() -> Iterator[LocalPrometheus]:
    with LocalPrometheus([]) as prom:
        yield prom


def test_every_query_parses_in_prometheus(models: dict[str, dict[str, Any]],
                                          prometheus: LocalPrometheus) -> None:
    checked = 0
    for uid, m in models.items():
        for title, expr in boards.panel_queries(m):
            for window in ("5m", "1h", "7d"):
                try:
                    prometheus.client.query(boards.substitute_variables(expr, window))
                except PrometheusError as e:
                    pytest.fail(f"{uid}: panel {title!r}: {e}")
                checked += 1
    assert checked > 100
    with pytest.raises(PrometheusError, match="parse error"):  # the check can fail
        prometheus.client.query(boards.substitute_variables("sum(rate(x[$__range])"))



def _exercise(stop: threading.Event, registry: CollectorRegistry) -> None:
    """Every contract metric moving, as a worker, the paging service and rlhealth would."""
    w = WorkerMetrics(registry)
    rl = RLHealthMetrics(registry)
    pages = Gauge("vigil_pages", "Pages by state now", ["state"], registry=registry)
    opened = Counter("vigil_pages_opened", "Pages ever opened", registry=registry)
    verdicts = Counter("vigil_page_verdicts", "Verdicts", ["verdict"], registry=registry)
    webhooks = Counter("vigil_webhook_deliveries", "Deliveries", ["ok"], registry=registry)
    i = 0
    while not stop.is_set():
        i += 1
        for stream in STREAMS:
            for tier in range(4):
                w.steps.labels(stream=stream, tier=str(tier), canary="false").inc(10 >> tier)
                w.steps.labels(stream=stream, tier=str(tier), canary="true").inc()
            w.escalations.labels(stream=stream, tier="2").inc()
            w.escalations.labels(stream=stream, tier="3").inc()
            w.canaries.labels(stream=stream).inc()
            for origin in ORIGINS:
                for label, reached in (("1", 3), ("0", 1)):
                    for tier in range(reached + 1):
                        w.labelled.labels(origin=origin, stream=stream, category="exfiltration",
                                          label=label, tier=str(tier)).inc()
        for tier in range(3):
            w.tier_latency.labels(tier=str(tier)).observe(0.004 * (tier + 1))
        for stage in ("screen", "review"):
            w.step_latency.labels(stage=stage).observe(0.2)
            w.deadletters.labels(stage=stage, reason="invalid").inc()
        w.observe_lag("screen", {("vigil.steps.rollout", 0): 5 + i})
        w.reviews.labels(backend="local", outcome="ok").inc()
        w.reviews.labels(backend="local", outcome="error").inc(i % 2)
        w.reviewer_cost.labels(backend="local").inc(1.5)
        w.gate_budget.labels(gate="L0").set(0.2)
        w.gate_threshold.labels(gate="L0", kind="calibrated").set(0.31)
        w.verdicts.labels(quarantine="true").inc()
        w.verdicts.labels(quarantine="false").inc(3)
        w.pages.labels(result="opened").inc()
        w.canaries_suppressed.labels(what="page").inc()
        pages.labels(state="triggered").set(i)
        opened.inc()
        verdicts.labels(verdict="harmful").inc()
        verdicts.labels(verdict="benign").inc(i % 2)
        webhooks.labels(ok="true").inc()
        rl.executions.labels(timed_out="true").inc()
        rl.executions.labels(timed_out="false").inc(2)
        rl.staleness.observe(1.0)
        rl.staleness_mean.set(1.2)
        rl.staleness_expected.set(1.0)
        rl.duration.observe(90)
        rl.timeout_reward.observe(0.3)
        rl.admitted.labels(role="main").inc(2)
        rl.dropped.inc()
        rl.node_occurrences.inc(17)
        rl.unique_nodes.inc(13)
        rl.dedup_ratio.observe(13 / 17)
        rl.drift.observe(0.5)
        rl.drift_nats.set(0.4)
        rl.out_of_trust.set(0.02)
        rl.log_turn_ratio.observe(0.1)
        rl.mismatch.set(0.01)
        rl.mismatch_k3.set(0.001)
        rl.mismatch_relative.set(0.2)
        rl.version.set(i)
        rl.group_reward.observe(0.6)
        rl.reward_hacking.inc()
        rl.alerts.labels(kind="drift").inc()
        rl.set_art_version(ArtVersionSignals(
            version=i, prompts=8, endpoints=64, reward_mean=0.5, head_means={"ocr": 0.4},
            no_signal_share=0.0, diversity_mean=0.02, masked_share=0.05,
            masked_share_trend=0.001, drift_norm_mean=0.1, drift_dot_g_mean=0.05,
            head_divergence={"ocr": 0.2}))
        stop.wait(0.2)


def test_every_query_returns_data_from_live_metrics(models: dict[str, dict[str, Any]]) -> None:
    """With every contract metric moving, no panel query comes back empty (a misspelt
    metric or label would)."""
    registry = CollectorRegistry()
    stop = threading.Event()
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    feeder = threading.Thread(target=_exercise, args=(stop, registry), daemon=True)
    feeder.start()
    try:
        with LocalPrometheus([f"127.0.0.1:{port}"], scrape_interval_s=0.5) as prom:
            prom.wait_for('count(rate(vigil_rl_staleness_bucket[1m]) > 0) > 0', timeout_s=20)
            prom.wait_for('count(increase(vigil_page_verdicts_total[1m]) > 0) > 0', timeout_s=20)
            time.sleep(0.5)
            empty = []
            for uid, m in models.items():
                for title, expr in boards.panel_queries(m):
                    if not prom.client.query(boards.substitute_variables(expr, "1m")):
                        empty.append(f"{uid}: {title}: {expr[:160]}")
            assert not empty, "queries without data:\n" + "\n".join(empty)
            # no benign step reached L3: the false-positive rate there reads 0, not "no data"
            fp = next(p for p in _panels(models["vigil-recall"])
                      if p["title"] == "Benign escalation rate per tier (window $window)")
            l3 = next(t["expr"] for t in fp["targets"] if t["legendFormat"].endswith("L3"))
            got = prom.client.query(boards.substitute_variables(l3, "1m"))
            assert {r["metric"]["origin"] for r in got} == set(ORIGINS)
            assert all(float(r["value"][1]) == 0.0 for r in got)
            # every harmful canary reached L3: recall 1, the interval's lower end below it
            stat = next(p for p in _panels(models["vigil-recall"])
                        if p["title"] == "Canary recall at L3")
            recall, lower, upper = (prom.client.value(boards.substitute_variables(
                t["expr"], "1m")) for t in stat["targets"])
            assert recall == 1.0 and upper == 1.0
            assert lower is not None and 0.5 < lower < 1.0
    finally:
        stop.set()
        feeder.join(5)
        server.shutdown()
