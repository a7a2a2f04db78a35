"""vigil's Grafana dashboards as code (grafana-foundation-sdk, Grafana 11.6 schema).

Three dashboards, each a plain function returning a builder:

``overview()``  (uid ``vigil-overview``)
    throughput, the L0 → L3 escalation funnel, model and end-to-end latency, consumer
    lag, dead letters, L2 reviews and their cost, rollout verdicts, pages triggered.
``recall()``  (uid ``vigil-recall``)
    recall per tier with 95 % Wilson intervals from canaries, dataset and human labels,
    recall by origin, stream and category, the benign escalation (false-positive) rate,
    page precision, pages by state, canaries injected and suppressed.
``rl_health()``  (uid ``vigil-rl-health``)
    the ``vigil_rl_*`` signals: staleness, execution shape, off-policy drift, mismatch,
    reward hacking, alerts.

:func:`build_dashboard` is the one place that calls ``.build()``; it returns the
dashboard's JSON model (a dict), which ``dashboards.provision`` writes with sorted keys.
Every query runs on the ``${datasource}`` template variable (default: the provisioned
``vigil-prometheus`` data source); ``$stream`` is a regex (``All`` = ``.*``), ``$window``
the sliding window of the recall time series, and stat, bar and table panels cover the
dashboard's time range (``$__range``).

:func:`panel_queries` lists every query of a dashboard and :func:`substitute_variables`
turns one into plain PromQL, so tests run each against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import bargauge, common, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as gdb
from grafana_foundation_sdk.builders.dashboard import Dashboard as DashboardBuilder
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

from dashboards import promql

DATASOURCE_UID = "vigil-prometheus"
DATASOURCE_NAME = "vigil Prometheus"
TAGS = ["vigil"]
# every query's data source: the dashboard's `datasource` template variable
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
WINDOWS = ("1h", "6h", "24h", "7d")
TIERS = (1, 2, 3)
_TIER_COLORS = {0: "green", 1: "blue", 2: "orange", 3: "red"}

Query = prometheus.Dataquery


# ---------------------------------------------------------------------------------------------
# building blocks


def query(expr: str, legend: str = "__auto", *, instant: bool = False,
          table_format: bool = False) -> Query:
    """A Prometheus query on ``${datasource}``; ``instant`` for stat, bar and table panels."""
    q = (prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)
         .editor_mode(QueryEditorMode.CODE))
    q = q.instant() if instant else q.range()
    if table_format:
        q = q.format(PromQueryFormat.TABLE)
    return q


class _PanelBuilder(Protocol):
    def with_target(self, target: cogbuilder.Builder[Any]) -> Self: ...

    def datasource(self, datasource: dm.DataSourceRef) -> Self: ...


P = TypeVar("P", bound=_PanelBuilder)


def _with_queries(panel: P, queries: Sequence[Query]) -> P:
    """``queries`` as the panel's targets (refId A, B, ...), on ``${datasource}``."""
    if not queries:
        raise ValueError("a panel needs at least one query")
    for i, q in enumerate(queries):
        panel = panel.with_target(q.ref_id(chr(ord("A") + i)))
    return panel.datasource(DATASOURCE)


def _thresholds(*steps: tuple[float | None, str]) -> gdb.ThresholdsConfig:
    return gdb.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def _fixed_color(color: str) -> dm.DynamicConfigValue:
    return dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color})


def timeseries_panel(title: str, queries: Sequence[Query], *, unit: str = "short",
                     description: str = "", width: int = 12, height: int = 8,
                     stack: bool = False, log_scale: bool = False, min_value: float | None = 0,
                     max_value: float | None = None) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).description(description).unit(unit)
         .span(width).height(height)
         .legend(common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs([]))
         .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                  .sort(cm.SortOrder.DESCENDING))
         .draw_style(cm.GraphDrawStyle.LINE).line_width(1).fill_opacity(10)
         .show_points(cm.VisibilityMode.NEVER).span_nulls(False))
    if stack:
        p = p.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(40)
    if log_scale:
        p = p.scale_distribution(common.ScaleDistributionConfig()
                                 .type(cm.ScaleDistribution.LOG).log(10))
    elif min_value is not None:
        p = p.min(min_value)
    if max_value is not None:
        p = p.max(max_value)
    return _with_queries(p, queries)


def stat_panel(title: str, queries: Sequence[Query], *, unit: str = "short",
               description: str = "", width: int = 4, height: int = 4,
               thresholds: gdb.ThresholdsConfig | None = None, decimals: int | None = None,
               sparkline: bool = False) -> stat.Panel:
    p = (stat.Panel().title(title).description(description).unit(unit).span(width)
         .height(height)
         .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .graph_mode(cm.BigValueGraphMode.AREA if sparkline else cm.BigValueGraphMode.NONE)
         .color_mode(cm.BigValueColorMode.VALUE).text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
         .justify_mode(cm.BigValueJustifyMode.AUTO).orientation(cm.VizOrientation.AUTO)
         .thresholds(thresholds or _thresholds((None, "text"))))
    if decimals is not None:
        p = p.decimals(decimals)
    return _with_queries(p, queries)


