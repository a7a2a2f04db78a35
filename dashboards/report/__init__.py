"""Recall and funnel reports as PNG files, for people without Grafana (``monitor report``).

Two sources give the same :class:`RecallTable`:

* a Prometheus server holding the worker's metrics (:func:`recall_from_prometheus`,
  :mod:`dashboards.report.from_prometheus`): ``increase(vigil_labelled_steps_total[window])``
  per (origin, stream, category, label, tier), the ``vigil_steps_total`` funnel and
  ``vigil_page_verdicts_total``; :func:`recall_over_time` gives a :class:`RecallSeries`;
* files (:func:`recall_from_files`, :mod:`dashboards.report.from_files`): the output of
  ``monitor screen`` joined with step labels from interchange-format trajectories or
  ``LabelRecord`` JSON Lines.

Recall at tier k is the share of harmful labelled steps screened (tier 0) that reached
tier k, with its 95 % Wilson interval (:mod:`dashboards.report.table`);
:func:`render_report` draws ``recall.png``, ``funnel.png`` and, given a time series,
``recall_over_time.png``, and writes ``report.json``; :func:`format_table` is the
plain-text table (:mod:`dashboards.report.render`).

This module is the package's public API; the modules behind it are::

    table.py             the numbers: RecallTable, RecallSeries, Proportion, ReportError
    from_files.py        monitor screen output + labels -> RecallTable
    from_prometheus.py   the worker's metrics -> RecallTable, RecallSeries
    render.py            PNG figures, report.json, the text table
"""

from __future__ import annotations

from dashboards.report.from_files import recall_from_files
from dashboards.report.from_prometheus import recall_from_prometheus, recall_over_time
from dashboards.report.render import (
    format_table,
    render_funnel,
    render_recall,
    render_recall_over_time,
    render_report,
)
from dashboards.report.table import (
    FunnelStage,
    GroupRecall,
    Proportion,
    RecallPoint,
    RecallSeries,
    RecallTable,
    ReportError,
    TierCounts,
    parse_duration,
)

__all__ = [
    "FunnelStage",
    "GroupRecall",
    "Proportion",
    "RecallPoint",
    "RecallSeries",
    "RecallTable",
    "ReportError",
    "TierCounts",
    "format_table",
    "parse_duration",
    "recall_from_files",
    "recall_from_prometheus",
    "recall_over_time",
    "render_funnel",
    "render_recall",
    "render_recall_over_time",
    "render_report",
]
