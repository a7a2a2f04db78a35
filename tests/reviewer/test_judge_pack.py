"""A fully fine-tuned judge, truncated to its first blocks and packed to ship.

One small run (two blocks of Gemma-3-270M, every weight but the frozen tied embeddings, 8
real AgentDojo banking examples) serves: the bundle is a whole model folder that reloads to
the verdicts it gave in training (tokenizer included: without it every verdict came back
0.5), packs into int4 deltas from the pinned base model that give the same verdicts within
0.01, and scores steps as the L1 signal ``judge_fast``. Apart from ``test_judge.py`` so the
two files run on two test workers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from monitor.reviewer.engine import NextTokenEngine, load_reviewer_model
from monitor.reviewer.judge import Judge, _p_unsafe
from monitor.reviewer.pack import DELTA_FILE, MAX_VERDICT_DIFF, pack_judge
from monitor.reviewer.train import (
    JudgeTrainConfig,
    heldout_examples,
    packed_verdict_diff,
    train_judge,
)
from monitor.scorers.judge import FastJudgeSignals
from probes.models import keep_first_layers
from tests.reviewer.conftest import benign_step, harmful_step


def test_a_truncated_full_judge_reloads_packs_and_scores_at_l1(
    small_agentdojo: Path, tmp_path: Path
) -> None:
    cfg = JudgeTrainConfig(data=[str(small_agentdojo)], out=str(tmp_path / "fast"),
                           method="full", max_examples=8, eval_examples=8, batch_size=4,
                           grad_accum=1, epochs=1, max_chars=300, save_steps=100, threads=2,
                           freeze_embeddings=True, layers=2)
    bundle = train_judge(cfg, log=lambda _: None)
    info = json.loads((bundle / "judge.json").read_text())
    names = {p.name for p in (bundle / "weights").iterdir()}
    assert "model.safetensors" in names and "tokenizer.json" in names, names
    prompts = [e.prompt for e in heldout_examples(cfg)]
    trained = np.array(info["heldout"]["p_unsafe"])
    assert np.ptp(trained) > 1e-3  # the prompts are told apart
    reloaded = Judge(bundle, threads=2, dtype="float32")
    assert reloaded.lm.num_layers == 2
    np.testing.assert_allclose(reloaded.p_unsafe(prompts), trained, atol=1e-4)

    # packed to ship: the changed tensors as int4 deltas from the pinned base model
    packed = tmp_path / "packed"
    record = pack_judge(bundle, packed, check=packed_verdict_diff, log=lambda _: None)
    assert sorted(p.name for p in (packed / "weights").iterdir()) == [DELTA_FILE]
    assert record["changed_tensors"] == 2 * 13 + 1  # two blocks of 13 tensors, the final norm
    assert record["unchanged_tensors"] == 1  # the frozen (tied) embeddings are not shipped
    assert (packed / "weights" / DELTA_FILE).stat().st_size < 8e6
    assert record["heldout_max_abs_diff"] is not None
    assert record["heldout_max_abs_diff"] <= MAX_VERDICT_DIFF
    judge = Judge(packed, threads=2, dtype="float32")
    assert judge.lm.num_layers == 2
    got = judge.p_unsafe(prompts)
    np.testing.assert_allclose(got, trained, atol=MAX_VERDICT_DIFF)
    base = load_reviewer_model(threads=2, dtype="float32")  # the same two blocks, no deltas
    keep_first_layers(base.model, 2)
    untrained = _p_unsafe(NextTokenEngine(base), prompts)
    assert np.abs(untrained - trained).max() > 10 * np.abs(got - trained).max()

    # as the L1 signal judge_fast
    rows = FastJudgeSignals.load({"judge_fast": packed}).score_steps(
        [harmful_step(), benign_step()])
    assert [set(r) for r in rows] == [{"judge_fast"}] * 2
    assert all(0.0 <= r["judge_fast"] <= 1.0 for r in rows)
