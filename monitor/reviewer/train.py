"""Fine-tuning the L2 judge (``monitor reviewer train``): the training run.

What the judge reads, learns from and how it is trained is described in
:mod:`monitor.reviewer.judge`, which holds what scoring needs (the prompt and
:class:`~monitor.reviewer.judge.Judge`); its examples are :mod:`monitor.reviewer.examples`
(re-exported here). Both read the transition datasets (through :mod:`monitor.calibrate`'s step
views), so the reviewer backends never import them.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.reviewer.examples import (  # noqa: F401 (the training API)
    AFTER_ROGUE,
    HARD_NEGATIVES,
    JudgeExample,
    _balanced,
    _stratified,
    judge_examples,
    trajectory_steps,
)
from monitor.reviewer.judge import (
    FORMAT,
    Log,
    _p_unsafe,
    _stderr,
    is_judge_bundle,
)


@dataclass
class JudgeTrainConfig:
    data: list[str]
    out: str
    model_path: str | None = None  # default: the local reviewer model (Gemma-3-270M)
    method: str = "lora"  # "lora" (peft adapter) or "full"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_layers: int | None = None  # adapt only the top N decoder layers (None: all)
    balance: bool = True  # half safe, half unsafe within each mode of each corpus (_balanced)
    balance_by: str = "corpus"  # "mode": of all corpora together, as before 2026-12-06
    epochs: float = 1.0
    max_examples: int | None = 2000
    eval_examples: int = 160
    batch_size: int = 4
    grad_accum: int = 4
    lr: float | None = None  # default: 2e-4 for LoRA, 2e-5 for full fine-tuning
    max_chars: int = 1200
    # mixed precision in bfloat16; None: where the hardware multiplies it natively (a GPU,
    # AMX or AVX512-BF16), else float32: emulated bfloat16 trains 2-3x slower than float32
    bf16: bool | None = None
    save_steps: int = 20
    seed: int = 0
    threads: int | None = None
    evals: int = 4  # held-out evaluations during training (the loss curve), besides before
    exclude_domains: tuple[str, ...] = ()  # leave-one-domain-out folds
    evidence: int = 0  # evidence before the question: 0 none, 1 provenance, 2 + goal alignment
    encoder: str = "minilm"  # the goal alignment's sentence encoder (static: L1's judge)
    # full: keep the tied token embeddings (and so the LM head) as the base model has them
    freeze_embeddings: bool = False
    # keep only the first N decoder blocks (a truncated judge: L1's cheap verdict); None: all
    layers: int | None = None
    # the read-only twins of hijacked runs as safe examples (examples.judge_examples); off
    # as in every recipe (monitor.judge_recipe.JudgeRecipe.twins says why)
    twins: bool = False

    def __post_init__(self) -> None:
        if self.bf16 is None:
            from vigil.lm import resolve_dtype

            self.bf16 = resolve_dtype("auto") == "bfloat16"

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (2e-4 if self.method == "lora" else 2e-5)

    def recorded(self) -> dict[str, Any]:
        """What ``judge.json`` keeps of this config (a rerun with the same is up to date)."""
        skip = ("data", "out", "threads", "evals")  # where it runs, not what it learns
        kept = {k: v for k, v in asdict(self).items() if k not in skip}
        return dict(json.loads(json.dumps(kept)))  # as read back: tuples become lists


def heldout_examples(cfg: JudgeTrainConfig) -> list[JudgeExample]:
    """The held-out (``val``) examples a run of ``cfg`` measures its loss and verdicts on."""
    return judge_examples(cfg.data, ["val"], limit=cfg.eval_examples, hard_negatives=0.0,
                          max_chars=cfg.max_chars, seed=cfg.seed + 1, evidence=cfg.evidence,
                          encoder=cfg.encoder)


def _tokenise(tok: Any, examples: Sequence[JudgeExample]) -> list[dict[str, list[int]]]:
    """Input ids of prompt + answer, and the answer's ids (the only tokens with a loss)."""
    rows = []
    for e in examples:
        p = tok(e.prompt, add_special_tokens=True)["input_ids"]
        c = tok(e.completion, add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": p + c, "answer": c})
    return rows


def _collate(pad_id: int) -> Callable[[Sequence[dict[str, list[int]]]], dict[str, Any]]:
    """Left-padded batches, so every answer ends the sequence: the loss then needs the
    logits of the last few positions only (the LM head over Gemma's 262k-token vocabulary
    costs more than the rest of the model at every position). Positions count real tokens,
    as they do unpadded."""

    def collate(rows: Sequence[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        n = max(len(r["input_ids"]) for r in rows)
        k = max(len(r["answer"]) for r in rows)
        ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        labels = torch.full((len(rows), k), -100, dtype=torch.long)
        for i, r in enumerate(rows):
            m = len(r["input_ids"])
            ids[i, n - m:] = torch.tensor(r["input_ids"])
            mask[i, n - m:] = 1
            labels[i, k - len(r["answer"]):] = torch.tensor(r["answer"])
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "labels": labels}

    return collate


def _answer_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Cross-entropy of the answer tokens, from the logits of the positions before them."""
    import torch.nn.functional as F

    labels = batch["labels"]
    k = labels.shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], logits_to_keep=k + 1, use_cache=False)
    logits = out.logits[:, :-1].float()  # position t predicts token t + 1
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100)


def train_judge(cfg: JudgeTrainConfig, *, log: Log = _stderr) -> Path:
    """Fine-tune the judge on ``cfg.data``'s ``train`` split (``val`` for the held-out loss),
    resuming from the last checkpoint under ``cfg.out``; returns the bundle folder."""
    import torch
    from sklearn.metrics import roc_auc_score
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from monitor.reviewer.engine import NextTokenEngine, load_reviewer_model
    from vigil.lm import LanguageModel

    if cfg.method not in ("lora", "full"):
        raise ValueError(f"judge method {cfg.method!r}: expected 'lora' or 'full'")
    if cfg.balance_by not in ("corpus", "mode"):
        raise ValueError(f"judge balance_by {cfg.balance_by!r}: expected 'corpus' or 'mode'")
    out = Path(cfg.out)
    if is_judge_bundle(out):
        done = json.loads((out / "judge.json").read_text())
        if done.get("config") == cfg.recorded() and done.get("data") == [str(d) for d in
                                                                           cfg.data]:
            log(f"judge: {out} is up to date (same data and settings); not retrained")
            return out
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    train = judge_examples(cfg.data, ["train"], limit=cfg.max_examples, max_chars=cfg.max_chars,
                           seed=cfg.seed, exclude_domains=cfg.exclude_domains,
                           balance=cfg.balance, balance_by=cfg.balance_by,
                           evidence=cfg.evidence, encoder=cfg.encoder, read_only=cfg.twins)
    val = heldout_examples(cfg)
    if len({e.label for e in train}) < 2:
        raise ValueError(f"{cfg.data}: the train split needs both safe and unsafe examples")
    log(f"judge: {len(train)} training examples ({sum(e.label for e in train)} unsafe, "
        f"{sum(e.hard_negative for e in train)} hard negatives, "
        f"{sum(e.mode == 'trajectory' for e in train)} whole trajectories), {len(val)} held out")
    lm = load_reviewer_model(cfg.model_path, threads=cfg.threads, dtype="float32")
    tok = lm.tokenizer
    model = lm.model
    model.config.use_cache = False
    if cfg.layers:
        from probes.models import keep_first_layers

        keep_first_layers(model, cfg.layers)  # the final norm and the head read block N
    if cfg.method == "lora":
        from peft import LoraConfig, get_peft_model

        n_layers = int(model.config.num_hidden_layers)
        layers = (None if not cfg.lora_layers else
                  list(range(max(0, n_layers - cfg.lora_layers), n_layers)))
        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_targets), layers_to_transform=layers,
            task_type="CAUSAL_LM"))
    elif cfg.freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)  # tied: the head's too
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log(f"judge: {cfg.method} fine-tuning of {lm.model_id}: {trainable:,} of {total:,} "
        f"parameters trained")
    steps_per_epoch = math.ceil(len(train) / (cfg.batch_size * cfg.grad_accum))
    max_steps = max(1, math.ceil(steps_per_epoch * cfg.epochs))
    history: list[dict[str, float]] = []
    ckpt_dir = out / "checkpoints"
    clock = {"train": time.perf_counter()}  # when training (re)started: for the ETA

    class Progress(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any
                   ) -> None:
            logs = dict(logs or {})
            row = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
            row["step"] = float(state.global_step)
            history.append(row)
            dt = time.perf_counter() - clock["train"]
            done = max(1, state.global_step - start_step)
            if state.global_step <= start_step or not {"loss", "eval_loss"} & set(row):
                return  # the loss before training is logged by train_judge; run summaries
            eta = dt / done * (max_steps - state.global_step)
            what = ", ".join(f"{k} {row[k]:.4f}" for k in ("loss", "eval_loss") if k in row)
            log(f"judge: step {state.global_step}/{max_steps} {what} "
                f"({dt:.0f} s, ETA {max(0.0, eta):.0f} s)")

    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size * 2,
        gradient_accumulation_steps=cfg.grad_accum,
        learning_rate=cfg.learning_rate,
        max_steps=max_steps,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, max_steps // 20),
        logging_steps=max(1, min(10, max_steps // 10)),
        eval_strategy="steps",
        eval_steps=max(1, max_steps // max(1, cfg.evals)),
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=2,
        bf16=bool(cfg.bf16),
        use_cpu=True,
        train_sampling_strategy="group_by_length",
        report_to=[],
        seed=cfg.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    class AnswerTrainer(Trainer):  # type: ignore[misc]
        """The library's loop; the loss is the answer tokens' (:func:`_answer_loss`)."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            # a mean per micro-batch: the loop divides it by the accumulation steps
            self.model_accepts_loss_kwargs = False

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            loss = _answer_loss(model, inputs)
            return (loss, None) if return_outputs else loss

        def prediction_step(self, model: Any, inputs: Any, prediction_loss_only: bool,
                            ignore_keys: Any = None) -> Any:
            with torch.no_grad():
                return _answer_loss(model, self._prepare_inputs(inputs)).detach(), None, None

    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    trainer = AnswerTrainer(
        model=model,
        args=args,
        train_dataset=_tokenise(tok, train),
        eval_dataset=_tokenise(tok, val),
        data_collator=_collate(pad),
        callbacks=[Progress()],
    )
    trainer.remove_callback(PrinterCallback)  # Progress says it in one line, with the ETA
    resume = _last_checkpoint(ckpt_dir)
    start_step = int(resume.name.split("-")[-1]) if resume else 0
    before_file = ckpt_dir / "eval_loss_before.json"  # measured once, before any step
    if resume and before_file.exists():
        log(f"judge: resuming from {resume}")
        eval_before = float(json.loads(before_file.read_text()))
    else:
        eval_before = float(trainer.evaluate()["eval_loss"])
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        before_file.write_text(json.dumps(eval_before))
        log(f"judge: held-out loss before training {eval_before:.4f}")
    clock["train"] = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    # the loop evaluates at every eval_steps, the last step among them when it divides max_steps
    last = [r["eval_loss"] for r in history if "eval_loss" in r and r["step"] == max_steps]
    eval_loss = float(last[-1]) if last else float(trainer.evaluate()["eval_loss"])
    model.eval()
    scorer = LanguageModel(model.get_base_model() if cfg.method == "lora" else model, tok,
                           lm.model_id, lm.model_hash, lm.path)
    p_val = _p_unsafe(NextTokenEngine(scorer), [e.prompt for e in val])
    y_val = np.array([e.label for e in val])
    auroc = (float(roc_auc_score(y_val, p_val)) if len(set(y_val.tolist())) == 2 else None)
    seconds = time.perf_counter() - t0
    weights = out / "weights"
    model.save_pretrained(str(weights), safe_serialization=True)
    if cfg.method == "full":  # a whole model folder: it loads with its own tokenizer
        tok.save_pretrained(str(weights))
    info = {
        "format": FORMAT,
        "method": cfg.method,
        "base_model_id": lm.model_id,
        "base_model_hash": lm.model_hash,
        "base_model_path": lm.path,
        "config": cfg.recorded(),
        "data": [str(d) for d in cfg.data],
        "examples": {"train": len(train), "val": len(val)},
        "eval_loss_before": eval_before,
        "eval_loss": eval_loss,
        "heldout": {"auroc": auroc, "labels": y_val.tolist(),
                    "p_unsafe": [round(float(p), 6) for p in p_val]},
        "seconds": round(seconds, 1),
        "history": history,
    }
    (out / "judge.json").write_text(json.dumps(info, indent=2, sort_keys=True))
    _plot_loss(history, out / "loss.png")
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # optimiser state: only for resuming
    log(f"judge: held-out loss {eval_before:.4f} -> {eval_loss:.4f}, AUROC "
        f"{'n/a' if auroc is None else f'{auroc:.3f}'}; wrote {out} in {seconds:.0f} s")
    return out


def packed_verdict_diff(info: dict[str, Any], packed: Path, log: Log) -> float | None:
    """The largest |P(unsafe)| difference between a packed judge (:mod:`monitor.reviewer.pack`)
    and the verdicts the judge gave on its held-out prompts when trained (None where its data
    is not here to rebuild them); past :data:`~monitor.reviewer.pack.MAX_VERDICT_DIFF`, a
    ValueError: the pack is refused."""
    from monitor.reviewer.judge import Judge
    from monitor.reviewer.pack import MAX_VERDICT_DIFF

    recorded = (info.get("heldout") or {}).get("p_unsafe") or []
    if not recorded or not all((Path(d) / "manifest.json").exists() for d in info["data"]):
        log(f"judge: {packed}: the held-out prompts cannot be rebuilt here; verdicts unchecked")
        return None
    val = heldout_examples(JudgeTrainConfig(data=list(info["data"]), out="", **info["config"]))
    got = Judge(packed, dtype="float32").p_unsafe([e.prompt for e in val])
    diff = float(np.abs(got - np.asarray(recorded)).max())
    log(f"judge: the packed judge's verdicts on {len(val)} held-out prompts are within "
        f"{diff:.2e} of the trained judge's")
    if diff > MAX_VERDICT_DIFF:
        raise ValueError(f"{packed}: packed verdicts move up to {diff:.3f} from the trained "
                         f"judge's (more than {MAX_VERDICT_DIFF}); not packed")
    return diff


def _last_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return found[-1] if found else None


def _plot_loss(history: Sequence[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("loss", "training loss"), ("eval_loss", "held-out loss")):
        pts = [(h["step"], h[key]) for h in history if key in h]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o" if key == "eval_loss" else None,
                    label=label)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("cross-entropy (answer tokens)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_recipe(recipe: Any, data: Sequence[str], out: str | Path, *,
                 exclude_domains: Sequence[str] = (), log: Log = _stderr) -> Path:
    """A judge trained by ``recipe`` (:class:`monitor.judge_recipe.JudgeRecipe`) on ``data``,
    less ``exclude_domains`` (a cross-fitting fold), into ``out``."""
    from dataclasses import asdict

    return train_judge(JudgeTrainConfig(data=list(data), out=str(out),
                                        exclude_domains=tuple(exclude_domains),
                                        **asdict(recipe)), log=log)