def bargauge_panel(title: str, queries: Sequence[Query], *, unit: str = "short",
                   description: str = "", width: int = 6, height: int = 8,
                   max_value: float | None = None) -> bargauge.Panel:
    p = (bargauge.Panel().title(title).description(description).unit(unit).span(width)
         .height(height).min(0)
         .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .orientation(cm.VizOrientation.HORIZONTAL)
         .display_mode(cm.BarGaugeDisplayMode.BASIC).value_mode(cm.BarGaugeValueMode.COLOR)
         .name_placement(cm.BarGaugeNamePlacement.LEFT).show_unfilled(True)
         .sizing(cm.BarGaugeSizing.AUTO).min_viz_width(8).min_viz_height(16)
         .max_viz_height(300)
         .legend(common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(False).calcs([]))
         .thresholds(_thresholds((None, "blue"))))
    if max_value is not None:
        p = p.max(max_value)
    return _with_queries(p, queries)


def table_panel(title: str, queries: Sequence[Query], *, columns: Mapping[str, str],
                percent_columns: Sequence[str] = (), description: str = "",
                width: int = 12, height: int = 8, sort_by: str | None = None) -> table.Panel:
    """A table of instant queries merged on their labels; ``columns`` renames ``Value #A``..."""
    p = (table.Panel().title(title).description(description).unit("short").span(width)
         .height(height).frame_index(0).show_header(True).cell_height(cm.TableCellHeight.SM)
         .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
         .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
             "excludeByName": {"Time": True}, "renameByName": dict(columns),
             "indexByName": {}, "includeByName": {}})))
    if sort_by:
        p = p.sort_by([common.TableSortByFieldState().display_name(sort_by).desc(False)])
    for name in percent_columns:
        p = p.override_by_name(name, [dm.DynamicConfigValue(id_val="unit", value="percentunit"),
                                      dm.DynamicConfigValue(id_val="decimals", value=1)])
    return _with_queries(p, queries)


def row(title: str) -> gdb.Row:
    """An expanded row: a section header; the panels added after it belong to it."""
    return gdb.Row(title).collapsed(False)


def datasource_variable() -> gdb.DatasourceVariable:
    return (gdb.DatasourceVariable("datasource").label("Data source").type("prometheus")
            .current(dm.VariableOption(text=DATASOURCE_NAME, value=DATASOURCE_UID,
                                       selected=True)))


