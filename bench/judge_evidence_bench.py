"""Does the judge transfer better when it is told where the action's values come from?

    python bench/judge_evidence_bench.py [--levels 2 1 0] [--examples 400] [--slack-steps 400]
        [--max-chars 800] [--epochs 2] [--method lora|full]

Issue 16. LoRA judges on Gemma-3-270M, trained alike on the AgentDojo training suites
(``$VIGIL_HOME/data/agentdojo``, ``train`` split; ``--max-chars`` 800, the top 6 layers,
``--epochs`` 2, half safe and half unsafe; ``--method full``: full fine-tuning of every
weight instead, at its own learning rate), one per evidence level (``monitor reviewer train
--evidence LEVEL``: 0 none; 1 the argument provenance in words before the question; 2 that
and the goal alignment, :mod:`worldmodel.alignment`); each is then asked about a seeded
sample of the never-trained-on ``test_slack`` steps. Writes ``--out`` (default
``bench/results/judge_evidence.json``; arms already there that this run does not repeat are
kept, with the machine they ran on): training time, slack step AUROC and the share it flags
at 0.5, for each arm.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine, write_report  # noqa: E402

NAMES = {0: "plain", 1: "evidence", 2: "evidence_alignment"}


def arm(evidence: int, data: Path, out: Path, examples: int, slack_steps: int,
        max_chars: int = 800, epochs: float = 2.0, method: str = "lora"
        ) -> dict[str, float | int | bool | str]:
    from sklearn.metrics import roc_auc_score

    from monitor.calibrate import screen_step_of_transition
    from monitor.reviewer.judge import Judge
    from monitor.reviewer.train import JudgeTrainConfig, train_judge
    from worldmodel.datasets.format import read_transitions

    cfg = JudgeTrainConfig(data=[str(data)], out=str(out), max_examples=examples, epochs=epochs,
                           max_chars=max_chars, lora_layers=6, eval_examples=40, threads=2,
                           evidence=evidence, method=method)
    t0 = time.perf_counter()
    train_judge(cfg)
    took = time.perf_counter() - t0
    rows = list(read_transitions(data, ["test_slack"]))
    pick = np.random.default_rng(0).choice(len(rows), min(slack_steps, len(rows)), replace=False)
    steps = [screen_step_of_transition(rows[i], data) for i in pick]
    y = [int(rows[i].label) for i in pick]
    p = Judge(out, threads=2).score_steps(steps)
    return {"evidence": evidence, "method": method, "examples": examples, "max_chars": max_chars,
            "epochs": epochs, "train_s": round(took),
            "slack_steps": len(y), "slack_harmful": int(sum(y)),
            "slack_auroc": round(float(roc_auc_score(y, p)), 4),
            "flagged_share": round(float((p >= 0.5).mean()), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=400)
    p.add_argument("--slack-steps", type=int, default=400)
    p.add_argument("--max-chars", type=int, default=800)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--method", choices=["lora", "full"], default="lora")
    p.add_argument("--levels", type=int, nargs="+", default=[2, 1, 0], choices=[0, 1, 2])
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "judge_evidence.json")
    args = p.parse_args()
    import vigil.paths

    data = vigil.paths.dataset("agentdojo")
    load = os.getloadavg()
    here = machine(load)
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    arms = {k: {**v, "machine": v.get("machine", old.get("machine"))}
            for k, v in old.get("arms", {}).items()}
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.levels:
            name = NAMES[level] + ("" if (args.max_chars, args.epochs) == (800, 2.0) else
                                   f"_{args.max_chars}chars_{args.epochs:g}epochs")
            name += "" if args.method == "lora" else f"_{args.method}"
            arms[name] = {**arm(level, data, Path(tmp) / name, args.examples, args.slack_steps,
                                args.max_chars, args.epochs, args.method),
                          "command": shlex.join([sys.executable, *sys.argv]), "machine": here}
            print(name, json.dumps(arms[name]), flush=True)
    write_report(args.out, {
        "bench": "judge_evidence", "command": "per arm (arms[*].command)",
        "measured": __doc__, "data": str(data), "arms": arms, "machine": here})


if __name__ == "__main__":
    main()
