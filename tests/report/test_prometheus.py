"""`monitor report` from a real Prometheus scraping a real ``prometheus_client`` exporter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from dashboards.metrics import WorkerMetrics
from dashboards.prometheus import LocalPrometheus
from dashboards.report import recall_from_prometheus, recall_over_time, render_report
from streams.broker import free_port
from tests.report.test_files import assert_png, monitor

HARMFUL = {0: 40, 1: 30, 2: 20, 3: 10}  # canary harmful steps reaching each tier
BENIGN = {0: 1000, 1: 200, 2: 20, 3: 2}  # labelled benign steps reaching each tier
STEPS = {0: 5000, 1: 1000, 2: 100, 3: 10}  # deployment traffic reaching each tier



class Exporter:
    """The worker's metrics (and the paging service's verdict counter) on a free port."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = WorkerMetrics(self.registry)
        # the paging service's counter, as the metrics contract names it
        self.page_verdicts = Counter("vigil_page_verdicts", "Human verdicts on pages",
                                     ["verdict"], registry=self.registry)
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1",
                                                     registry=self.registry)

    def count(self, scale: int) -> None:
        """Add ``scale`` times the known numbers (0 creates every series at zero)."""
        m = self.metrics
        for tier in range(4):
            m.labelled.labels(origin="canary", stream="deployment", category="exfiltration",
                              label="1", tier=str(tier)).inc(scale * HARMFUL[tier])
            m.labelled.labels(origin="human", stream="deployment", category="none",
                              label="0", tier=str(tier)).inc(scale * BENIGN[tier])
            m.steps.labels(stream="deployment", tier=str(tier), canary="false").inc(
                scale * STEPS[tier])
            m.steps.labels(stream="deployment", tier=str(tier), canary="true").inc(
                scale * HARMFUL[tier])
        self.page_verdicts.labels(verdict="harmful").inc(scale * 8)
        self.page_verdicts.labels(verdict="benign").inc(scale * 2)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def prometheus() -> Iterator[LocalPrometheus]:
    """A real Prometheus that has scraped the series at zero, then the known increments."""
    exporter = Exporter()
    exporter.count(0)
    prom = LocalPrometheus([f"127.0.0.1:{exporter.port}"], scrape_interval_s=1).start()
    try:
        # increase() takes the first scraped value as the start: scrape the zeros first
        prom.wait_for('vigil_labelled_steps_total{tier="3", label="1"}', timeout_s=20)
        exporter.count(1)
        deadline = time.monotonic() + 20
        while True:  # the increments scraped, and one more scrape after them
            (raw,) = prom.client.query('vigil_labelled_steps_total{tier="0", label="1"}[1m]')
            if sum(float(v) > 0 for _t, v in raw["values"]) >= 2:
                break
            assert time.monotonic() < deadline, prom.log()
            time.sleep(0.25)
        yield prom
    finally:
        prom.stop()
        exporter.close()


def test_recall_per_tier_from_real_prometheus(prometheus: LocalPrometheus) -> None:
    table = recall_from_prometheus(prometheus.client, "5m")
    (canary,) = [g for g in table.aggregate(("origin",)) if g.origin == "canary"]
    # increase() extrapolates each count, but the series share their samples: the ratio holds
    assert canary.harmful == pytest.approx(40, rel=0.5)
    for tier, want in {0: 1.0, 1: 0.75, 2: 0.5, 3: 0.25}.items():
        p = canary.tier(tier).harmful
        assert p.value is not None and p.lower is not None and p.upper is not None
        assert abs(p.value - want) < 0.02, (tier, p)
        assert p.lower < p.value <= p.upper
    human = table.overall()
    for tier, want in {1: 0.2, 2: 0.02, 3: 0.002}.items():
        fpr = human.tier(tier).benign.value
        assert fpr is not None and abs(fpr - want) < 0.002, (tier, fpr)
    steps = table.funnel_steps()  # canary steps are counted apart
    assert steps[1] / steps[0] == pytest.approx(0.2, abs=0.005)
    assert steps[3] / steps[0] == pytest.approx(0.002, abs=0.0005)
    canaries = sum(f.canary for f in table.funnel if f.tier == 0)
    assert canaries / steps[0] == pytest.approx(40 / 5000, abs=0.001)
    assert table.page_precision is not None
    assert table.page_precision.value == pytest.approx(0.8, abs=0.02)
    assert table.window == "5m" and table.at is not None


def test_recall_over_time_and_pngs(prometheus: LocalPrometheus, tmp_path: Path) -> None:
    now = time.time()
    series = recall_over_time(prometheus.client, now - 30, now, 1, "5m")
    last = series.line("canary", 1)[-1]
    assert last.recall.value is not None and abs(last.recall.value - 0.75) < 0.02
    assert series.origins == ("canary",)  # benign labels carry no recall
    table = recall_from_prometheus(prometheus.client, "5m", at=now)
    paths = render_report(table, tmp_path, series)
    assert [p.name for p in paths] == ["recall.png", "funnel.png", "recall_over_time.png",
                                       "report.json"]
    for p in paths[:3]:
        assert_png(p)


def test_cli_against_real_prometheus(prometheus: LocalPrometheus, tmp_path: Path) -> None:
    out = monitor("report", "--prometheus", prometheus.url, "--window", "5m", "--since",
                  "2m", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "canary" in out.stdout and "0.75" in out.stdout
    assert "page precision: 0.8" in out.stdout
    assert (tmp_path / "recall_over_time.png").exists()


def test_cli_unreachable_prometheus_is_one_sentence(tmp_path: Path) -> None:
    out = monitor("report", "--prometheus", f"http://127.0.0.1:{free_port()}", "--out",
                  str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "cannot reach Prometheus" in out.stderr
    bad = monitor("report", "--prometheus", "http://127.0.0.1:9", "--window", "an hour")
    assert bad.returncode == 2 and "not a duration" in bad.stderr


def test_empty_prometheus_renders_no_data_figures(tmp_path: Path) -> None:
    with LocalPrometheus([f"127.0.0.1:{free_port()}"]) as prom:
        table = recall_from_prometheus(prom.client, "5m")
        assert table.groups == () and table.notes
        paths = render_report(table, tmp_path)
    for p in paths[:2]:
        assert_png(p, min_bytes=5_000)
