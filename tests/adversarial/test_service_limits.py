"""The paging service against a hostile caller, over real HTTP (uvicorn on loopback, SQLite and
PostgreSQL): an oversized ``POST /v1/screen`` body is refused with 413 before it is read, a
maximal allowed one does not hold up a small one beyond its own cost, ``GET /metrics`` (it
counts verdicts) never answers a producer or an anonymous caller, and a 405 names every method
the path takes."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from monitor.pipeline import Screener, load_screener
from monitor.service.app import create_app
from tests.service.conftest import (  # noqa: F401 - fixtures
    Service,
    database_url,
    pg_database,
    service,
)
from tests.service.helpers import trigger, wait_for

MiB = 1024 * 1024


def serve(app: FastAPI) -> Iterator[str]:
    """``app`` under uvicorn on a loopback port of its own; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=20)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


@pytest.fixture(scope="module")
def screener(tiny_policy: Path) -> Screener:
    return load_screener(tiny_policy, reviewer=False)


@pytest.fixture
def app(service: Service, screener: Screener) -> FastAPI:  # noqa: F811
    """The service as shipped (default settings), screening with the real tiny models."""
    return create_app(service.settings(), console=io.StringIO(), screener=screener)


@pytest.fixture
def url(app: FastAPI) -> Iterator[str]:
    yield from serve(app)