def stream_variable() -> gdb.QueryVariable:
    return (gdb.QueryVariable("stream").label("Stream").datasource(DATASOURCE)
            .query("label_values(vigil_steps_total, stream)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(text="All", value="$__all", selected=True)))


def window_variable() -> gdb.CustomVariable:
    return (gdb.CustomVariable("window").label("Recall window").values(",".join(WINDOWS))
            .current(dm.VariableOption(text=WINDOWS[0], value=WINDOWS[0], selected=True))
            .options([dm.VariableOption(text=w, value=w, selected=w == WINDOWS[0])
                      for w in WINDOWS]))


def _dashboard(uid: str, title: str, description: str) -> DashboardBuilder:
    return (DashboardBuilder(title).uid(uid).description(description).tags(TAGS)
            .editable().time("now-6h", "now").refresh("30s").timezone("browser")
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .timepicker(gdb.TimePicker().refresh_intervals(
                ["10s", "30s", "1m", "5m", "15m", "1h"]))
            .link(gdb.DashboardLink("vigil dashboards").type(dm.DashboardLinkType.DASHBOARDS)
                  .tags(TAGS).as_dropdown(True).include_vars(True).keep_time(True))
            .with_variable(datasource_variable()))


def _rate(metric: str, by: Sequence[str] = (), selector: str = "") -> str:
    agg = f"sum by ({', '.join(by)})" if by else "sum"
    return f"{agg} (rate({metric}{selector}[$__rate_interval]))"


def _increase(metric: str, by: Sequence[str] = (), selector: str = "") -> str:
    agg = f"sum by ({', '.join(by)})" if by else "sum"
    return f"{agg} (increase({metric}{selector}[$__range]))"


def _quantiles(metric: str, qs: Sequence[float], by: Sequence[str] = (),
               legend: str = "") -> list[Query]:
    """``histogram_quantile`` of ``metric``'s buckets, one query per quantile."""
    keep = ", ".join(["le", *by])
    return [query(f"histogram_quantile({q:g}, sum by ({keep}) "
                  f"(rate({metric}_bucket[$__rate_interval])))",
                  f"{legend}p{round(q * 100):d}") for q in qs]


def _hist_mean(metric: str, legend: str) -> Query:
    return query(f"sum(rate({metric}_sum[$__rate_interval])) / "
                 f"sum(rate({metric}_count[$__rate_interval]))", legend)


def _ratio(num: str, den: str) -> str:
    """``num / den`` of two label-less sums; a numerator with no series reads 0."""
    return f"({num} or vector(0)) / ({den})"


def _or_zero(total: str) -> str:
    """A label-less sum that reads 0, not "no data", before its counter first moves."""
    return f"({total} or vector(0))"


# ---------------------------------------------------------------------------------------------
# overview

_STREAM = '{stream=~"$stream"}'


def overview() -> DashboardBuilder:
    """Throughput, escalation, latency, delivery health, review cost, verdicts and pages."""
    screened = 'vigil_steps_total{tier="0", stream=~"$stream"}'
    real = 'canary="false", stream=~"$stream"'
    quarantine_share = _ratio(
        _increase("vigil_rollout_verdicts_total", selector='{quarantine="true"}'),
        _increase("vigil_rollout_verdicts_total"))
    d = (_dashboard("vigil-overview", "vigil — overview",
                    "The screening pipeline at a glance: how many steps it screens, how far "
                    "they escalate, how fast, and whether delivery keeps up.")
         .with_variable(stream_variable())
         .with_row(row("Now"))
         .with_panel(stat_panel("Steps screened /s", [query(
             f"sum(rate({screened}[$__rate_interval]))", "steps/s")], unit="ops",
             sparkline=True, description="Every step at L0, canaries included."))
         .with_panel(stat_panel("Steps that reached L3", [query(
             _increase("vigil_steps_total", selector=f'{{tier="3", {real}}}'), "L3",
             instant=True)], decimals=0,
             description="Real (non-canary) steps the L2 reviewer escalated to a human, over "
             "the dashboard's time range."))
         .with_panel(stat_panel("Pages opened", [query(
             _or_zero(_increase("vigil_pages_triggered_total", selector='{result="opened"}')),
             "opened", instant=True)], decimals=0,
             description="Page triggers that opened a new page, over the dashboard's time range "
             "(deduplicated triggers excluded)."))
         .with_panel(stat_panel("Dead letters", [query(
             _or_zero(_increase("vigil_deadletters_total")), "dead letters", instant=True)],
             decimals=0,
             thresholds=_thresholds((None, "green"), (1, "orange")),
             description="Records sent to the dead-letter topic over the dashboard's time "
             "range."))
         .with_panel(stat_panel("Consumer lag", [query(
             "sum(vigil_consumer_lag)", "records behind")], decimals=0, sparkline=True,
             thresholds=_thresholds((None, "green"), (1000, "orange"), (100000, "red")),
             description="Records behind the high-water mark, all stages and partitions."))
         .with_panel(stat_panel("Quarantine share", [query(
             quarantine_share, "quarantined", instant=True)], unit="percentunit",
             description="Share of rollout executions whose verdict was quarantine, over the "
             "dashboard's time range."))
         .with_row(row("Throughput and escalation"))
         .with_panel(timeseries_panel("Throughput by stream", [query(
             _rate("vigil_steps_total", ["stream"], '{tier="0", stream=~"$stream"}'),
             "{{stream}}")], unit="ops", stack=True,
             description="Steps screened per second (tier 0: every step), by stream."))
         .with_panel(bargauge_panel("Escalation funnel L0 → L3", [query(
             _increase("vigil_steps_total", ["tier"], f"{{{real}}}"), "L{{tier}}",
             instant=True)], width=6,
             description="Real (non-canary) steps that reached each tier over the dashboard's "
             "time range."))
         .with_panel(bargauge_panel("Share of screened steps reaching each tier", [query(
             _increase("vigil_steps_total", ["tier"], f"{{{real}}}") + " / ignoring (tier) "
             "group_left " + _increase("vigil_steps_total", selector=f'{{tier="0", {real}}}'),
             "L{{tier}}", instant=True)], unit="percentunit", width=6, max_value=1,
             description="The escalation budget actually spent: each tier's count over the "
             "steps screened, over the dashboard's time range."))
         .with_panel(timeseries_panel("Budget vs actual: share of steps passing each gate", [
             query(f"sum by (stream) (rate(vigil_steps_total{{tier=\"1\", {real}}}"
                   "[$__rate_interval])) / sum by (stream) (rate(vigil_steps_total"
                   f"{{tier=\"0\", {real}}}[$__rate_interval]))", "{{stream}} reaching L1"),
             query(f"sum by (stream) (rate(vigil_steps_total{{tier=\"2\", {real}}}"
                   "[$__rate_interval])) / sum by (stream) (rate(vigil_steps_total"
                   f"{{tier=\"0\", {real}}}[$__rate_interval]))", "{{stream}} reaching L2"),
             query("max by (gate) (vigil_gate_budget)", "budget past {{gate}}")],
             unit="percentunit",
             description="Per stream, the share of real steps that reached L1 and L2, against "
             "each gate's budget. On traffic the models were not trained on the calibrated "
             "thresholds may overspend; `monitor stream --adapt` moves them to hold the budget."))
         .with_panel(timeseries_panel("Gate thresholds: calibrated and live", [query(
             "max by (gate, kind) (vigil_gate_threshold)", "{{gate}} {{kind}}")],
             description="Each gate's calibrated threshold and, with --adapt, the live one kept "
             "at its budget by a quantile sketch of the scores reaching it (never above the "
             "score that keeps canary recall at the calibrated threshold's)."))
         .with_panel(timeseries_panel("Escalations published by tier", [query(
             _rate("vigil_escalations_total", ["tier"], _STREAM), "to L{{tier}}")],
             unit="ops", description="Escalation records published per second, by the tier "
             "escalated to."))
         .with_panel(timeseries_panel("Pages triggered", [query(
             _rate("vigil_pages_triggered_total", ["result"]), "{{result}}")], unit="ops",
             stack=True, description="Page trigger events sent to the paging service per "
             "second (opened: a new page; deduplicated: a redelivered step)."))
         .with_row(row("Latency"))
         .with_panel(timeseries_panel(
             "Model time per step by tier (p50, p99)",
             _quantiles("vigil_tier_latency_seconds", (0.5, 0.99), ["tier"], "L{{tier}} "),
             unit="s", log_scale=True,
             description="Per step, the model time of the batch it was scored in."))
         .with_panel(timeseries_panel(
             "Produce → output latency by stage (p50, p99)",
             _quantiles("vigil_step_latency_seconds", (0.5, 0.99), ["stage"], "{{stage}} "),
             unit="s", log_scale=True,
             description="Per step, from the input record's produce time to the stage's "
             "outputs published."))
         .with_panel(timeseries_panel(
             "Produce → tier score (p50, p99)",
             _quantiles("vigil_score_latency_seconds", (0.5, 0.99), ["tier"], "tier {{tier}} "),
             unit="s", log_scale=True,
             description="Per step, from the step's produce time to its tier-0 score (screen "
             "stage) and its tier-1 score (probe stage, across both stages): the tier-0 "
             "score does not wait for L1."))
         .with_row(row("Delivery"))
         .with_panel(timeseries_panel("Consumer lag by stage", [query(
             "sum by (stage) (vigil_consumer_lag)", "{{stage}}")], width=6,
             description="Records behind the high-water mark, summed over the partitions of "
             "each stage's input."))
         .with_panel(timeseries_panel("Dead letters by stage and reason", [query(
             _rate("vigil_deadletters_total", ["stage", "reason"]), "{{stage}}: {{reason}}")],
             unit="ops", width=6, stack=True,
             description="Records sent to the dead-letter topic per second."))
         .with_panel(timeseries_panel("Rollout verdicts", [query(
             _rate("vigil_rollout_verdicts_total", ["quarantine"]),
             "quarantine={{quarantine}}")], unit="ops", width=6, stack=True,
             description="Per-execution verdicts published for trainers, per second."))
         .with_panel(timeseries_panel("Webhook deliveries", [query(
             "max by (ok) (rate(vigil_webhook_deliveries_total[$__rate_interval]))",
             "ok={{ok}}")], unit="ops", width=6, stack=True,
             description="The paging service's webhook delivery attempts per second (every "
             "service instance reports the same database: max, not sum)."))
         .with_row(row("Broker and delivery health"))
         .with_panel(stat_panel("Broker answering", [query(
             "min(vigil_broker_up)", "up", instant=True)], decimals=0, height=8,
             thresholds=_thresholds((None, "red"), (1, "green")),
             description="1 while every worker's broker watch gets an answer from the broker "
             "(asked every second), 0 while one does not: its stages wait, commit nothing and "
             "resume when it is back."))
         .with_panel(timeseries_panel("Stages whose outputs are acknowledged", [query(
             "min by (stage) (vigil_stage_delivering)", "{{stage}}")], width=6,
             description="1 while the broker acknowledges a stage's outputs, 0 while they "
             "wait to be published again."))
         .with_panel(timeseries_panel("Delivery failures and broker outages", [
             query(_rate("vigil_delivery_failures_total", ["stage"]), "{{stage}} retried"),
             query("sum(rate(vigil_broker_outages_total[$__rate_interval]))", "outages")],
             unit="ops", width=6, description="Flushes the broker did not acknowledge per "
             "second (each is retried, nothing is lost), and broker outages per second."))
         .with_panel(timeseries_panel("Rollout executions closed incomplete", [query(
             _rate("vigil_rollout_timeouts_total", ["stage"]), "{{stage}}")], unit="ops",
             width=6, description="Executions whose end never came within the execution "
             "timeout: they get a verdict marked incomplete so commits move on."))
         .with_row(row("Review (L2)"))
         .with_panel(timeseries_panel("Reviews by backend and outcome", [query(
             _rate("vigil_reviews_total", ["backend", "outcome"]), "{{backend}} {{outcome}}")],
             unit="ops", width=8, stack=True, description="L2 reviews per second."))
         .with_panel(timeseries_panel("Reviewer cost per hour", [query(
             _rate("vigil_reviewer_cost_total", ["backend"]) + " * 3600", "{{backend}}")],
             width=8, description="The reviewer's cost per hour in its backend's unit "
             "(endpoint: money; local: seconds)."))
         .with_panel(stat_panel("Reviewer cost", [query(
             _increase("vigil_reviewer_cost_total", ["backend"]), "{{backend}}",
             instant=True)], height=8, description="The reviewer's cost over the dashboard's "
             "time range, in its backend's unit."))
         .with_panel(stat_panel("Review error share", [query(_ratio(
             _increase("vigil_reviews_total", selector='{outcome="error"}'),
             _increase("vigil_reviews_total")), "errors", instant=True)],
             unit="percentunit", height=8,
             thresholds=_thresholds((None, "green"), (0.01, "orange"), (0.1, "red")),
             description="Share of L2 reviews that failed, over the dashboard's time range."))
         )
    return d


# ---------------------------------------------------------------------------------------------
# recall

_ORIGINS = {"canary": "Canary", "dataset": "Dataset-label", "human": "Human-label"}


def _recall_with_interval(tier: int, window: str, *, instant: bool = False,
                          legend: str | None = None, **match: str) -> list[Query]:
    """Recall at ``tier`` and its 95 % Wilson bounds, as three queries (legend prefix
    ``legend``, default ``"L<tier> "``)."""
    pre = f"L{tier} " if legend is None else legend
    return [query(promql.reached_share(tier, window, bound=bound, **match),
                  f"{pre}{bound or 'recall'}", instant=instant)
            for bound in (None, "lower", "upper")]


def _interval_band_overrides(panel: timeseries.Panel, names: Sequence[str],
                             color: Callable[[str], str]) -> timeseries.Panel:
    """Draw ``<name> lower``/``<name> upper`` as a shaded band around ``<name> recall``."""
    for name in names:
        c = color(name)
        panel = (panel
                 .override_by_name(f"{name}recall", [_fixed_color(c)])
                 .override_by_name(f"{name}upper", [
                     _fixed_color(c),
                     dm.DynamicConfigValue(id_val="custom.fillBelowTo", value=f"{name}lower"),
                     dm.DynamicConfigValue(id_val="custom.fillOpacity", value=15),
                     dm.DynamicConfigValue(id_val="custom.lineWidth", value=0)])
                 .override_by_name(f"{name}lower", [
                     _fixed_color(c), dm.DynamicConfigValue(id_val="custom.lineWidth", value=0)]))
    return panel


def _recall_timeseries(origin: str) -> timeseries.Panel:
    queries = [q for k in TIERS for q in _recall_with_interval(
        k, "$window", origin=origin, stream="~$stream")]
    p = timeseries_panel(
        f"{_ORIGINS[origin]} recall per tier (window $window)", queries, unit="percentunit",
        width=8, max_value=1,
        description=f"Share of harmful {origin}-labelled steps screened in the last $window "
        "that reached each tier, with its 95 % Wilson interval (the shaded band).")
    return _interval_band_overrides(p, [f"L{k} " for k in TIERS],
                                    lambda n: _TIER_COLORS[int(n[1])])


def _recall_table(title: str, by: Sequence[str], description: str, *,
                  benign: bool = False) -> table.Panel:
    """One row per (``by`` labels, tier) over the dashboard range: rate, interval, count."""
    label = "0" if benign else "1"
    name, count = ("benign escalation rate", "benign screened") if benign else \
        ("recall", "harmful screened")

    def share(bound: str | None) -> Callable[[int], str]:
        return lambda k: promql.reached_share(k, "$__range", label=label, bound=bound, by=by,
                                              stream="~$stream")

    def screened(k: int) -> str:
        return promql.labelled(0, "$__range", by=by, label=label, stream="~$stream")

    queries = [query(promql.per_tier(f), "", instant=True, table_format=True)
               for f in (share(None), share("lower"), share("upper"), screened)]
    return table_panel(
        title, queries, description=description, sort_by="tier",
        columns={"Value #A": name, "Value #B": "95% lower", "Value #C": "95% upper",
                 "Value #D": count},
        percent_columns=(name, "95% lower", "95% upper"))


def recall() -> DashboardBuilder:
    """Recall per tier with Wilson intervals, false positives, page precision, canaries."""
    pp = "$__range"
    d = (_dashboard("vigil-recall", "vigil — recall",
                    "How much of the real harm vigil catches: recall per tier from every source "
                    "of ground truth (canaries, dataset labels, human verdicts) with 95 % Wilson "
                    "intervals, the benign escalation rate, and page precision.")
         .with_variable(stream_variable())
         .with_variable(window_variable())
         .with_row(row("Over the dashboard's time range"))
         .with_panel(stat_panel("Canary recall at L3", _recall_with_interval(
             3, pp, instant=True, legend="", origin="canary", stream="~$stream"),
             unit="percentunit", width=6, decimals=1,
             description="Injected known-harmful canary steps that reached L3, with the 95 % "
             "Wilson interval."))
         .with_panel(stat_panel("Dataset-label recall at L3", _recall_with_interval(
             3, pp, instant=True, legend="", origin="dataset", stream="~$stream"),
             unit="percentunit", width=6, decimals=1,
             description="Harmful steps by the labels of replayed data that reached L3, with "
             "the 95 % Wilson interval."))
         .with_panel(stat_panel("Human-label recall at L3", _recall_with_interval(
             3, pp, instant=True, legend="", origin="human", stream="~$stream"),
             unit="percentunit", width=6, decimals=1,
             description="Steps humans judged harmful that reached L3, with the 95 % Wilson "
             "interval."))
         .with_panel(stat_panel("Page precision", [
             query(promql.page_precision(pp), "precision", instant=True),
             query(promql.page_precision_interval(pp, "lower"), "lower", instant=True),
             query(promql.page_precision_interval(pp, "upper"), "upper", instant=True)],
             unit="percentunit", width=6, decimals=1,
             description="Share of human verdicts on pages that said harmful, with the 95 % "
             "Wilson interval."))
         .with_row(row("Recall per tier (sliding window $window)"))
         .with_panel(_recall_timeseries("canary"))
         .with_panel(_recall_timeseries("dataset"))
         .with_panel(_recall_timeseries("human"))
         .with_row(row("Recall and false positives by origin, stream and category"))
         .with_panel(_recall_table(
             "Recall per tier by origin", ["origin"],
             "Over the dashboard's time range. A step labelled by several origins counts once "
             "in each; reviewer labels exist only for steps that reached L2."))
         .with_panel(_recall_table(
             "Benign escalation rate per tier by origin", ["origin"],
             "Share of benign labelled steps that reached each tier (the false-positive rate, "
             "the budget actually spent), over the dashboard's time range.", benign=True))
         .with_panel(_recall_table(
             "Recall per tier by stream", ["origin", "stream"],
             "Over the dashboard's time range."))
         .with_panel(_recall_table(
             "Recall per tier by category", ["origin", "category"],
             "Over the dashboard's time range."))
         .with_row(row("False positives and page precision (sliding window $window)"))
         .with_panel(timeseries_panel("Benign escalation rate per tier (window $window)", [
             query(promql.reached_share(k, "$window", label="0", by=["origin"],
                                        stream="~$stream"),
                   f"{{{{origin}}}} L{k}") for k in TIERS],
             unit="percentunit", log_scale=True,
             description="Share of benign labelled steps screened in the last $window that "
             "reached each tier; compare with the tier budgets (e.g. L1 20 %, L2 2 %, "
             "L3 0.2 %)."))
         .with_panel(_interval_band_overrides(timeseries_panel(
             "Page precision (window $window)", [
                 query(promql.page_precision("$window"), "precision"),
                 query(promql.page_precision_interval("$window", "lower"), "lower"),
                 query(promql.page_precision_interval("$window", "upper"), "upper")],
             unit="percentunit", max_value=1,
             description="Share of human verdicts on pages in the last $window that said "
             "harmful, with its 95 % Wilson interval."), [""], lambda _: "purple")
             .override_by_name("precision", [_fixed_color("purple")]))
         .with_row(row("Pages and canaries"))
         .with_panel(bargauge_panel("Pages by state", [query(
             "max by (state) (vigil_pages)", "{{state}}", instant=True)],
             description="Pages in the paging service by status, now."))
         .with_panel(stat_panel("Pages opened and judged", [
             query("max(increase(vigil_pages_opened_total[$__range]))", "opened",
                   instant=True),
             query("max by (verdict) (increase(vigil_page_verdicts_total[$__range]))",
                   "{{verdict}}", instant=True)], width=6, height=8, decimals=0,
             description="Pages opened, and human verdicts on pages, over the dashboard's time "
             "range."))
         .with_panel(timeseries_panel("Canaries injected by stream", [query(
             _rate("vigil_canaries_injected_total", ["stream"], _STREAM), "{{stream}}")],
             unit="ops", width=6, stack=True,
             description="Known-harmful canary steps injected into live streams, per second."))
         .with_panel(bargauge_panel("Canary outputs suppressed", [
             query(_or_zero(_increase("vigil_canaries_suppressed_total",
                                      selector=f'{{what="{what}"}}')), f"{what}s", instant=True)
             for what in ("verdict", "page")],
             description="Canary verdicts and pages held back from trainers and humans, over "
             "the dashboard's time range."))
         )
    return d


# ---------------------------------------------------------------------------------------------
# RL health


def rl_health() -> DashboardBuilder:
    """The RL-health signals of ``monitor rlhealth`` (``vigil_rl_*``)."""
    timed_out_share = _ratio(
        _increase("vigil_rl_executions_total", selector='{timed_out="true"}'),
        _increase("vigil_rl_executions_total"))
    dedup_range = _ratio(_increase("vigil_rl_unique_nodes_total"),
                         _increase("vigil_rl_node_occurrences_total"))
    d = (_dashboard("vigil-rl-health", "vigil — RL health",
                    "Signals from the RL systems whose rollouts vigil screens: staleness, "
                    "execution shape, off-policy drift, rollout-training mismatch, reward "
                    "hacking.")
         .with_row(row("Latest training version"))
         .with_panel(stat_panel("Training version", [query(
             "max(vigil_rl_training_version)", "version")], decimals=0))
         .with_panel(stat_panel("Staleness: mean vs expected", [
             query("max(vigil_rl_staleness_mean)", "mean d"),
             query("max(vigil_rl_staleness_expected)", "expected E[d]")], decimals=2,
             description="Mean staleness d = consumed version - dispatch version of the latest "
             "closed version, and the configured E[d] = phi + (mu - 1)/2."))
         .with_panel(stat_panel("Timed-out executions", [query(
             timed_out_share, "timed out", instant=True)], unit="percentunit",
             description="Share of ended executions that hit the harness timeout, over the "
             "dashboard's time range."))
         .with_panel(stat_panel("De-duplication ratio", [query(
             dedup_range, "unique / occurrences", instant=True)], decimals=3,
             description="Unique calls over node occurrences (shared-prefix de-duplication), "
             "over the dashboard's time range."))
         .with_panel(stat_panel("Drift |M|", [query("max(vigil_rl_drift_nats)", "nats")],
                                decimals=3, description="Mean |M| of the latest closed "
                                "training version, in nats; it explodes before training "
                                "collapses."))
         .with_panel(stat_panel("RL-health alerts", [query(
             _increase("vigil_rl_alerts_total"), "alerts", instant=True)], decimals=0,
             thresholds=_thresholds((None, "green"), (1, "red")),
             description="Alerts raised over the dashboard's time range."))
         .with_row(row("Staleness and execution shape"))
         .with_panel(timeseries_panel("Staleness: mean vs expected", [
             query("max(vigil_rl_staleness_mean)", "mean d (latest version)"),
             query("max(vigil_rl_staleness_expected)", "expected E[d]"),
             _hist_mean("vigil_rl_staleness", "mean d (per sample)")], width=8,
             description="Observed staleness against the configured target "
             "E[d] = phi + (mu - 1)/2."))
         .with_panel(timeseries_panel(
             "Staleness quantiles", _quantiles("vigil_rl_staleness", (0.5, 0.9, 0.99)),
             width=8, description="Per consumed sample, d = consumed_version - "
             "dispatch_version."))
         .with_panel(timeseries_panel(
             "Execution duration (p50, p99)",
             _quantiles("vigil_rl_execution_duration_seconds", (0.5, 0.99)), unit="s",
             width=8, log_scale=True,
             description="Execution wall time, first call start to end (long-tailed)."))
         .with_panel(timeseries_panel("Executions ended", [query(
             _rate("vigil_rl_executions_total", ["timed_out"]), "timed out={{timed_out}}")],
             unit="ops", width=8, stack=True,
             description="Ended executions per second; timed_out=true hit the harness "
             "timeout."))
         .with_panel(timeseries_panel(
             "Timeout rewards",
             [*_quantiles("vigil_rl_timeout_reward", (0.5, 0.9)),
              _hist_mean("vigil_rl_timeout_reward", "mean")], width=8,
             description="Partial-progress rewards of timed-out executions."))
         .with_panel(timeseries_panel("Trajectories admitted by role vs dropped", [
             query(_rate("vigil_rl_trajectories_admitted_total", ["role"]), "{{role}}"),
             query(_rate("vigil_rl_trajectories_dropped_total"), "dropped (over J_max)")],
             unit="ops", width=8, stack=True,
             description="Trajectories admitted per second under the J_max cap, by leaf role "
             "(main > main summary > sub > sub summary), and those dropped over it."))
         .with_panel(timeseries_panel("Shared-prefix de-duplication ratio", [
             query(_ratio(_rate("vigil_rl_unique_nodes_total"),
                          _rate("vigil_rl_node_occurrences_total")), "unique / occurrences"),
             *_quantiles("vigil_rl_dedup_ratio", (0.5,), legend="per execution ")],
             width=8, max_value=1,
             description="Calls counted once over calls counted once per trajectory through "
             "them (one reported case: 1,347 / 1,716 = 0.78)."))
         .with_panel(timeseries_panel("Group reward and reward hacking", [
             *_quantiles("vigil_rl_group_reward_mean", (0.5,), legend="group reward "),
             query(_rate("vigil_rl_reward_hacking_groups_total") + " * 60",
                   "reward-hacking groups / min")], width=8,
             description="Mean reward per execution group, and groups flagged because reward "
             "and harm rise together."))
         .with_panel(timeseries_panel("RL-health alerts by kind", [query(
             _rate("vigil_rl_alerts_total", ["kind"]) + " * 60", "{{kind}}")], width=8,
             stack=True, description="Alerts raised per minute, by kind."))
         .with_row(row("Off-policy drift and rollout-training mismatch"))
         .with_panel(timeseries_panel("Drift |M|", [
             query("max(vigil_rl_drift_nats)", "mean |M| (latest version)"),
             *_quantiles("vigil_rl_drift_abs_nats", (0.5, 0.99), legend="per sequence ")],
             width=8, log_scale=True,
             description="Per-sequence drift M = sum(log p_train - log p_rollout), in nats."))
         .with_panel(timeseries_panel("Out-of-trust token share", [query(
             "max(vigil_rl_out_of_trust_share)", "|rho - 1| > delta")], unit="percentunit",
             width=8, description="Share of tokens whose importance ratio leaves the trust "
             "region, latest closed version; watch it rise across passes."))
         .with_panel(timeseries_panel(
             "Whole-turn importance ratio |log rho_t|",
             _quantiles("vigil_rl_log_turn_ratio_abs", (0.5, 0.99)), width=8, log_scale=True,
             description="Per assistant turn, |log rho_t| with rho_t the product of the turn's "
             "token ratios."))
         .with_panel(timeseries_panel("Rollout-training mismatch", [
             query("max(vigil_rl_mismatch_abs_logprob)", "mean |log p_train - log p_rollout|"),
             query("max(vigil_rl_mismatch_k3_kl)", "k3 KL")], width=12,
             description="Per-token log-probability gap and the k3 KL estimate of the latest "
             "closed rollout version (nats)."))
         .with_panel(timeseries_panel("Mismatch: relative extra discrepancy", [query(
             "max(vigil_rl_mismatch_relative_extra)", "(D - D_ref) / D_ref")],
             unit="percentunit", width=12, min_value=None,
             description="The rollout precision's discrepancy over the reference precision's, "
             "minus one."))
         .with_row(row("Image and video generation (ART)"))
         .with_panel(stat_panel("ART: policy version", [query(
             "max(vigil_rl_art_version)", "version")], decimals=0, width=4,
             description="Latest closed policy version of the image-generation run."))
         .with_panel(timeseries_panel("ART: masked states", [
             query("max(vigil_rl_art_masked_share)", "masked share"),
             query("max(vigil_rl_art_masked_share_trend)", "trend per version")],
             unit="percentunit", width=10, min_value=None,
             description="Share of states the trust-region mask zeroes (m >= delta and "
             "<d, G - d> > 0), latest closed version, and its slope; a climb means the "
             "updates push past the trust region."))
         .with_panel(timeseries_panel("ART: drift", [
             query("max(vigil_rl_art_drift_norm)", "mean |d|"),
             query("max(vigil_rl_art_drift_dot_g)", "mean <d, G>")], width=10, min_value=None,
             description="Drift d = v_theta - v_theta0 of the velocity network, and its "
             "component along the guidance direction G."))
         .with_panel(timeseries_panel("ART: prompts without learning signal", [query(
             "max(vigil_rl_art_no_signal_share)", "Z_c under the floor")],
             unit="percentunit", width=6,
             description="Share of prompts whose K rewards are equal: they teach nothing."))
         .with_panel(timeseries_panel("ART: reward and endpoint diversity", [
             query("max(vigil_rl_art_reward_mean)", "mean reward"),
             query("max(vigil_rl_art_endpoint_diversity)", "endpoint diversity"),
             query("max(vigil_rl_art_collapsed_prompts)", "collapsing prompts")],
             width=6, description="Reward rising while a prompt's endpoints collapse onto "
             "each other (diversity: mean pairwise distance of their world-model vision "
             "embeddings) is reward hacking or mode collapse."))
         .with_panel(timeseries_panel("ART: reward per reward model", [query(
             "max by (head) (vigil_rl_art_head_reward_mean)", "{{head}}")], width=6,
             description="Mean reward of every reward model, latest closed version."))
         .with_panel(timeseries_panel("ART: reward-model divergence", [query(
             "max by (head) (vigil_rl_art_head_divergence)", "{{head}}")], width=6,
             min_value=None, description="A head's recent change minus the other heads' "
             "median, in baseline standard deviations: one head rising alone is a "
             "weighted-sum reward gamed on that head."))
         .with_panel(bargauge_panel("RL-health alerts by kind (time range)", [query(
             _increase("vigil_rl_alerts_total", ["kind"]), "{{kind}}", instant=True)],
             width=24, height=6))
         )
    return d


BOARDS: dict[str, Callable[[], DashboardBuilder]] = {
    "vigil-overview": overview,
    "vigil-recall": recall,
    "vigil-rl-health": rl_health,
}


# ---------------------------------------------------------------------------------------------
# build, inspect


_INTERVAL_ONLY = ("auto", "auto_count", "auto_min")


def build_dashboard(builder: DashboardBuilder) -> dict[str, Any]:
    """The dashboard's JSON model: the one ``.build()``, panel ids numbered in order."""
    model: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    for i, panel in enumerate(_walk(model.get("panels", [])), start=1):
        panel["id"] = i
    for var in model.get("templating", {}).get("list", []):
        if var.get("type") != "interval":  # the SDK writes interval settings on every variable
            for key in _INTERVAL_ONLY:
                var.pop(key, None)
    return model


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard's JSON model, by uid."""
    return {uid: build_dashboard(make()) for uid, make in BOARDS.items()}


def dashboards() -> list[dict[str, Any]]:
    """Every dashboard's JSON model, in ``BOARDS`` order."""
    return list(build_dashboards().values())


def dashboard_text(model: Mapping[str, Any]) -> str:
    """The dashboard as written to disk: sorted keys, indent 2, trailing newline."""
    return json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _walk(panels: Sequence[Mapping[str, Any]]) -> Iterator[Any]:
    for p in panels:
        yield p
        yield from _walk(p.get("panels") or [])


def panel_queries(dashboard_json: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, PromQL expr)`` for every target of every panel, rows' panels included."""
    out = []
    for panel in _walk(dashboard_json.get("panels") or []):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets") or []:
            out.append((str(panel.get("title", "")), str(target.get("expr", ""))))
    return out


_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    m = re.fullmatch(r"(\d+)([smhdw])", duration)
    if not m:
        raise ValueError(f"window must be a duration like 5m or 1h, got {duration!r}")
    return int(m.group(1)) * units[m.group(2)]


def substitute_variables(expr: str, window: str = "5m", *, stream: str = ".*") -> str:
    """``expr`` as Grafana would send it: template variables replaced by plain values.

    ``$__rate_interval``, ``$__interval``, ``$__range`` and ``$window`` become ``window``;
    ``$__range_s``/``$__range_ms``/``$__interval_ms`` its seconds or milliseconds;
    ``$stream`` (a regex matcher's value) becomes ``stream`` (``.*``, like "All").
    An unknown variable raises ``ValueError``.
    """
    s = _seconds(window)
    values = {
        "__rate_interval": window, "__interval": window, "__range": window, "window": window,
        "__range_s": str(s), "__range_ms": str(s * 1000), "__interval_ms": str(s * 1000),
        "stream": stream,
    }

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in values:
            return values[name]
        if name.isdigit():  # a regex back-reference such as label_replace's "$1"
            return m.group(0)
        raise ValueError(f"unknown template variable ${name} in {expr[:120]!r}")

    return _VARIABLE.sub(sub, expr)
