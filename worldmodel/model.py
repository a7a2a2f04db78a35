"""The JEPA world model: (history, observation_t, action_t) → latent of observation_{t+1}.

Inputs arrive pre-encoded where encoding is frozen (text: 384-d MiniLM
vectors, cached) and raw where it is learned (screenshots: pixels through an
open_clip ViT that the JEPA objective trains). ``JEPA(config)`` owns its loss::

    model = JEPA(JEPAConfig())
    out = model(batch)            # out.loss, out.pred, out.harm_pre_logit, ...
    ema_update(model.target, model.context, momentum)

The target encoder is a stop-gradient EMA copy of the context encoder; a
VICReg-style variance/covariance term on the online embeddings keeps them
from collapsing. A harm head reads the *predicted* next latent (before the
action runs) and, with the same weights, the *observed* one (after).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from worldmodel.encoders import TEXT_DIM
from worldmodel.mil import harm_loss

GUI_KINDS = ("none", "click", "type", "key", "scroll", "drag", "other")
REL_DIM = 6  # worldmodel.features.relational


@dataclass
class JEPAConfig:
    latent_dim: int = 128
    hidden_dim: int = 256
    history: int = 4  # (observation, action) pairs of context before step t
    predictor_layers: int = 2
    predictor_heads: int = 4
    dropout: float = 0.1
    # screenshots: an open_clip ViT trained by the JEPA objective (or loaded, see vision_weights)
    use_images: bool = True
    image_size: int = 64
    vision_width: int = 128
    vision_layers: int = 3
    vision_patch: int = 8
    vision_arch: str | None = None  # an open_clip architecture name, e.g. "ViT-B-32"
    vision_weights: str | None = None  # a local checkpoint for vision_arch (frozen then)
    # objective
    ema_momentum: tuple[float, float] = (0.996, 1.0)
    rollout_weight: float = 0.5
    var_weight: float = 1.0
    cov_weight: float = 0.04
    harm_weight: float = 1.0
    harm_pos_weight: float = 1.0  # BCE weight of harmful rows (set from the class balance)
    relational: bool = True  # harm head also reads action/task/observation cosines
    harm_reads: str = "all"  # "all": task, z_t, a_t, z_next (+ rel); "next": z_next (+ rel)
    harm_latent_dropout: float = 0.0  # dropout on the latents the harm head reads
    # trajectory-labelled rows (Batch.bag >= 0): the bag's pooled harm meets its label (mil.py)
    mil_pool: str = "noisy_or"  # "noisy_or" | "max"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> JEPAConfig:
        d = dict(d)
        if "ema_momentum" in d:
            d["ema_momentum"] = tuple(d["ema_momentum"])  # type: ignore[arg-type]
        return cls(**d)  # type: ignore[arg-type]


@dataclass
class Batch:
    """Pre-encoded inputs. B = batch, H = history length (left-padded, masked).

    ``obs_*``/``act_*`` are stacked over time: index H is step t, 0..H-1 its
    history; ``next_*`` is observation t+1 and, where ``has_next2``, ``a1``/``next2``
    are action t+1 and observation t+2 (for the rollout term).
    """

    task: Tensor  # (B, 384)
    obs_text: Tensor  # (B, H+1, 384)
    obs_image: Tensor | None  # (B, H+1, 3, S, S) or None
    obs_has_image: Tensor  # (B, H+1)
    act_text: Tensor  # (B, H+1, 384)
    act_gui: Tensor  # (B, H+1, len(GUI_KINDS) + 2)
    mask: Tensor  # (B, H+1) bool, True = real step
    next_text: Tensor  # (B, 384)
    next_image: Tensor | None  # (B, 3, S, S)
    next_has_image: Tensor  # (B,)
    rel: Tensor | None = None  # (B, REL_DIM) relational features (features.relational)
    label: Tensor | None = None  # (B,) float
    # (B,) long: -1 = the row's own label; k >= 0 = a row of trajectory k, labelled as a whole
    # (``label`` is then the trajectory's, and the harm loss pools the bag: mil.harm_loss)
    bag: Tensor | None = None
    has_next2: Tensor | None = None  # (B,) bool
    a1_text: Tensor | None = None
    a1_gui: Tensor | None = None
    next2_text: Tensor | None = None
    next2_image: Tensor | None = None
    next2_has_image: Tensor | None = None
    dynamics_weight: Tensor | None = None  # (B,) 0 drops a row from the prediction loss

    def to(self, device: torch.device | str) -> Batch:
        kw = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**kw)


@dataclass
class Output:
    loss: Tensor
    pred: Tensor  # (B, D) predicted next latent
    target: Tensor  # (B, D) target-encoder latent of the observed next observation
    error: Tensor  # (B,) per-row prediction error (surprise before calibration)
    harm_pre_logit: Tensor  # (B,)
    harm_post_logit: Tensor  # (B,)
    parts: dict[str, float] = field(default_factory=dict)


def build_vision(config: JEPAConfig) -> nn.Module:
    """An open_clip ViT producing ``latent_dim`` vectors; tiny by default, trained here."""
    import open_clip
    from open_clip.model import CLIPVisionCfg, _build_vision_tower

    if config.vision_arch:
        model = open_clip.create_model(config.vision_arch, pretrained=config.vision_weights)
        visual = model.visual
        if config.vision_weights:
            for p in visual.parameters():
                p.requires_grad_(False)
        return nn.Sequential(visual, nn.LazyLinear(config.latent_dim))
    cfg = CLIPVisionCfg(
        layers=config.vision_layers,
        width=config.vision_width,
        head_width=32,
        patch_size=config.vision_patch,
        image_size=config.image_size,
    )
    return _build_vision_tower(config.latent_dim, cfg)


def mlp(inp: int, hidden: int, out: int, dropout: float = 0.0) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, out)
    )


class ObservationEncoder(nn.Module):
    """Observation → latent: text vector through an MLP, plus the screenshot when present."""

    def __init__(self, config: JEPAConfig) -> None:
        super().__init__()
        self.text = mlp(TEXT_DIM, config.hidden_dim, config.latent_dim)
        self.vision = build_vision(config) if config.use_images else None
        self.norm = nn.LayerNorm(config.latent_dim)

    def forward(self, text: Tensor, image: Tensor | None, has_image: Tensor) -> Tensor:
        z = self.text(text)
        if self.vision is not None and image is not None and bool(has_image.any()):
            flat = has_image.reshape(-1).bool()
            img_z = torch.zeros(flat.shape[0], z.shape[-1], device=z.device, dtype=z.dtype)
            img_z[flat] = self.vision(image.reshape(-1, *image.shape[-3:])[flat]).to(z.dtype)
            z = z + img_z.reshape(z.shape)
        return self.norm(z)


class Predictor(nn.Module):
    """A small transformer over [task, (z_0, a_0), ..., (z_t, a_t)] → ẑ_{t+1}."""

    def __init__(self, config: JEPAConfig) -> None:
        super().__init__()
        d = config.latent_dim
        steps = config.history + 2  # history + t + one rolled-out step
        self.pos = nn.Parameter(torch.zeros(1, 1 + 2 * steps, d))
        self.kind = nn.Parameter(torch.zeros(3, d))  # task / observation / action token
        layer = nn.TransformerEncoderLayer(
            d,
            config.predictor_heads,
            dim_feedforward=2 * d,
            dropout=config.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(
            layer, config.predictor_layers, enable_nested_tensor=False
        )
        self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d))
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.kind, std=0.02)

    def forward(self, task: Tensor, z: Tensor, a: Tensor, mask: Tensor) -> Tensor:
        b, t, d = z.shape
        seq = torch.stack([z + self.kind[1], a + self.kind[2]], dim=2).reshape(b, 2 * t, d)
        seq = torch.cat([task.unsqueeze(1) + self.kind[0], seq], dim=1)
        seq = seq + self.pos[:, : seq.shape[1]]
        pad = torch.cat(
            [
                torch.zeros(b, 1, dtype=torch.bool, device=mask.device),
                (~mask).repeat_interleave(2, dim=1),
            ],
            dim=1,
        )
        h = self.blocks(seq, src_key_padding_mask=pad)
        return self.out(h[:, -1])  # read at the last action token


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """target ← momentum · target + (1 − momentum) · online, parameter by parameter."""
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.mul_(momentum).add_(o.detach(), alpha=1.0 - momentum)


def momentum_at(config: JEPAConfig, step: int, total: int) -> float:
    """Cosine schedule from ema_momentum[0] to ema_momentum[1]."""
    start, end = config.ema_momentum
    frac = min(1.0, step / max(1, total))
    return end - (end - start) * (math.cos(math.pi * frac) + 1) / 2


def vicreg_terms(z: Tensor) -> tuple[Tensor, Tensor]:
    """Variance hinge (std ≥ 1 per dimension) and off-diagonal covariance penalty."""
    z = z - z.mean(0)
    std = torch.sqrt(z.var(0) + 1e-4)
    var = F.relu(1.0 - std).mean()
    n, d = z.shape
    cov = (z.T @ z) / max(1, n - 1)
    off = cov - torch.diag(torch.diag(cov))
    return var, off.pow(2).sum() / d


class JEPA(nn.Module):
    def __init__(self, config: JEPAConfig) -> None:
        super().__init__()
        self.config = config
        d = config.latent_dim
        self.context = ObservationEncoder(config)
        self.target = copy.deepcopy(self.context)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.task = mlp(TEXT_DIM, config.hidden_dim, d)
        self.action = mlp(TEXT_DIM + len(GUI_KINDS) + 2, config.hidden_dim, d)
        self.predictor = Predictor(config)
        # harm(task, z_t, a_t, z_{t+1}): same weights before (predicted) and after (observed)
        n_latents = 4 if config.harm_reads == "all" else 1
        self.harm_drop = nn.Dropout(config.harm_latent_dropout)
        self.harm = mlp(
            n_latents * d + (REL_DIM if config.relational else 0),
            config.hidden_dim,
            1,
            config.dropout,
        )

    def encode_context(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        task = self.task(batch.task)
        z = self.context(batch.obs_text, batch.obs_image, batch.obs_has_image)
        a = self.action(torch.cat([batch.act_text, batch.act_gui], dim=-1))
        return task, z, a

    def harm_logit(
        self, task: Tensor, z_t: Tensor, a_t: Tensor, z_next: Tensor, rel: Tensor | None
    ) -> Tensor:
        latents = [task, z_t, a_t, z_next] if self.config.harm_reads == "all" else [z_next]
        parts = [self.harm_drop(torch.cat(latents, dim=-1))]
        if self.config.relational:
            parts.append(rel if rel is not None else torch.zeros(len(task), REL_DIM))
        return self.harm(torch.cat(parts, dim=-1)).squeeze(-1)

    def forward(self, batch: Batch) -> Output:
        cfg = self.config
        task, z, a = self.encode_context(batch)
        pred = self.predictor(task, z, a, batch.mask)
        with torch.no_grad():
            target = self.target(batch.next_text, batch.next_image, batch.next_has_image)
        error = (pred - target).pow(2).mean(-1)
        w = batch.dynamics_weight if batch.dynamics_weight is not None else torch.ones_like(error)
        loss_pred = (error * w).sum() / w.sum().clamp(min=1.0)

        loss_roll = torch.zeros((), device=pred.device)
        if cfg.rollout_weight > 0 and batch.has_next2 is not None and bool(batch.has_next2.any()):
            sel = batch.has_next2.bool()
            a1 = self.action(torch.cat([batch.a1_text, batch.a1_gui], dim=-1))[sel]  # type: ignore[list-item]
            z2 = torch.cat([z[sel], pred[sel].unsqueeze(1)], dim=1)
            a2 = torch.cat([a[sel], a1.unsqueeze(1)], dim=1)
            m2 = torch.cat([batch.mask[sel], torch.ones_like(batch.mask[sel][:, :1])], dim=1)
            pred2 = self.predictor(task[sel], z2, a2, m2)
            with torch.no_grad():
                img2 = batch.next2_image[sel] if batch.next2_image is not None else None
                target2 = self.target(batch.next2_text[sel], img2, batch.next2_has_image[sel])  # type: ignore[index]
            err2 = (pred2 - target2).pow(2).mean(-1)
            loss_roll = (err2 * w[sel]).sum() / w[sel].sum().clamp(min=1.0)

        online_next = self.context(batch.next_text, batch.next_image, batch.next_has_image)
        var, cov = vicreg_terms(torch.cat([z[:, -1], online_next], dim=0))

        z_t, a_t = z[:, -1], a[:, -1]
        harm_pre = self.harm_logit(task, z_t, a_t, pred, batch.rel)
        harm_post = self.harm_logit(task, z_t, a_t, online_next, batch.rel)
        loss_harm = torch.zeros((), device=pred.device)
        if batch.label is not None:
            kw = {"pos_weight": cfg.harm_pos_weight, "pool": cfg.mil_pool}
            loss_harm = (
                harm_loss(harm_pre, batch.label, batch.bag, **kw)  # type: ignore[arg-type]
                + harm_loss(harm_post, batch.label, batch.bag, **kw)  # type: ignore[arg-type]
            ) / 2

        loss = (
            loss_pred
            + cfg.rollout_weight * loss_roll
            + cfg.var_weight * var
            + cfg.cov_weight * cov
            + cfg.harm_weight * loss_harm
        )
        parts = {
            name: float(v.detach())
            for name, v in (
                ("pred", loss_pred),
                ("rollout", loss_roll),
                ("var", var),
                ("cov", cov),
                ("harm", loss_harm),
            )
        }
        return Output(loss, pred, target, error.detach(), harm_pre, harm_post, parts)
