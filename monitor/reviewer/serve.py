"""A small OpenAI-compatible server over a local Hugging Face causal LM.

For users without vLLM or SGLang, and for the tests: the reviewer's OpenAI
backend talks to it exactly as to those servers.

* ``GET /v1/models``: the one served model.
* ``POST /v1/completions``: ``prompt`` a string or a list of strings,
  ``max_tokens`` (default 16, at most 256), ``logprobs`` (top-k, 0..20),
  ``stop`` (a string or list), greedy decoding only (``temperature`` and
  ``top_p`` are accepted and ignored; ``n`` must be 1; ``echo``, ``stream`` and
  ``best_of`` are refused with 400). The first token of every prompt comes from
  one batched pass that shares the prompts' common prefix
  (:class:`~monitor.reviewer.engine.NextTokenEngine`); further tokens are greedy
  ``generate`` per prompt. ``usage`` counts prompt and completion tokens.

One request is computed at a time (the model is shared), so what one request may ask is
bounded (:class:`ServeLimits`, each a ``monitor reviewer serve`` flag): its body (413 before
it is read), its prompts' tokens and count (400), its computing time (504: its remaining
prompts are not computed) and the requests waiting for the model (429 with ``Retry-After``
when the queue is full, 503 when one waited too long), so a large request cannot starve
small ones. Text that is not valid Unicode (a lone surrogate) is a 400. With ``token``,
every request needs ``Authorization: Bearer <token>`` (401 otherwise);
``monitor reviewer serve`` requires one on any address but loopback. Run it with
:func:`serve_openai` (blocking, uvicorn) or mount :func:`create_app` in tests.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from monitor.reviewer.engine import NextTokenEngine, ReviewTimeout, load_reviewer_model
from monitor.serve_limits import ServeLimits
from vigil.asgi import BodyLimit
from vigil.lm import LanguageModel

MAX_TOKENS = 256


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=0, le=MAX_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=20)
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    echo: bool = False
    stream: bool = False


def _openai_error(status: int, message: str, kind: str = "invalid_request",
                  headers: dict[str, str] | None = None) -> HTTPException:
    return HTTPException(status, detail={"error": {"message": message, "type": kind}},
                         headers=headers)


def _invalid_text(texts: list[str]) -> int | None:
    """The index of the first of ``texts`` that UTF-8 cannot encode (a lone surrogate)."""
    for i, t in enumerate(texts):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            return i
    return None


class CompletionService:
    """Greedy completions with top-k log-probabilities over one local model, one request at
    a time, within :class:`ServeLimits`."""

    def __init__(self, lm: LanguageModel, model_name: str | None = None,
                 limits: ServeLimits | None = None) -> None:
        self.lm = lm
        self.engine = NextTokenEngine(lm, batch_size=16)
        self.model_name = model_name or lm.model_id
        self.limits = limits or ServeLimits()
        self.limits.check()
        self._lock = threading.Lock()  # the model: one request at a time
        self._state = threading.Lock()
        self._waiting = 0  # requests waiting for the model
        self.created = int(time.time())

    def serve(self, req: CompletionRequest) -> dict[str, Any]:
        """:meth:`complete` once the model is free: 429 when :attr:`limits`' queue is full,
        503 when the wait passes its timeout."""
        lim = self.limits
        with self._state:
            if self._waiting >= lim.max_queue:
                raise _openai_error(429, f"{self._waiting} requests are already waiting for "
                                    f"the model (the server's --max-queue); retry later",
                                    "rate_limit", {"Retry-After": "1"})
            self._waiting += 1
        try:
            got = self._lock.acquire(timeout=lim.queue_timeout_s)
        finally:
            with self._state:
                self._waiting -= 1
        if not got:
            raise _openai_error(503, f"the model stayed busy for {lim.queue_timeout_s:g} s "
                                "(the server's --queue-timeout); retry later", "overloaded",
                                {"Retry-After": "5"})
        try:
            return self.complete(req)
        finally:
            self._lock.release()

    def _token(self, tid: int) -> str:
        return str(self.lm.tokenizer.decode([tid]))

    def complete(self, req: CompletionRequest) -> dict[str, Any]:
        """The request's completions (the caller holds the model: :meth:`serve`)."""
        if req.n != 1 or req.echo or req.stream:
            raise _openai_error(400, "this server supports n=1 without echo or stream only")
        lim = self.limits
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts or any(not p for p in prompts):
            raise _openai_error(400, "prompt must be a non-empty string or list of strings")
        if len(prompts) > lim.max_prompts:
            raise _openai_error(400, f"{len(prompts)} prompts in one request, over the limit "
                                f"of {lim.max_prompts} (the server's --max-prompts)")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        bad = _invalid_text(prompts)
        if bad is not None or _invalid_text(stops) is not None:
            what = f"prompt {bad}" if bad is not None else "a stop string"
            raise _openai_error(400, f"{what} holds an unpaired UTF-16 surrogate: not valid "
                                "Unicode text")
        encoded = [self.engine.encode(p) for p in prompts]
        longest = max(len(ids) for ids in encoded)
        if longest > lim.max_prompt_tokens:
            raise _openai_error(400, f"a prompt of {longest} tokens, over the limit of "
                                f"{lim.max_prompt_tokens} (the server's --max-prompt-tokens)")
        total = sum(len(ids) for ids in encoded)
        if total > lim.max_request_tokens:
            raise _openai_error(400, f"{total} prompt tokens in one request, over the limit of "
                                f"{lim.max_request_tokens} (the server's --max-request-tokens)")
        deadline = time.monotonic() + lim.request_timeout_s
        try:
            return self._complete(req, prompts, encoded, stops, deadline)
        except ReviewTimeout:
            raise _openai_error(504, f"the request ran past {lim.request_timeout_s:g} s (the "
                                "server's --request-timeout); send fewer or shorter prompts",
                                "timeout") from None

    def _complete(self, req: CompletionRequest, prompts: list[str], encoded: list[list[int]],
                  stops: list[str], deadline: float) -> dict[str, Any]:
        import torch

        k = req.logprobs or 0
        eos = self.lm.tokenizer.eos_token_id
        # the model is this request's: serve() holds its lock
        first = (self.engine.next_token_logprobs(prompts, deadline=deadline)
                 if req.max_tokens else None)
        choices = []
        prompt_tokens = completion_tokens = 0
        for i, ids in enumerate(encoded):
            prompt_tokens += len(ids)
            toks: list[int] = []
            steps: list[Any] = []  # log-softmax rows, one per generated token
            if first is not None:
                row = first[i]
                toks.append(int(row.argmax()))
                steps.append(row)
                if req.max_tokens > 1 and toks[0] != eos:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ReviewTimeout("the request ran past its deadline")
                    with torch.inference_mode():
                        out = self.lm.model.generate(
                            torch.tensor([ids + toks]),
                            attention_mask=torch.ones(1, len(ids) + 1, dtype=torch.long),
                            max_new_tokens=req.max_tokens - 1,
                            max_time=left,
                            do_sample=False,
                            output_scores=True,
                            return_dict_in_generate=True,
                            pad_token_id=self.lm.tokenizer.pad_token_id,
                        )
                    if time.monotonic() > deadline:  # max_time ended it: not a whole answer
                        raise ReviewTimeout("the request ran past its deadline")
                    for score in out.scores:
                        lp = torch.log_softmax(score[0].float(), dim=-1)
                        toks.append(int(lp.argmax()))
                        steps.append(lp)
                        if toks[-1] == eos:
                            break
            text, finish = "", "length"
            kept = 0
            for tid in toks:
                if tid == eos:
                    finish = "stop"
                    break
                text += self._token(tid)
                kept += 1
                hit = next((s for s in stops if s and s in text), None)
                if hit is not None:
                    text, finish = text[: text.index(hit)], "stop"
                    break
            completion_tokens += len(toks)
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish,
                                      "logprobs": None}
            if req.logprobs is not None:
                tokens, token_lps, tops = [], [], []
                for tid, lp in zip(toks[: max(kept, 1)], steps, strict=False):
                    tokens.append(self._token(tid))
                    token_lps.append(float(lp[tid]))
                    if k:
                        vals, idx = torch.topk(lp, k)
                        top: dict[str, float] = {}
                        for v, t in zip(vals.tolist(), idx.tolist(), strict=True):
                            top.setdefault(self._token(int(t)), float(v))
                        tops.append(top)
                    else:
                        tops.append({})
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": token_lps,
                                      "top_logprobs": tops, "text_offset": []}
            choices.append(choice)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


