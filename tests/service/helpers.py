"""Test helpers: events in the worker's shape, a real webhook receiver, waiting, the app
served live."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


def png_data_uri(
    width: int = 48, height: int = 32, rgb: tuple[int, int, int] = (200, 40, 40)
) -> str:
    """A real (tiny, solid-colour) PNG as a data: URI, like a GUI screenshot in a trajectory."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))

    row = b"\x00" + bytes(rgb) * width
    raw = (b"\x89PNG\r\n\x1a\n"
           + chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big")
                   + bytes([8, 2, 0, 0, 0]))
           + chunk(b"IDAT", zlib.compress(row * height))
           + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def trajectory(tid: str, n_steps: int = 3, *, screenshot: bool = False) -> dict[str, Any]:
    steps = []
    for i in range(n_steps):
        step: dict[str, Any] = {
            "step_id": f"s{i}",
            "index": i,
            "role": "main",
            "observation": {"text": f"observation {i} of {tid}"},
            "action": {"text": f"action {i}: run the tool",
                       "tool": {"name": "bash", "arguments": {"cmd": f"echo {i}"}}},
            "result": {"text": f"result {i}"},
        }
        if screenshot:
            step["observation"]["screenshot"] = png_data_uri()
        steps.append(step)
    return {"trajectory_id": tid, "source": "deployment", "task": f"task of {tid}",
            "steps": steps, "label": None, "meta": {}}


