"""Next-token log-probabilities from a local causal LM, with the common prefix computed once.

The reviewer asks a model one short question per rubric after the same long
step block, so the prompts of one step share a long token prefix.
:meth:`NextTokenEngine.next_token_logprobs` tokenises every prompt, runs the
longest common token prefix once (``use_cache``), repeats its key/value cache
over a batch of the remaining suffixes (right-padded, explicit positions), and
reads the hidden state at each suffix's last real token. Only those rows go
through the LM head (a 262k-token vocabulary for Gemma), so the cost is one
prefix plus the short suffixes. The result is the same as scoring each prompt
alone (``tests/reviewer/test_local.py`` checks it to 1e-3 nats).
:meth:`NextTokenEngine.next_token_logits` reads a few tokens' logits only (the judge's
two verdict tokens): the whole head, cast to float32 for every batch, took about 30 % of a
judge batch's time.

**Attention.** The engine runs the model with eager attention (a model loaded
otherwise is reloaded from its folder by :func:`load_reviewer_model`; switching a
loaded model with ``set_attn_implementation`` was measured not to take): with
transformers 5.24 on the CPU, Gemma 3's sliding-window layers under SDPA give
different log-probabilities once a sequence passes the 512-token window (0.43
nats off eager on a 1,956-token prompt; eager agrees with itself to 3e-5
whether the prompt runs whole or as a cached prefix plus a suffix). Below 512
tokens the two agree, so the probes' short inputs are unaffected.

Used by the local backend and by the OpenAI-compatible server (``serve.py``).
A deadline (``time.monotonic()`` value) is checked between batches; past it,
:class:`ReviewTimeout` is raised (a forward pass in progress is not interrupted).
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vigil.lm import LanguageModel, load_language_model

HEAD_ROWS = 32768  # vocabulary rows cast to float32 at a time (Gemma's head: 84 MB a chunk)


def _head_float32(head: Any, h: Any) -> Any:
    """The LM head's logits for hidden states ``h``, computed in float32 whatever the model's
    dtype: a bfloat16 head rounds logits of 16-32 to steps of 0.125, which moves a
    two-token verdict probability in ~3 % steps and makes two forward paths disagree."""
    import torch

    w = head.weight
    hf = h.float()
    if w.dtype == torch.float32:
        out = hf @ w.T
    else:
        out = torch.cat([hf @ w[i : i + HEAD_ROWS].float().T
                         for i in range(0, w.shape[0], HEAD_ROWS)], dim=1)
    bias = getattr(head, "bias", None)
    return out + bias.float() if bias is not None else out


def _capped(model: Any, logits: Any) -> Any:
    """The model's final logit soft-capping (Gemma's), where it has one."""
    import torch

    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def _next_logprobs(model: Any, h: Any) -> Any:
    """Next-token log-probabilities from last hidden states ``h``: the head in float32,
    then the model's final logit soft-capping (Gemma's), then log-softmax."""
    import torch

    return torch.log_softmax(_capped(model, _head_float32(model.lm_head, h)), dim=-1)


def _token_logits(model: Any, h: Any, tokens: Any) -> Any:
    """The soft-capped float32 logits of ``tokens`` only: their differences are the
    log-probabilities' differences, without the whole head (262k rows for Gemma)."""
    head = model.lm_head
    out = h.float() @ head.weight[tokens].float().T
    bias = getattr(head, "bias", None)
    return _capped(model, out + bias[tokens].float() if bias is not None else out)


class ReviewTimeout(TimeoutError):
    """The review did not finish before its deadline."""


def load_reviewer_model(
    path: str | Path | None = None, *, threads: int | None = None, dtype: str | None = "auto"
) -> LanguageModel:
    """A local HF causal LM loaded with eager attention (default: Gemma-3-270M).

    The same folders, provenance and offline rules as the probes' model
    (:func:`vigil.lm.load_language_model`; the default model is converted once on first
    use), with eager attention. ``dtype="auto"``: bfloat16 where the hardware multiplies it
    natively (1.9x faster reviews on a 2-core CPU with AMX, verdicts within about 0.02 of
    float32's), else float32; training loads float32 weights (and runs under autocast).
    """
    return load_language_model(path, threads=threads, dtype=dtype, attn_implementation="eager")


def is_eager(lm: LanguageModel) -> bool:
    return getattr(lm.model.config, "_attn_implementation", "eager") == "eager"


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs) - 1  # every prompt keeps at least one suffix token
    first = seqs[0]
    i = 0
    while i < n and all(s[i] == first[i] for s in seqs):
        i += 1
    return i


