"""An OpenAI-compatible embeddings endpoint as a probe model.

Chat endpoints return no hidden states, but OpenAI-compatible servers (vLLM,
SGLang, TEI, or :mod:`probes.serve`) answer ``POST {base_url}/embeddings``::

    {"model": NAME, "input": [text, ...]}  ->  {"data": [{"embedding": [...], "index": i}]}

:class:`EmbeddingEndpoint` renders each step with the bundle's template
(:meth:`probes.capture.Template.render_text`: the same text as for a local
model, cut in characters since the server's tokenizer is not at hand), sends
the steps in batches and returns one vector a step as pseudo-layer
``EMBEDDING_LAYER`` (0) with pooling ``EMBEDDING_POOLING`` (``"embedding"``):
whatever the server pools (vLLM: the last token for a causal LM, mean for an
encoder; :mod:`probes.serve`: the mean over tokens at its chosen layer).

Its model id is the served model name; its hash is that name plus the vector
width (:func:`probes.capture.identity_hash`), so a bundle refuses an endpoint
that serves something else under the same URL. Requests time out
(``timeout_s``), are retried with exponential backoff on connection errors,
timeouts, 429 and 5xx (``retries`` attempts in all), and carry
``Authorization: Bearer $VIGIL_PROBES_API_KEY`` where that variable is set
(``api_key_env`` names another). Nothing here downloads anything.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from probes.capture import ProbeStep, Template, identity_hash

ENDPOINT_ENV = "VIGIL_PROBES_ENDPOINT"
ENDPOINT_MODEL_ENV = "VIGIL_PROBES_ENDPOINT_MODEL"
API_KEY_ENV = "VIGIL_PROBES_API_KEY"
EMBEDDING_LAYER = 0
EMBEDDING_POOLING = "embedding"
RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class EndpointError(RuntimeError):
    """The embeddings endpoint could not be reached or answered something unusable."""


class EmbeddingEndpoint:
    """An ``/embeddings`` endpoint with the interface :func:`probes.capture.extract` reads."""

    def __init__(
        self,
        base_url: str,
        model_name: str,
        *,
        api_key_env: str = API_KEY_ENV,
        timeout_s: float = 60.0,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        import httpx

        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"embeddings endpoint {base_url!r} is not an http(s) URL")
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.retries = max(1, retries)
        self.backoff_s = backoff_s
        self.dims = 0
        key = os.environ.get(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    # --- what extract() and a bundle read -----------------------------------------------
    @property
    def model_id(self) -> str:
        return self.model_name

    @property
    def model_hash(self) -> str:
        if not self.dims:
            self.embed(["dimension probe"])
        return identity_hash(self.model_name, self.dims)

    @property
    def path(self) -> str:
        return self.base_url

    @property
    def cache_key(self) -> str:
        return self.model_hash

    @property
    def poolings(self) -> tuple[str, ...]:
        return (EMBEDDING_POOLING,)

    @property
    def available_layers(self) -> list[int]:
        return [EMBEDDING_LAYER]

    @property
    def num_layers(self) -> int:
        return 1

    @property
    def hidden_size(self) -> int:
        return self.dims

    @property
    def source(self) -> str:
        return "endpoint"

    def capture_batch(
        self, template: Template, steps: Sequence[ProbeStep], layers: Sequence[int]
    ) -> dict[tuple[int, str], np.ndarray]:
        if list(layers) != [EMBEDDING_LAYER]:
            raise ValueError(
                f"an embeddings endpoint gives one vector a step (layer {EMBEDDING_LAYER}), "
                f"not layers {list(layers)}"
            )
        X = self.embed([template.render_text(s) for s in steps])
        return {(EMBEDDING_LAYER, EMBEDDING_POOLING): X}

    # --- HTTP -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{self.base_url}/embeddings"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dims)`` float32 embeddings, in order."""
        import httpx

        if not texts:
            return np.empty((0, self.dims), dtype=np.float32)
        body = {"model": self.model_name, "input": list(texts)}
        last = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                r = self._client.post(self.url, json=body)
            except httpx.TransportError as e:  # refused, reset, timed out
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code in RETRY_STATUS:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:
                raise EndpointError(
                    f"embeddings endpoint {self.url} refused the request with HTTP "
                    f"{r.status_code}: {r.text[:300]}"
                )
            return self._parse(r.json(), len(texts))
        raise EndpointError(
            f"embeddings endpoint {self.url} failed after {self.retries} tries ({last})"
        )

    def _parse(self, payload: Any, n: int) -> np.ndarray:
        try:
            rows = sorted(payload["data"], key=lambda d: d["index"])
            X = np.asarray([d["embedding"] for d in rows], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as e:
            raise EndpointError(
                f"embeddings endpoint {self.url} answered no OpenAI embeddings list ({e!r})"
            ) from e
        if X.ndim != 2 or len(X) != n:
            raise EndpointError(
                f"embeddings endpoint {self.url} answered {len(X)} vectors for {n} inputs"
            )
        if self.dims and X.shape[1] != self.dims:
            raise EndpointError(
                f"embeddings endpoint {self.url} changed width from {self.dims} to {X.shape[1]}"
            )
        self.dims = int(X.shape[1])
        return X

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EmbeddingEndpoint:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddingEndpoint({self.base_url!r}, {self.model_name!r})"


def connect_endpoint(
    base_url: str | None = None,
    model: str | None = None,
    *,
    default_url: str | None = None,
    api_key_env: str = API_KEY_ENV,
    timeout_s: float = 60.0,
    retries: int = 4,
    backoff_s: float = 0.5,
    log: Any = None,
) -> EmbeddingEndpoint:
    """An endpoint from arguments, else ``$VIGIL_PROBES_ENDPOINT[_MODEL]``, probed once for width.

    ``base_url`` is what OpenAI clients call the base URL (e.g.
    ``http://127.0.0.1:8000/v1``); requests go to ``{base_url}/embeddings``.
    """
    url = base_url or os.environ.get(ENDPOINT_ENV) or default_url
    name = model or os.environ.get(ENDPOINT_MODEL_ENV)
    if not url:
        raise ValueError(f"no embeddings endpoint given (--endpoint URL or ${ENDPOINT_ENV})")
    if not name:
        raise ValueError(
            f"no model name for the embeddings endpoint {url} (--endpoint-model NAME or "
            f"${ENDPOINT_MODEL_ENV})"
        )
    ep = EmbeddingEndpoint(
        url,
        name,
        api_key_env=api_key_env,
        timeout_s=timeout_s,
        retries=retries,
        backoff_s=backoff_s,
    )
    ep.embed(["dimension probe"])
    (log or (lambda m: print(m, file=sys.stderr, flush=True)))(
        f"probes: embeddings endpoint {ep.url}, model {name}, {ep.dims} dims ({ep.model_hash})"
    )
    return ep
