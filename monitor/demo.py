"""`monitor demo`: the whole pipeline on the embedded defaults, end to end on a real broker.

Starts the embedded Tansu broker, prepares the small default models (trained on
first run, minutes, with progress; loaded afterwards), starts the paging service
in-process (uvicorn on a loopback port, SQLite in a temporary folder) and the
streaming worker (reassemble, screen, review) in threads, then replays a sample
of held-out AgentDojo evaluation trajectories (``test_slack``, ``test_attacks``:
benign and hijacked), the packaged sample trajectories and TITO rollout records,
and one malformed record (to show the dead-letter path). It prints each step's
tier and each page as they happen, then what flowed on every topic and a summary:
steps per tier, pages, and recall on the labelled steps.
"""

from __future__ import annotations

import io
import json
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from streams.bus import Bus, Message
from streams.processor import H_DLQ_REASON, H_IDEMPOTENCY

if TYPE_CHECKING:
    from monitor.stream.screen import ScreenedStep
    from streams.records import Trajectory
    from streams.rollouts import TreeSummary

EVAL_SPLITS = ("test_slack", "test_attacks")


def sample_path(name: str) -> Path:
    return Path(str(resources.files("monitor") / "data" / name))


# --- the paging service, in-process -------------------------------------------------------


@dataclass(frozen=True)
class PagingServer:
    """A running paging service: its URL and a producer and a reviewer token."""

    url: str
    producer_token: str
    reviewer_token: str
    database_url: str

    def pages(self, status: str = "all") -> list[dict[str, Any]]:
        """Every page (``GET /api/v1/pages``), with its alerts."""
        import httpx

        auth = {"Authorization": f"Bearer {self.reviewer_token}"}
        with httpx.Client(base_url=self.url, headers=auth, timeout=10) as c:
            items = c.get("/api/v1/pages", params={"status": status, "limit": 500}).json()
            return [c.get(f"/api/v1/pages/{p['id']}").json() for p in items["items"]]


@contextmanager
def paging_server(
    folder: Path,
    *,
    console: TextIO | None = None,
    bus: Bus | None = None,
    labels_topic: str | None = None,
) -> Iterator[PagingServer]:
    """Run the paging service under uvicorn in a thread (SQLite under ``folder``); with a
    ``bus``, verdicts are published to ``labels_topic``."""
    import uvicorn
    from pydantic import SecretStr

    from monitor.service.app import create_app
    from monitor.service.auth import provision_store
    from monitor.service.settings import PagingSettings

    url = f"sqlite:///{folder / 'paging.db'}"
    issued = provision_store(url, {"stream-worker": "producer", "demo-reviewer": "reviewer"})
    producer, reviewer = issued["stream-worker"], issued["demo-reviewer"]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings = PagingSettings(database_url=url, public_url=base, publish_labels=bus is not None,
                              labels_topic=labels_topic,
                              secret_key=SecretStr("vigil-demo-session-key"),
                              poll_interval_s=0.2)
    app = create_app(settings, console=console or io.StringIO(), bus=bus)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="vigil-paging")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the paging service did not start within 30 s")
        time.sleep(0.05)
    try:
        yield PagingServer(base, producer, reviewer, url)
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


# --- what to replay ----------------------------------------------------------------------