class NextTokenEngine:
    """Batched next-token log-probabilities over a loaded :class:`LanguageModel`.

    Thread-safe: one forward pass at a time (the model is shared).
    """

    def __init__(self, lm: LanguageModel, *, batch_size: int = 8) -> None:
        if not is_eager(lm):  # switching a loaded model's attention does not take (5.24)
            lm = load_reviewer_model(lm.path)
        self.lm = lm
        self.batch_size = batch_size
        self._lock = threading.Lock()
        params = inspect.signature(lm.model.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def model_id(self) -> str:
        return self.lm.model_id

    def encode(self, text: str) -> list[int]:
        return list(self.lm.tokenizer(text, add_special_tokens=True)["input_ids"])

    def token_ids(self, words: Sequence[str]) -> list[int]:
        """The single-token ids of ``words`` (words that are not one token are skipped)."""
        out = []
        for w in words:
            ids = self.lm.tokenizer.encode(w, add_special_tokens=False)
            if len(ids) == 1:
                out.append(int(ids[0]))
        return out

    def next_token_logprobs(
        self, prompts: Sequence[str], *, deadline: float | None = None
    ) -> Any:
        """``(len(prompts), vocab)`` float32 tensor: log p(next token | prompt)."""
        import torch

        if not prompts:
            return torch.empty(0, 0)
        seqs = [self.encode(p) for p in prompts]
        with self._lock, torch.inference_mode():
            return self._run(seqs, deadline)

    def next_token_logits(
        self, prompts: Sequence[str], tokens: Sequence[int], *, deadline: float | None = None
    ) -> Any:
        """``(len(prompts), len(tokens))`` float32 tensor: the next-token logits of
        ``tokens`` alone (soft-capped, unnormalised), so a softmax over them is the
        probabilities of ``tokens`` renormalised among themselves, as from
        :meth:`next_token_logprobs`, without the rest of the vocabulary's head."""
        import torch

        if not prompts:
            return torch.empty(0, len(tokens))
        seqs = [self.encode(p) for p in prompts]
        with self._lock, torch.inference_mode():
            return self._run(seqs, deadline, torch.tensor(list(tokens), dtype=torch.long))

    def _run(self, seqs: list[list[int]], deadline: float | None, tokens: Any = None) -> Any:
        import torch

        model = self.lm.model
        pad = self.lm.tokenizer.pad_token_id or 0
        n_pre = _common_prefix(seqs)
        prefix_cache = None
        if n_pre:
            from transformers import DynamicCache

            # full (non-sliding) layers: a sliding-window layer drops the oldest keys, which
            # the masks of a multi-token suffix after a long prefix still index
            prefix_cache = DynamicCache()
            model.model(
                input_ids=torch.tensor([seqs[0][:n_pre]]), use_cache=True,
                **{self._cache_kw: prefix_cache},
            )
        rows = []
        # batches of like lengths (less padding); the rows go back to the prompts' order
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        for start in range(0, len(seqs), self.batch_size):
            if deadline is not None and time.monotonic() > deadline:
                raise ReviewTimeout("the review ran past its deadline")
            chunk = [seqs[i][n_pre:] for i in order[start : start + self.batch_size]]
            b, width = len(chunk), max(len(c) for c in chunk)
            ids = torch.full((b, width), pad, dtype=torch.long)
            mask = torch.zeros((b, n_pre + width), dtype=torch.long)
            mask[:, :n_pre] = 1
            for i, c in enumerate(chunk):
                ids[i, : len(c)] = torch.tensor(c)
                mask[i, n_pre : n_pre + len(c)] = 1
            pos = (torch.arange(width) + n_pre).unsqueeze(0).expand(b, width)
            kwargs: dict[str, Any] = {}
            if prefix_cache is not None:
                cache = copy.deepcopy(prefix_cache)
                cache.batch_repeat_interleave(b)
                kwargs[self._cache_kw] = cache
            hidden = model.model(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs
            ).last_hidden_state
            last = torch.tensor([len(c) - 1 for c in chunk])
            h = hidden[torch.arange(b), last]
            rows.append(_next_logprobs(model, h) if tokens is None else
                        _token_logits(model, h, tokens))
        got = torch.cat(rows)
        out = torch.empty_like(got)
        out[torch.tensor(order)] = got
        return out

    def reference_logprobs(self, prompt: str) -> Any:
        """One prompt alone through the full model (no prefix sharing): for checks."""
        import torch

        with self._lock, torch.inference_mode():
            ids = torch.tensor([self.encode(prompt)])
            h = self.lm.model.model(input_ids=ids).last_hidden_state[:, -1]
            return _next_logprobs(self.lm.model, h)[0]
