"""The L2 judge's training recipes: the default run of ``monitor reviewer train`` and of the
full ``calibrate --defaults`` (:data:`JUDGE`), and the demo's small one (:data:`SMALL_JUDGE`).

Kept apart from :mod:`monitor.reviewer.train` so the command line reads its defaults without
importing numpy or torch. Why these: full fine-tuning with level-2 evidence on a 300-character
view transfers to tools never trained on where a LoRA adapter does not (docs/reviewer.md,
"Full fine-tuning transfers where LoRA does not"; ``bench/results/judge_full_*.json``).
"""

from __future__ import annotations

from dataclasses import dataclass

# the default corpus the world model and the judge learn from, in the order it is built (the
# last three from the interchange files under ../shared/data/ where they are there)
CORPORA = ("agentdojo", "toolemu", "miniwob", "openagentsafety", "stepshield")


@dataclass(frozen=True)
class JudgeRecipe:
    method: str  # "full" (every weight) or "lora" (a peft adapter)
    evidence: int  # evidence before the question: 0 none, 1 provenance, 2 + goal alignment
    max_chars: int  # characters of trajectory shown per example
    epochs: float
    max_examples: int  # training examples (half safe, half unsafe per mode of each corpus)
    eval_examples: int  # held-out (val) examples for the loss and AUROC it reports
    # full fine-tuning leaves the (tied) token embeddings as the pinned model has them: the
    # bundle then ships as the changed blocks only (monitor.reviewer.pack, int8 deltas)
    freeze_embeddings: bool = False
    # the goal alignment's sentence encoder: minilm, or static (its model2vec distillation)
    encoder: str = "minilm"
    # keep only the first N decoder blocks (a truncated judge, L1's verdict); None: all 18
    layers: int | None = None
    lr: float | None = None  # None: the trainer's default for the method
    # the read-only twins of hijacked runs as safe examples: off, they cost transfer to a
    # domain held out (4-block judge, travel fold: step AUROC 0.72 with, 0.81 without;
    # bench/results/judge_fast_lodo_travel_*.json) and did not teach reading != acting
    twins: bool = False


# 18-35 min on a 2-core CPU with native bfloat16 (AMX, AVX512-BF16; CPUs differ), 43 min or
# more in float32 without it (a leave-one-domain-out fold, a little smaller); about 12 GB
JUDGE = JudgeRecipe(method="full", evidence=3, max_chars=300, epochs=3.0, max_examples=500,
                   eval_examples=160, freeze_embeddings=True)
# L1's judge (``judge_fast``): the same question and evidence, the first 4 of 18 blocks (about a
# quarter of the full judge's cost a verdict, a third of the layer-12 probe's), the static
# sentence encoder for the evidence's goal alignment (its prompts cost ~0.3 ms, not ~8 ms);
# lr 1e-4: the head reads block 4, far from where it was trained to read (judge_fast_*.json)
FAST_JUDGE = JudgeRecipe(method="full", evidence=3, max_chars=300, epochs=3.0, max_examples=500,
                         eval_examples=160, freeze_embeddings=True, encoder="static", layers=4,
                         lr=1e-4)
# `make demo`: a LoRA adapter of a few MB on 48 examples, a few minutes
SMALL_JUDGE = JudgeRecipe(method="lora", evidence=0, max_chars=600, epochs=1.0, max_examples=48,
                          eval_examples=16)