def eval_sample(path: Path, n: int = 36, *, seed: int = 0) -> list[Trajectory]:
    """``n`` held-out AgentDojo trajectories, a third benign where there are that many."""
    from streams.records import Trajectory, decode

    benign: list[Trajectory] = []
    hijacked: list[Trajectory] = []
    with path.open("rb") as f:
        for raw in f:
            obj = json.loads(raw)
            if (obj.get("meta") or {}).get("split") not in EVAL_SPLITS:
                continue
            t = decode(raw, Trajectory)
            (hijacked if t.harmful else benign).append(t)
    rng = random.Random(seed)
    n_benign = min(len(benign), n // 3)
    picked = rng.sample(benign, n_benign) + rng.sample(hijacked, min(len(hijacked), n - n_benign))
    rng.shuffle(picked)
    return [t.model_copy(update={"source": "deployment"}) for t in picked]


# --- printing ----------------------------------------------------------------------------


def _read_everything(bus: Bus, topics: list[str], idle_s: float = 2.0) -> dict[str, list[Message]]:
    consumer = bus.consumer(topics, f"vigil-demo-reader-{time.time_ns()}")
    by_topic: dict[str, list[Message]] = defaultdict(list)
    last = None
    try:
        while True:
            batch = consumer.poll(0.3)
            for m in batch:
                by_topic[m.topic].append(m)
            if batch or (last is None and consumer.assigned):
                last = time.monotonic()
            if last is not None and time.monotonic() - last > idle_s:
                return by_topic
    finally:
        consumer.close()


def _describe(m: Message) -> str:
    reason = m.header(H_DLQ_REASON)
    if reason:
        return f"dead letter from {m.header('vigil-dlq-topic')}: {reason}"
    try:
        obj = json.loads(m.value)
    except ValueError:
        return repr(m.value[:80])
    if "step" in obj:
        s = obj["step"]
        tool = (s["action"].get("tool") or {}).get("name")
        call = f" -> {tool}()" if tool else ""
        return (
            f"{obj['trajectory_id']} step {s['step_id']} [{s['role']}] "
            f"{s['action']['text'][:60]!r}{call}"
        )
    if "call_id" in obj:
        return (
            f"{obj['execution_id']} call {obj['call_id']} [{obj['role']}] "
            f"{len(obj['input_ids'])} tokens in, {len(obj['output_ids'])} out"
        )
    if "reward" in obj:
        return f"{obj['execution_id']} ended: reward {obj['reward']}, timed out {obj['timed_out']}"
    if "quarantine" in obj:
        verdict = "quarantine" if obj["quarantine"] else "admit"
        return f"{obj['execution_id']}: {verdict} (score {obj['score']:.3f})"
    if "tier" in obj and "step_id" in obj:
        what = "escalated to" if "reason" in obj else "scored at"
        return (f"{obj['trajectory_id']} step {obj['step_id']}: {what} L{obj['tier']}, "
                f"score {obj['score']:.3f}")
    return m.value[:100].decode("utf-8", "replace")


def _step_line(s: ScreenedStep) -> str:
    e, v = s.event, s.verdict
    a = e.step.action
    what = f"{a.tool.name}()" if a.tool else repr(" ".join(a.text.split())[:40])
    label = {None: "", 0: "  [benign]", 1: "  [HARMFUL]"}[e.step.label]
    tier = f"L{v.tier}" + ("->review" if v.tier >= 2 else "")
    return (f"  {tier:<10} {e.trajectory_id[-48:]} step {e.step.step_id}: {what} "
            f"(p={v.score:.2f}){label}")


def step_tiers(scores: list[Message], escalations: list[Message]) -> dict[str, int]:
    """The tier each step reached (``trajectory/step`` -> 0-3), from the output topics
    (canary steps left out)."""
    reached: dict[str, int] = {}
    for m in [*scores, *escalations]:
        obj = json.loads(m.value)
        if str(obj["trajectory_id"]).startswith("canary/"):
            continue
        key = f"{obj['trajectory_id']}/{obj['step_id']}"
        if "reason" in obj:  # an escalation to tier k
            t = int(obj["tier"])
        else:  # a tier's score; flagged = passed up
            t = int(obj["tier"]) + (1 if obj.get("flagged") else 0)
        reached[key] = max(reached.get(key, 0), t)
    return reached


# --- the demo ----------------------------------------------------------------------------


def run_demo(
    limit: int = 3,
    *,
    policy: Path | None = None,
    trajectories: int = 36,
    seed: int = 0,
    out: TextIO | None = None,
    timeout_s: float = 600.0,
    canary_rate: float = 0.1,
) -> int:
    """Run the demo with ``policy`` (tests give a tiny one); without one, the policy under
    ``$VIGIL_HOME``, else the models shipped with vigil, else the small defaults, trained once.

    Where the default AgentDojo data exists, canaries from its training split are injected
    at ``canary_rate`` per step, and the summary gives their recall per tier."""
    import vigil.paths
    from monitor.defaults import prepare_defaults
    from monitor.pipeline import load_screener
    from monitor.stream.build import build_worker
    from monitor.stream.paging import PagingClient
    from monitor.stream.runner import WorkerConfig
    from streams.broker import EmbeddedBroker
    from streams.config import KafkaSettings, Topics
    from streams.kafka import KafkaBus
    from streams.processor import publish_record
    from streams.records import step_events
    from streams.replay import replay_file

    stream = out or sys.stdout
    lock = threading.Lock()

    def say(msg: str = "") -> None:
        with lock:
            print(msg, file=stream, flush=True)

    topics = Topics()
    if policy is None:
        from monitor.shipped import shipped_policy

        home_policy = vigil.paths.policy()
        policy = home_policy if home_policy.exists() else shipped_policy()
    if policy is None:  # a checkout without `make models`
        say("vigil demo: preparing the small default models (trained once, then loaded) ...")
        policy = prepare_defaults(small=True)
    dataset = vigil.paths.dataset("agentdojo") / "trajectories.jsonl"
    say(f"vigil demo: loading the screener ({policy}) ...")
    screener = load_screener(policy)
    from prometheus_client import CollectorRegistry

    from dashboards.metrics import WorkerMetrics

    metrics = WorkerMetrics(CollectorRegistry())
    if not dataset.exists():
        canary_rate = 0.0  # canaries come from the training split of the AgentDojo data
        dataset = sample_path("sample_agentdojo.jsonl")  # 36 held-out runs packaged with vigil
    say("vigil demo: starting the embedded broker (Tansu, memory only) ...")
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="vigil-demo-") as tmp:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers,
                                 client_id="vigil-demo")
        bus = KafkaBus(settings)
        bus.ensure_topics(topics.all())
        say(f"  broker on {broker.bootstrap_servers}; topics: {', '.join(topics.all())}")
        console = cast(TextIO, _Prefixed(say, "  "))
        with paging_server(Path(tmp), console=console) as paging:
            say(f"  paging service on {paging.url} (SQLite in {tmp})")

            rebuilt: list[int] = []

            def show_tree(t: TreeSummary) -> None:
                rebuilt.append(t.unique_nodes)
                say(
                    f"  {t.execution_id}: {t.unique_nodes} unique calls, {t.leaves} leaf "
                    f"trajectories, {t.node_occurrences} node occurrences "
                    f"({t.node_occurrences - t.unique_nodes} shared-prefix duplicates screened "
                    f"once), reward {t.reward}"
                )

            stop = threading.Event()
            worker = build_worker(
                WorkerConfig(topics=topics, group="vigil-demo", batch_size=32, grace_s=0.5,
                             stats_every_s=1e9),
                lambda: KafkaBus(settings),
                screener=screener,
                paging=PagingClient(paging.url, paging.producer_token),
                canary_rate=canary_rate,
                stop=stop,
                report=lambda msg: say(f"  {msg}"),
                on_step=lambda s: say(_step_line(s)),
                on_tree=show_tree,
                metrics=metrics,
            )
            runner = threading.Thread(target=worker.run, name="vigil-worker", daemon=True)
            runner.start()

            labels: dict[str, int | None] = {}
            sample: list[Trajectory] = []
            sent = 0
            if dataset.exists():  # the packaged sample where no AgentDojo data was built
                sample = eval_sample(dataset, trajectories, seed=seed)
                n_bad = sum(1 for t in sample if t.harmful)
                for t in sample:
                    for e in step_events(t):
                        publish_record(bus, topics.steps_deployment, e, key=e.trajectory_id)
                        labels[f"{t.trajectory_id}/{e.step.step_id}"] = e.step.label
                        sent += 1
                bus.flush()
                say(f"replayed {len(sample)} held-out AgentDojo trajectories ({n_bad} hijacked, "
                    f"{len(sample) - n_bad} benign; {sent} steps) -> {topics.steps_deployment}")
            else:
                say(f"no AgentDojo data at {dataset}: replaying the packaged samples only")
            for name in ("sample_trajectories.jsonl", "sample_tito.jsonl"):
                report = replay_file(sample_path(name), bus, topics)
                flow = ", ".join(f"{n} -> {t}" for t, n in sorted(report.published.items()))
                say(f"replayed {name}: {report.lines} lines ({flow})")
                if name == "sample_trajectories.jsonl":
                    sent += sum(report.published.values())
            bus.publish(topics.tito_calls, b'{"execution_id": "exec-broken", "call_id": "c1", "inp',
                        key="exec-broken")
            bus.flush()
            say("published one truncated TITO record (it should be dead-lettered)")
            say("screening as it happens (tier reached; L2+ goes to the reviewer; pages below):")
            n_trees = sum(1 for _ in sample_path("sample_tito.jsonl").open() if '"reward"' in _)
            deadline = time.monotonic() + timeout_s
            _wait_until_quiet(worker, lambda: sent + sum(rebuilt), n_trees, deadline)
            stop.set()
            runner.join(timeout=60)

            flowed = _read_everything(bus, topics.all())
            say("\nwhat flowed:")
            for topic in topics.all():
                every = flowed.get(topic, [])
                msgs = [m for m in every if not (m.key or "").startswith("canary/")]
                n_canary = len(every) - len(msgs)
                say(f"  {topic}: {len(msgs)} records"
                    + (f" (and {n_canary} of canaries)" if n_canary else ""))
                for m in msgs[:limit]:
                    say(f"      {_describe(m)}")
                if len(msgs) > limit:
                    say(f"      ... {len(msgs) - limit} more")
            pages = paging.pages()
        bus.close()
    _summary(say, flowed, topics, labels, pages)
    _recall_summary(say, metrics)
    say("\nbroker and paging service stopped.")
    _write_outputs(say, flowed, topics, sample, vigil.paths.home() / "demo")
    return 1 if worker.errors else 0


