"""The world model's vision tower on its own: images → unit vectors in its latent space.

    embedder = ImageEmbedder.load(vigil.paths.worldmodel_bundle())
    z = embedder.embed(["data:image/png;base64,...", "out/0001.png"])   # (2, latent_dim)

Only what it needs is read from the bundle: ``config.json`` for the model config and, of
``model.safetensors``, the tower's own tensors (the EMA target's by default: the encoder the
world model measures surprise in). Images are decoded and scaled exactly as in training and
scoring (:func:`worldmodel.features.load_image` at the config's ``image_size``, then
:func:`worldmodel.features.pixels`). Distances between the vectors say how alike two images
look to the monitor: the mean pairwise distance of one prompt's K endpoints falls as a
policy collapses onto one image.

Two readings of the tower (``pool``):

- ``"patches"`` (default): the mean of its patch tokens, projected into the latent space as
  the tower projects its pooled output. It follows how much a set of images varies: on
  32×32 patterns drawn with a spread shrinking 0.12 → 0.0075, the mean pairwise distance
  falls at every step (about tenfold in all);
- ``"cls"``: the pooled output itself, the vector the world model adds to an observation's
  latent. The shipped tower, trained on web-page screenshots, reads mostly brightness
  there: it tells images apart, but its distances do not follow a set's spread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from worldmodel.features import load_image, pixels
from worldmodel.model import JEPAConfig, build_vision
from worldmodel.score import WEIGHTS_FILE

Tower = Literal["target", "context"]
Pool = Literal["patches", "cls"]


class ImageEmbedder:
    """A world-model bundle's vision tower (``encoder.vision``), batched, on the CPU."""

    def __init__(self, vision: nn.Module, config: JEPAConfig, *, pool: Pool = "patches",
                 batch_size: int = 64, image_base: Path | None = None) -> None:
        if pool == "patches" and not hasattr(vision, "output_tokens"):
            raise ValueError(
                f"pool='patches' reads the patch tokens of a vision transformer, and this "
                f"tower ({type(vision).__name__}) gives none: use pool='cls'"
            )
        self.vision = vision.eval()
        self.config = config
        self.pool = pool
        self.batch_size = batch_size
        self.image_base = image_base  # where relative image paths are read from

    @property
    def dim(self) -> int:
        return self.config.latent_dim

    @classmethod
    def load(cls, path: str | Path, *, tower: Tower = "target", pool: Pool = "patches",
             batch_size: int = 64, image_base: Path | None = None) -> ImageEmbedder:
        """The vision tower of the bundle at ``path``; ``tower``: the EMA target encoder
        (default) or the online context encoder; ``pool``: see the module docstring."""
        path = Path(path).expanduser()
        missing = [f for f in ("config.json", WEIGHTS_FILE) if not (path / f).exists()]
        if missing:
            raise FileNotFoundError(
                f"{path}: not a world-model bundle (missing {', '.join(missing)}); "
                "train one with `monitor worldmodel train`"
            )
        config = JEPAConfig.from_dict(json.loads((path / "config.json").read_text())["model"])
        if not config.use_images:
            raise ValueError(
                f"{path}: this world model has no vision tower (trained with use_images "
                "false, on text only), so it cannot embed images; use a bundle trained "
                "with screenshots, such as the shipped one"
            )
        prefix = f"{tower}.vision."
        with safe_open(str(path / WEIGHTS_FILE), framework="pt", device="cpu") as f:
            names = [k for k in f.keys() if k.startswith(prefix)]  # noqa: SIM118 - not a dict
            state = {k[len(prefix):]: f.get_tensor(k) for k in names}
        if not state:
            raise ValueError(f"{path / WEIGHTS_FILE}: holds no {prefix}* weights")
        vision = build_vision(config)
        vision.load_state_dict(state, strict=True)
        return cls(vision, config, pool=pool, batch_size=batch_size, image_base=image_base)

    def embed(self, refs: Sequence[str]) -> np.ndarray:
        """(N, latent_dim) float32, each row of unit length: one per image (a path, relative
        to ``image_base``, or a ``data:`` URI)."""
        out = np.zeros((len(refs), self.dim), dtype=np.float32)
        size = self.config.image_size
        with torch.no_grad():
            for start in range(0, len(refs), self.batch_size):
                part = refs[start : start + self.batch_size]
                images = np.stack([load_image(r, self.image_base, size) for r in part])
                z = nn.functional.normalize(self._pooled(pixels(images)).float(), dim=-1)
                out[start : start + len(part)] = z.numpy()
        return out

    def _pooled(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool == "cls":
            return self.vision(x)  # type: ignore[no-any-return]  # nn.Module.__call__: Any
        v: Any = self.vision  # an open_clip VisionTransformer (checked in __init__)
        keep = v.output_tokens
        v.output_tokens = True
        try:
            _, tokens = v(x)
        finally:
            v.output_tokens = keep
        patches = tokens.mean(dim=1)
        return patches @ v.proj if v.proj is not None else patches
