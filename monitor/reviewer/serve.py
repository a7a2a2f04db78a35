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

One request is computed at a time (the model is shared). Run it with
:func:`serve_openai` (blocking, uvicorn) or mount :func:`create_app` in tests.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from monitor.reviewer.engine import NextTokenEngine, load_reviewer_model
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


def _openai_error(status: int, message: str) -> HTTPException:
    return HTTPException(status, detail={"error": {"message": message, "type": "invalid_request"}})


class CompletionService:
    """Greedy completions with top-k log-probabilities over one local model."""

    def __init__(self, lm: LanguageModel, model_name: str | None = None) -> None:
        self.lm = lm
        self.engine = NextTokenEngine(lm, batch_size=16)
        self.model_name = model_name or lm.model_id
        self._lock = threading.Lock()
        self.created = int(time.time())

    def _token(self, tid: int) -> str:
        return str(self.lm.tokenizer.decode([tid]))

    def complete(self, req: CompletionRequest) -> dict[str, Any]:
        import torch

        if req.n != 1 or req.echo or req.stream:
            raise _openai_error(400, "this server supports n=1 without echo or stream only")
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if not prompts or any(not p for p in prompts):
            raise _openai_error(400, "prompt must be a non-empty string or list of strings")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        k = req.logprobs or 0
        eos = self.lm.tokenizer.eos_token_id
        with self._lock:
            first = self.engine.next_token_logprobs(prompts) if req.max_tokens else None
            choices = []
            prompt_tokens = completion_tokens = 0
            for i, p in enumerate(prompts):
                ids = self.engine.encode(p)
                prompt_tokens += len(ids)
                toks: list[int] = []
                steps: list[Any] = []  # log-softmax rows, one per generated token
                if first is not None:
                    row = first[i]
                    toks.append(int(row.argmax()))
                    steps.append(row)
                    if req.max_tokens > 1 and toks[0] != eos:
                        with torch.inference_mode():
                            out = self.lm.model.generate(
                                torch.tensor([ids + toks]),
                                attention_mask=torch.ones(1, len(ids) + 1, dtype=torch.long),
                                max_new_tokens=req.max_tokens - 1,
                                do_sample=False,
                                output_scores=True,
                                return_dict_in_generate=True,
                                pad_token_id=self.lm.tokenizer.pad_token_id,
                            )
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


def create_app(lm: LanguageModel, *, model_name: str | None = None) -> FastAPI:
    """The FastAPI app serving ``lm`` under ``/v1`` (``model_name``: the id it reports)."""
    service = CompletionService(lm, model_name)
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.get("/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model",
                                            "created": service.created, "owned_by": "vigil"}]}

    @router.post("/completions")
    def completions(req: CompletionRequest) -> dict[str, Any]:
        if req.model is not None and req.model != service.model_name:
            raise _openai_error(404, f"model {req.model!r} is not served here "
                                     f"(this server serves {service.model_name!r})")
        return service.complete(req)

    app = FastAPI(title="vigil reviewer model server", version="1")
    app.include_router(router)
    app.state.service = service
    return app


def serve_openai(
    model_path: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    model_name: str | None = None,
    threads: int | None = None,
) -> None:
    """Serve a local HF model (default Gemma-3-270M) as an OpenAI-compatible API; blocks."""
    import uvicorn

    lm = load_reviewer_model(model_path, threads=threads)
    uvicorn.run(create_app(lm, model_name=model_name), host=host, port=port, log_level="info")