def _write_outputs(say: Any, flowed: dict[str, list[Message]], topics: Any,
                   sample: list[Trajectory], out: Path) -> None:
    """What to look at afterwards, under ``out``: the screened held-out runs and their labels
    (as ``monitor screen`` and the datasets write them), the recall report's PNGs from them,
    and the dashboards as Grafana provisions them."""
    from dashboards.provision import export_dashboards
    from dashboards.report.from_files import recall_from_files
    from dashboards.report.render import render_report
    from streams.records import encode

    out.mkdir(parents=True, exist_ok=True)
    tiers = step_tiers(flowed.get(topics.scores, []), flowed.get(topics.escalations, []))
    screened, labels = out / "screened.jsonl", out / "labels.jsonl"
    with screened.open("w") as f:
        for t in sample:
            steps = [{"step_id": s.step_id, "tier": tiers[k]} for s in t.steps
                     if (k := f"{t.trajectory_id}/{s.step_id}") in tiers]
            f.write(json.dumps({"trajectory_id": t.trajectory_id, "steps": steps}) + "\n")
    labels.write_bytes(b"".join(encode(t) + b"\n" for t in sample))
    say("\nwhere to look:")
    if sample:
        report = render_report(recall_from_files(screened, [labels]), out / "report")
        say(f"  recall report (PNG): {', '.join(str(p) for p in report)}")
    boards = export_dashboards(out / "grafana")
    say(f"  Grafana dashboards (JSON, provisioning): {out / 'grafana'} ({len(boards)} files)")
    say(f"  screened runs: {screened}; their labels: {labels}")
    say("  review pages: `monitor serve` starts the paging service (the demo's ran in memory); "
        "open http://127.0.0.1:8000/ (the queue) and /cases/<page id>")


