"""The alerting rules under Debian's promtool: they check, a stage whose lag keeps growing
alerts while one that catches up does not, and a stream over its L1 budget alerts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from dashboards.alerts import alert_rules
from dashboards.provision import export_dashboards


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool comes with Debian's prometheus package (make apt)"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)


def test_exported_rules_check(tmp_path: Path) -> None:
    export_dashboards(tmp_path, "http://prom.example:9090")
    rules = tmp_path / "prometheus" / "vigil-alerts.yaml"
    got = _promtool("check", "rules", str(rules))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "3 rules found" in got.stdout + got.stderr


def test_rules_fire_on_a_growing_lag_and_an_overspent_budget(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(alert_rules()))
    lag = 'vigil_consumer_lag{stage="%s", topic="vigil.escalations", partition="0"}'
    steps = 'vigil_steps_total{stream="deployment", tier="%s", canary="false"}'
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                # review falls behind: +500 records a minute for half an hour
                {"series": lag % "review", "values": "2000+500x30"},
                # screen was behind but catches up: -100 a minute
                {"series": lag % "screen", "values": "5000-100x30"},
                # 40 % of deployment steps reach L1 against a 20 % budget
                {"series": steps % "0", "values": "0+100x30"},
                {"series": steps % "1", "values": "0+40x30"},
                {"series": 'vigil_gate_budget{gate="L0"}', "values": "0.2x30"},
                {"series": "vigil_broker_up", "values": "1x30"},
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "VigilStageFallingBehind", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "VigilStageFallingBehind", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "stage": "review"},
                    "exp_annotations": {
                        "summary": "vigil review stage is 12000 records behind and falling "
                                   "further",
                        "description": "Nothing is dropped: the stage's input waits on the "
                                       "broker. Start more members of its consumer group "
                                       "(monitor stream --role review) or give it a larger "
                                       "batch."}}]},
                {"eval_time": "25m", "alertname": "VigilGateOverBudget", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "stream": "deployment"},
                    "exp_annotations": {
                        "summary": "stream deployment sends 40% of its steps to L1, over its "
                                   "budget",
                        "description": "The calibrated L0 threshold overspends on this "
                                       "traffic. Run the screen stage with --adapt, or "
                                       "recalibrate on data like it."}}]},
                {"eval_time": "25m", "alertname": "VigilBrokerDown", "exp_alerts": []},
            ],
        }],
    }
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump(test))
    got = _promtool("test", "rules", str(spec))
    assert got.returncode == 0, got.stdout + got.stderr
