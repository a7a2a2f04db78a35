"""Prometheus alerting rules for the worker (``monitor dashboards export`` writes them to
``prometheus/vigil-alerts.yaml``; list the file under ``rule_files`` in prometheus.yml).

* ``VigilStageFallingBehind``: a stage is more than ``LAG_RECORDS`` records behind and the
  lag still grows after ``FOR_LAG``. Nothing is dropped when L1 or L2 cannot keep up; the
  lag grows instead. Scale the stage out (docs/dashboards.md, "Alerts and scaling").
* ``VigilGateOverBudget``: a stream sends more than 1.25 times the L0 budget of its real
  steps to L1 for ``FOR_BUDGET`` (new traffic the models were not trained on; run the screen
  stage with ``--adapt``, or recalibrate).
* ``VigilBrokerDown``: the worker cannot reach the broker.
"""

from __future__ import annotations

from typing import Any

LAG_RECORDS = 1000
FOR_LAG = "10m"
FOR_BUDGET = "15m"
OVER_BUDGET = 1.25


def alert_rules() -> dict[str, Any]:
    """The rule file, as Prometheus reads it (``promtool check rules`` accepts it)."""
    real = 'canary="false"'
    share = (f'sum by (stream) (rate(vigil_steps_total{{tier="1", {real}}}[5m])) / '
             f'sum by (stream) (rate(vigil_steps_total{{tier="0", {real}}}[5m]))')
    return {"groups": [{"name": "vigil", "rules": [
        {"alert": "VigilStageFallingBehind",
         "expr": f"sum by (stage) (vigil_consumer_lag) > {LAG_RECORDS} "
                 "and sum by (stage) (delta(vigil_consumer_lag[5m])) > 0",
         "for": FOR_LAG,
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "vigil {{ $labels.stage }} stage is {{ $value }} records behind and "
                        "falling further",
             "description": "Nothing is dropped: the stage's input waits on the broker. Start "
                            "more members of its consumer group (monitor stream --role "
                            "{{ $labels.stage }}) or give it a larger batch."}},
        {"alert": "VigilGateOverBudget",
         "expr": f"({share}) > {OVER_BUDGET} * scalar(max(vigil_gate_budget{{gate=\"L0\"}}))",
         "for": FOR_BUDGET,
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "stream {{ $labels.stream }} sends {{ $value | humanizePercentage }} "
                        "of its steps to L1, over its budget",
             "description": "The calibrated L0 threshold overspends on this traffic. Run the "
                            "screen stage with --adapt, or recalibrate on data like it."}},
        {"alert": "VigilBrokerDown",
         "expr": "vigil_broker_up == 0",
         "for": "1m",
         "labels": {"severity": "critical"},
         "annotations": {
             "summary": "the vigil worker cannot reach the broker",
             "description": "Every stage waits and commits nothing until the broker is back."}},
    ]}]}
