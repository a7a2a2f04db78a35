"""`monitor reviewer serve` bounded and authenticated, over the real Gemma-3-270M in uvicorn:
a bearer token when one is set (and required beyond loopback), 413 before an oversized body
is read, 400 for too many tokens or invalid text, 504 past the time limit, 429 when the queue
is full and 503 when a wait runs too long."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from monitor.reviewer.serve import check_exposure
from monitor.serve_limits import ServeLimits
from tests.reviewer.conftest import free_port
from vigil.lm import LanguageModel

TOKEN = "s3cret-token"


def _serve(lm: LanguageModel, **kw: Any) -> Iterator[tuple[str, Any]]:
    import uvicorn

    from monitor.reviewer.serve import create_app

    port = free_port()
    app = create_app(lm, model_name="m", **kw)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", app.state.service
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(gemma: LanguageModel) -> Iterator[tuple[str, Any]]:
    yield from _serve(gemma, token=TOKEN, limits=ServeLimits(
        max_body_bytes=4_000, max_prompt_tokens=200, max_request_tokens=300, max_prompts=4,
        request_timeout_s=3.0, max_queue=1, queue_timeout_s=30.0))


@pytest.fixture
def limited(server: tuple[str, Any]) -> str:
    return str(server[0])


def _post(url: str, body: bytes | dict[str, Any], token: str | None = TOKEN
          ) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}/completions", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _message(body: dict[str, Any]) -> str:
    detail = body["detail"]
    return str(detail["error"]["message"] if isinstance(detail, dict) else detail)


def test_a_token_is_required_when_set_and_beyond_loopback(limited: str) -> None:
    ok = {"prompt": "Hello", "max_tokens": 1}
    assert _post(limited, ok)[0] == 200
    for token in (None, "wrong", TOKEN + "x"):
        status, body = _post(limited, ok, token)
        assert status == 401 and "bearer token" in _message(body)
    with pytest.raises(ValueError, match="needs a bearer token"):
        check_exposure("0.0.0.0", None)
    assert check_exposure("0.0.0.0", TOKEN) is None
    assert "without a token" in (check_exposure("127.0.0.1", None) or "")


def test_each_limit_refuses_in_one_sentence_naming_its_flag(limited: str) -> None:
    status, body = _post(limited, {"prompt": "x" * 5_000, "max_tokens": 1})
    assert status == 413 and "--max-body-bytes" in _message(body)
    status, body = _post(limited, {"prompt": "word " * 250, "max_tokens": 1})
    assert status == 400 and "--max-prompt-tokens" in _message(body)
    status, body = _post(limited, {"prompt": ["word " * 150] * 3, "max_tokens": 1})
    assert status == 400 and "--max-request-tokens" in _message(body)
    status, body = _post(limited, {"prompt": ["hi"] * 5, "max_tokens": 1})
    assert status == 400 and "--max-prompts" in _message(body)
    # a lone surrogate, escaped and as raw bytes: 400, not a tokenizer crash
    for raw in (b'{"prompt": "hi \\ud800", "max_tokens": 1}',
                b'{"prompt": "hi \xed\xa0\x80", "max_tokens": 1}'):
        status, body = _post(limited, raw)
        assert status == 400 and "surrogate" in _message(body), body
    # generating far past the time limit: 504, not a cut-off answer passed off as whole
    status, body = _post(limited, {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 256})
    assert status == 504 and "--request-timeout" in _message(body), body


def test_a_full_queue_answers_429_a_long_wait_503_and_the_waiting_request_is_served(
    server: tuple[str, Any],
) -> None:
    from dataclasses import replace

    url, service = server
    small = {"prompt": "Hi", "max_tokens": 1}
    got: list[int] = []
    service._lock.acquire()  # a large request computing: the model is busy
    try:
        waiting = threading.Thread(target=lambda: got.append(_post(url, small)[0]))
        waiting.start()
        deadline = time.monotonic() + 30
        while service._waiting < 1:
            assert time.monotonic() < deadline, "the request never queued"
            time.sleep(0.01)
        status, body = _post(url, small)  # the queue (one) is full
        assert status == 429 and "--max-queue" in _message(body)
    finally:
        service._lock.release()
    waiting.join(60)
    assert got == [200]  # served once the model was free
    service.limits = replace(service.limits, queue_timeout_s=0.2)
    service._lock.acquire()
    try:
        status, body = _post(url, small)
        assert status == 503 and "--queue-timeout" in _message(body)
    finally:
        service._lock.release()
        service.limits = replace(service.limits, queue_timeout_s=30.0)