def create_app(lm: LanguageModel, *, model_name: str | None = None, token: str | None = None,
               limits: ServeLimits | None = None) -> FastAPI:
    """The FastAPI app serving ``lm`` under ``/v1`` (``model_name``: the id it reports);
    ``token``: every request must carry it as a bearer token; ``limits``: what one request
    may ask (:class:`ServeLimits`)."""
    limits = limits or ServeLimits()
    service = CompletionService(lm, model_name, limits)

    def authorised(request: Request) -> None:
        if token is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, presented = got.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                presented.strip().encode("utf-8", "surrogatepass"), token.encode()):
            raise _openai_error(401, "missing or wrong bearer token (Authorization: Bearer "
                                "<the server's --token>)", "authentication",
                                {"WWW-Authenticate": "Bearer"})

    router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[Depends(authorised)])

    @router.get("/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model",
                                            "created": service.created, "owned_by": "vigil"}]}

    @router.post("/completions")
    def completions(req: CompletionRequest) -> dict[str, Any]:
        if req.model is not None and req.model != service.model_name:
            raise _openai_error(404, f"model {req.model!r} is not served here "
                                     f"(this server serves {service.model_name!r})")
        return service.serve(req)

    app = FastAPI(title="vigil reviewer model server", version="1")
    app.include_router(router)
    app.add_middleware(BodyLimit, max_body_bytes=limits.max_body_bytes,
                       setting="--max-body-bytes")
    app.state.service = service
    return app


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def check_exposure(host: str, token: str | None) -> str | None:
    """Refuse (ValueError, one sentence) to serve on ``host`` beyond loopback without a
    token; the sentence to print when serving on loopback without one, else None."""
    if token:
        return None
    if host not in LOOPBACK and not host.startswith("127."):
        raise ValueError(f"serving on {host} needs a bearer token: pass --token (or set "
                         "$VIGIL_REVIEWER_TOKEN); without one only loopback is served")
    return (f"serving on {host} without a token: any process on this machine can use the "
            "model (pass --token to require one)")


def serve_openai(
    model_path: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    model_name: str | None = None,
    threads: int | None = None,
    token: str | None = None,
    limits: ServeLimits | None = None,
) -> None:
    """Serve a local HF model (default Gemma-3-270M) as an OpenAI-compatible API; blocks."""
    import sys

    import uvicorn

    note = check_exposure(host, token)
    if note:
        print(note, file=sys.stderr)
    lm = load_reviewer_model(model_path, threads=threads)
    uvicorn.run(create_app(lm, model_name=model_name, token=token, limits=limits), host=host,
                port=port, log_level="info")