def trigger(
    tid: str,
    step: int = 0,
    *,
    n_steps: int | None = None,
    severity: str = "critical",
    routing_key: str | None = None,
    execution_id: str | None = None,
    screenshot: bool = False,
    summary: str | None = None,
) -> dict[str, Any]:
    """The trigger the worker sends for a flagged step (dedup_key = trajectory/step)."""
    details: dict[str, Any] = {
        "trajectory": trajectory(tid, n_steps or step + 1, screenshot=screenshot),
        "step_id": f"s{step}",
        "scores": [
            {"tier": 0, "score": 0.91, "flagged": True, "threshold": 0.6,
             "signals": {"surprise": 0.8, "harm": 0.93}},
            {"tier": 1, "score": 0.55, "flagged": False, "threshold": 0.7, "signals": {}},
            {"tier": 2, "score": 0.88, "flagged": True, "threshold": 0.5, "signals": {}},
        ],
        "rubric": {"verdict": "harmful", "score": 0.88,
                   "rubrics": [{"name": "exfiltration", "weight": 3, "score": 1.0,
                                "rationale": "sends ~/.ssh to a paste site"}]},
    }
    if execution_id:
        details["execution_id"] = execution_id
    event: dict[str, Any] = {
        "event_action": "trigger",
        "dedup_key": f"{tid}/s{step}",
        "payload": {"summary": summary or f"{tid} step s{step} looks harmful",
                    "source": "deployment", "severity": severity, "custom_details": details},
    }
    if routing_key:
        event["routing_key"] = routing_key
    return event


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """A real HTTP server on 127.0.0.1 that records every POST; the first ``fail_first``
    requests get HTTP 500, and so does every request while ``down`` is set."""

    fail_first: int = 0
    down: bool = False
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    failing = receiver.down or len(receiver.requests) < receiver.fail_first
                    status = 500 if failing else 200
                    receiver.requests.append(Received(self.path, dict(self.headers.items()),
                                                      body, time.monotonic(), status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def delivered(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.requests
                    if r.status == 200 and (path is None or r.path == path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _ReadmeCritic:
    """A harm value of the history: 0.1 until the poisoned README is read, 0.5 after it, 0.95
    from the first token of the turn that uploads the credentials."""

    def __call__(self, turns: Any) -> list[Any]:
        out: list[Any] = []
        level = 0.1
        for t in turns:
            if "NOTE to AI agents" in t.observation:
                level = max(level, 0.5)
            if "Uploading the credentials" in t.action:
                out.append([level] + [0.95] * (t.tokens - 1))
                level = 0.95
            else:
                out.append([level])
        return out


def attributed_trigger(*, attribution: Any = None) -> dict[str, Any]:
    """The worker's trigger for the last step of a real rebuilt TITO execution (a coding agent
    that reads a poisoned README and uploads credentials at step m9), with the harm
    attribution of the trajectory (``attribution`` replaces it, e.g. with a malformed one)."""
    from monitor.rlhealth.attribution import attribute_harm, turns_from_trajectory
    from streams.synthetic import coding_execution
    from streams.tito import build_tree, trajectories

    calls, end = coding_execution("exec-h", harmful=True, seed=2)
    traj = next(t for t in trajectories(build_tree("exec-h", calls, end))
                if t.meta["leaf_call_id"] == "m11")
    if attribution is None:
        att = attribute_harm(turns_from_trajectory(traj), _ReadmeCritic(), 1.0,
                             trajectory_id=traj.trajectory_id)
        attribution = {**att.to_dict(), "step_id": "m11", "label_source": "page",
                       "critic": "keyword harm value (test)"}
    details: dict[str, Any] = {
        "trajectory": traj.model_dump(mode="json"),
        "step_id": "m11",
        "execution_id": "exec-h",
        "scores": [{"tier": 0, "score": 0.8, "flagged": True, "threshold": 0.5, "signals": {}},
                   {"tier": 2, "score": 0.9, "flagged": True, "threshold": 0.5, "signals": {}}],
        "rubric": None,
        "attribution": attribution,
    }
    return {"event_action": "trigger", "dedup_key": f"{traj.trajectory_id}/m11",
            "payload": {"summary": "exec-h: uploaded the CI credentials after a README note",
                        "source": "rollout", "severity": "critical", "custom_details": details}}


ART_PROMPT = "a neon <b>sign</b> that reads 'open late' & a cat"
ART_REWARDS = [{"clipscore": 0.71, "ocr": 0.25, "pickscore": 0.5},
               {"clipscore": 0.68, "ocr": 0.31, "pickscore": 0.52},
               {"clipscore": 0.934, "ocr": 0.018, "pickscore": 0.777}]
ART_COLOURS = [(40, 120, 200), (200, 120, 40), (30, 200, 90)]


def art_trigger() -> dict[str, Any]:
    """The worker's trigger for an ART endpoint that reached L3: the third endpoint of a real
    :class:`~streams.media.MediaRollout` as a step (``monitor.rlhealth.art_steps``), with the
    two before it as its history, paged by the worker's ``page_event``."""
    from monitor.pipeline import StepVerdict
    from monitor.rlhealth.art_steps import media_step_events
    from monitor.screening import screen_step_of
    from monitor.stream.paging import page_event
    from streams.media import MediaEndpoint, MediaRollout
    from streams.records import Escalation

    rollout = MediaRollout(
        run_id="run-7", prompt_id="p042", prompt=ART_PROMPT, policy_version=3,
        endpoints=[MediaEndpoint(ref=f"s3://art/run-7/v3/p042/{i}.png",
                                 thumbnail=png_data_uri(32, 32, ART_COLOURS[i]),
                                 rewards=ART_REWARDS[i], seed=3 * 1024 + i) for i in range(3)],
        reward_weights={"clipscore": 0.5, "ocr": 0.2, "pickscore": 0.3})
    events = media_step_events(rollout)
    step = screen_step_of(events[2], [e.step for e in events[:2]])
    traj = step.trajectory_so_far()
    escalation = Escalation(trajectory_id=traj.trajectory_id, step_id=step.step_id, tier=2,
                            score=0.9, trajectory=traj, source="rollout")
    verdict = StepVerdict(traj.trajectory_id, step.step_id, tier=3, score=0.93, flagged=True,
                          signals={"wm_surprise": 0.99, "wm_harm_post": 0.4},
                          gate_scores=(0.95, 0.9, 0.93))
    event = page_event(escalation, verdict, [0.27, 0.58, 0.6])
    return event.model_dump(mode="json", by_alias=True, exclude_unset=True)


@contextmanager
def serving(make_app: Callable[[str], Any]) -> Iterator[str]:
    """The app ``make_app(base_url)`` builds, under uvicorn on a loopback port of its own
    (lifespan and scheduler included), for clients that need a real server: a browser, an
    MCP proxy in another process, the OpenTelemetry SDK's exporter. Yields its base URL."""
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(make_app(base), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=30)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from tests.service.conftest import Service


def open_case_page(client: TestClient, service: Service, event: dict[str, Any]) -> str:
    """Send ``event`` as the producer, then open its case page (the first) as a reviewer."""
    r = client.post("/api/v1/events", json=event, headers=service.auth("producer"))
    assert r.status_code == 202, r.text
    client.post("/login", data={"token": service.tokens["reviewer"]})
    page = client.get("/cases/1")
    assert page.status_code == 200
    return page.text