def raw_request(url: str, head: str, body_parts: Iterable[bytes] = ()) -> tuple[int, str]:
    """Send ``head`` (request line and headers) and ``body_parts`` over a plain socket, then
    read the answer: (status, body). Sending stops early once the server has answered."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head.encode())
        try:
            for part in body_parts:
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before all of it was sent
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected(data):
            got = s.recv(65536)
            if not got:
                break
            data += got
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1].decode(errors="replace")


def _expected(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(data)


def test_an_oversized_screen_body_is_refused_before_it_is_read(
    url: str, app: FastAPI, service: Service  # noqa: F811
) -> None:
    limit = app.state.settings.screen_max_body_bytes
    assert limit == 2 * MiB  # the shipped default
    auth = f"Authorization: Bearer {service.tokens['producer']}\r\n"
    # declared too large: answered from the headers alone, no body ever sent
    t0 = time.monotonic()
    status, body = raw_request(url, f"POST /v1/screen HTTP/1.1\r\nHost: x\r\n{auth}"
                                    f"Content-Type: application/json\r\n"
                                    f"Content-Length: {limit + 1}\r\n\r\n")
    assert status == 413 and time.monotonic() - t0 < 5
    assert json.loads(body)["detail"] == (
        f"request body over the limit of {limit} bytes for POST /v1/screen (the service's "
        "VIGIL_PAGING_SCREEN_MAX_BODY_BYTES)")

    # chunked, no length given: counted as it streams, refused once past the limit
    piece = b"[" + b" " * (64 * 1024 - 2) + b"]"
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    status, body = raw_request(url, f"POST /v1/screen HTTP/1.1\r\nHost: x\r\n{auth}"
                                    "Content-Type: application/json\r\n"
                                    "Transfer-Encoding: chunked\r\n\r\n",
                               iter([chunk] * (limit // len(piece) + 2)))
    assert status == 413 and "VIGIL_PAGING_SCREEN_MAX_BODY_BYTES" in body

    # the tighter limit is the screen's own: another route still takes a body that size
    r = httpx.post(f"{url}/api/v1/events", content=b"{" + b" " * (limit + 10) + b"}",
                   headers={"Authorization": f"Bearer {service.tokens['producer']}",
                            "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 422, r.text


def proposal(tid: str, step_chars: int = 0, n_steps: int = 4) -> dict[str, Any]:
    """A screening request; with ``step_chars``, each step carries that many characters of
    distinct log lines in its observation and result (no text repeats, so no cache helps)."""
    steps = []
    for i in range(n_steps if step_chars else 1):
        def text(part: str, i: int = i) -> str:
            line = f"{tid} step {i} {part}: GET /index.html?page={{}} 200 0.003s\n"
            return "".join(line.format(k) for k in range(max(1, step_chars // len(line))))
        steps.append({"step_id": f"s{i}", "index": i,
                      "observation": {"text": text("read") if step_chars else "balance: 10"},
                      "action": {"text": f"read_file('log-{i}.txt')"},
                      "result": {"text": text("got") if step_chars else "ok"}})
    return {"trajectory": {"trajectory_id": tid, "task": "Pay the rent for this month.",
                           "steps": steps},
            "action": {"text": "send_money(recipient='GB29NWBK60161331926819', amount=1100)"}}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # screening keeps no state
def test_a_maximal_request_holds_up_a_small_one_no_longer_than_its_own_cost(
    url: str, app: FastAPI, service: Service  # noqa: F811
) -> None:
    """A request just under the body limit costs a bounded time (the models read a bounded
    head of each text). A small request sent while one runs and another waits answers once
    the running one ends: it does not wait behind the queued one."""
    headers = {"Authorization": f"Bearer {service.tokens['producer']}"}
    limit = app.state.settings.screen_max_body_bytes
    queue = app.state.screen

    def maximal(tid: str) -> bytes:
        """The largest body under the limit: 4 steps of text, each near an eighth of it."""
        step_chars = limit // 8
        while len(body := json.dumps(proposal(tid, step_chars)).encode()) > limit:
            step_chars -= 2048
        assert limit - 32 * 1024 < len(body) <= limit, len(body)
        return body

    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        def post(body: bytes | dict[str, Any]) -> tuple[float, float, httpx.Response]:
            """(seconds it took, when it ended, the answer)"""
            t0 = time.monotonic()
            r = (c.post("/v1/screen", json=body) if isinstance(body, dict)
                 else c.post("/v1/screen", content=body,
                             headers={"Content-Type": "application/json"}))
            return time.monotonic() - t0, time.monotonic(), r

        assert post(proposal("warm-up"))[2].status_code == 200  # models load on first use
        run = uuid.uuid4().hex[:8]  # texts no earlier run has put in the encoder's cache
        small_alone, _, r = post(proposal(f"small-0-{run}"))
        assert r.status_code == 200, r.text

        answers: list[tuple[float, float, httpx.Response]] = []
        bodies = [maximal(f"max-{i}-{run}") for i in (1, 2)]
        before = queue.batches
        threads = [threading.Thread(target=lambda b=b: answers.append(post(b))) for b in bodies]
        threads[0].start()
        wait_for(lambda: queue.batches > before, timeout=10, every=0.005)  # it runs
        for t in threads[1:]:
            t.start()
        wait_for(lambda: queue.waiting == 1, timeout=10, every=0.005)  # it waits
        took, ended, small = post(proposal(f"small-1-{run}"))
        for t in threads:
            t.join()
    assert small.status_code == 200, small.text
    assert [r.status_code for _, _, r in answers] == [200, 200]
    maximal_alone = min(t for t, _, _ in answers)  # the first ran alone, from its arrival
    print(f"maximal {maximal_alone:.2f} s, small {small_alone:.3f} s, "
          f"small behind a running maximal and a waiting one {took:.2f} s")
    # a loose bound that still holds on a loaded CI machine (20 s seen there, under 10 s on a
    # quiet one); the cost itself is measured in bench/, and the test's point is the next two
    assert maximal_alone < 60, f"a maximal request took {maximal_alone:.1f} s alone"
    # the rest of the run in flight and its own, with slack for a busy machine; waiting for
    # the queued maximal request too would take two maximal runs
    assert took < 1.5 * maximal_alone + 2 * small_alone + 1.0, (took, maximal_alone, small_alone)
    assert max(e for _, e, _ in answers) > ended  # before the queued maximal one


def test_metrics_answer_a_scraper_but_never_a_producer_or_anyone(
    service: Service,  # noqa: F811
) -> None:
    for url in serve(create_app(service.settings(metrics_token="scrape-me"),
                                console=io.StringIO())):
        with httpx.Client(base_url=url, timeout=10) as c:
            assert c.post("/api/v1/events", json=trigger("traj-m", 0),
                          headers=service.auth("producer")).status_code == 202
            r = c.get("/metrics")
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            r = c.get("/metrics", headers=service.auth("producer"))
            assert r.status_code == 403 and "vigil_page_verdicts" not in r.text
            for headers in ({"Authorization": "Bearer scrape-me"}, service.auth("reviewer"),
                            service.auth("admin")):
                r = c.get("/metrics", headers=headers)
                assert r.status_code == 200 and 'vigil_page_verdicts_total{verdict="harmful"}' \
                    in r.text
                assert "vigil_pages_opened_total 1.0" in r.text


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PATCH", "/api/v1/policies/default", "GET, PUT, DELETE"),
    ("DELETE", "/api/v1/tokens", "GET, POST"),
    ("PUT", "/api/v1/silences", "GET, POST"),
    ("GET", "/v1/screen", "POST"),
    ("POST", "/metrics", "GET"),
    ("PUT", "/login", "GET, POST"),
])
def test_a_405_names_every_method_the_path_takes(
    url: str, service: Service, method: str, path: str, allow: str  # noqa: F811
) -> None:
    r = httpx.request(method, url + path, headers=service.auth("admin"), timeout=10)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    for m in allow.split(", "):  # and each of them is indeed taken (not a 405)
        assert httpx.request(m, url + path, headers=service.auth("admin"), json={},
                             timeout=10).status_code != 405