class _Prefixed(io.TextIOBase):
    """The paging service's console channel, printed as the demo's own lines."""

    def __init__(self, say: Any, prefix: str) -> None:
        self.say, self.prefix = say, prefix

    def write(self, s: str) -> int:
        for line in s.splitlines():
            if line.strip():
                self.say(self.prefix + line)
        return len(s)


def _wait_until_quiet(
    worker: Any, steps: Callable[[], int], trees: int, deadline: float
) -> None:
    """Until the worker screened what was sent (rebuilt rollout steps included) and
    reviewed every escalation, canaries' too, or the deadline passes."""
    quiet_since = time.monotonic()
    last = None
    while time.monotonic() < deadline and not worker.errors:
        st = worker.stats
        now = (st.steps, st.canaries, st.reviewed, st.trees)
        if now != last:
            last, quiet_since = now, time.monotonic()
        done = (st.trees >= trees and st.steps >= steps()
                and st.reviewed >= st.reached[2] + st.canaries_to_review)
        if done and time.monotonic() - quiet_since > 2.0:
            return
        time.sleep(0.2)


def _summary(
    say: Any,
    flowed: dict[str, list[Message]],
    topics: Any,
    labels: dict[str, int | None],
    pages: list[dict[str, Any]],
) -> None:
    tiers = step_tiers(flowed.get(topics.scores, []), flowed.get(topics.escalations, []))
    by_tier = Counter(tiers.values())
    keys = Counter(m.header(H_IDEMPOTENCY) for m in flowed.get(topics.scores, []))
    say("\nsummary:")
    say(f"  {len(tiers)} steps screened ({sum(keys.values())} score records, "
        f"{len(keys)} distinct): " + ", ".join(
            f"{by_tier.get(k, 0)} stopped at L{k}" for k in range(4)))
    alerts = [a for p in pages for a in p.get("alerts", [])]
    say(f"  {len(pages)} pages for {len(alerts)} tier-3 steps; "
        f"{len(flowed.get(topics.verdicts_rollout, []))} rollout verdicts; "
        f"{len(flowed.get(topics.deadletter, []))} dead letters")
    for p in pages[:5]:
        say(f"    page {p['id']} [{p['severity']}] {p['summary'][:90]}")
    harmful = [k for k, y in labels.items() if y == 1 and k in tiers]
    benign = [k for k, y in labels.items() if y == 0 and k in tiers]
    if harmful and benign:
        say(f"  labelled AgentDojo steps: {len(harmful)} harmful, {len(benign)} benign")
        for k in (1, 2, 3):
            rec = sum(tiers[x] >= k for x in harmful) / len(harmful)
            fpr = sum(tiers[x] >= k for x in benign) / len(benign)
            say(f"    reaching L{k}: recall {rec:.0%} of harmful, {fpr:.0%} of benign")


def _recall_summary(say: Any, metrics: Any) -> None:
    """Recall per tier by source of ground truth, as the recall stage counted it."""
    from dashboards.ground_truth import reached_counts
    from vigil.metrics import wilson_interval

    counts = reached_counts(metrics)
    if not counts:
        return
    say("  recall by source of ground truth (harmful steps reaching each tier, 95 % Wilson):")
    for origin, row in sorted(counts.items()):
        cells = []
        for k in (1, 2, 3):
            ci = wilson_interval(row[k], row[0])
            cells.append(f"L{k} {row[k]}/{row[0]}"
                         + (f" [{ci[0]:.0%}, {ci[1]:.0%}]" if ci else ""))
        say(f"    {origin:<8} " + ", ".join(cells))
