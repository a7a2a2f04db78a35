"""How many judge verdicts a second a truncated judge gives on this CPU, by its depth.

    python bench/judge_fast_bench.py [--layers 1 2 3 4 6 9 18] [--n 128] [--batch 8 16 32]

A truncated judge (``monitor reviewer train --layers N``) runs the first N of Gemma-3-270M's
18 decoder blocks; its cost does not depend on its weights, so this bench times the base
model cut to N blocks (in the dtype the judge runs in: bfloat16 where the CPU multiplies it
natively) on ``--n`` real judge prompts of never-trained-on ``test_slack`` steps, written as
the default recipe writes them (:data:`monitor.judge_recipe.JUDGE`: evidence level, view
length). The prompts are built once, first: writing them (the evidence's sentence encoder)
is timed apart, after the encoder is loaded (``prompt_writing_s_per_prompt``: the view and the
evidence, whose level 2 and up encode the passages the agent read with ``--encoder``: MiniLM,
or its static distillation). Writes ``bench/results/judge_fast_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine  # noqa: E402
from vigil import paths  # noqa: E402


def slack_steps(n: int) -> list[Any]:
    """The first ``n`` steps of the never-trained-on ``test_slack`` trajectories, in order."""
    from monitor.screening import screen_steps_of
    from streams.records import Trajectory, read_jsonl

    out: list[Any] = []
    for t in read_jsonl(paths.dataset("agentdojo") / "trajectories.jsonl", Trajectory):
        if (t.meta or {}).get("split") == "test_slack":
            out.extend(screen_steps_of(t))
        if len(out) >= n:
            break
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3, 4, 6, 9, 18])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--evidence", type=int, default=None,
                    help="evidence level of the prompts (default: the recipe's)")
    ap.add_argument("--encoder", choices=["minilm", "static"], default=None,
                    help="the goal alignment's sentence encoder (default: the recipe's)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/judge_fast_speed.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()

    from monitor.judge_recipe import JUDGE
    from monitor.reviewer.engine import NextTokenEngine, load_reviewer_model
    from monitor.reviewer.judge import _p_unsafe, judge_prompts
    from probes.models import keep_first_layers

    args.evidence = JUDGE.evidence if args.evidence is None else args.evidence
    args.encoder = args.encoder or JUDGE.encoder

    steps = slack_steps(args.n)

    def write(batch: list[Any]) -> list[str]:
        return judge_prompts(batch, mode="step", max_chars=JUDGE.max_chars,
                             evidence_level=args.evidence, encoder=args.encoder)

    write(steps[:8])  # loads the sentence encoder: not a per-prompt cost
    t0 = time.perf_counter()  # writing the prompts: the view, and the evidence (level 2 and
    prompts = write(steps)  # up encode the passages the agent read)
    write_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for n in sorted(args.layers, reverse=True):
        lm = load_reviewer_model(threads=args.threads)
        keep_first_layers(lm.model, n)
        tokens = [len(lm.tokenizer.encode(p)) for p in prompts]
        for b in args.batch:
            engine = NextTokenEngine(lm, batch_size=b)
            _p_unsafe(engine, prompts[: 2 * b])  # warm up
            t0 = time.perf_counter()
            _p_unsafe(engine, prompts)
            per_s = len(prompts) / (time.perf_counter() - t0)
            rows.append({"layers": n, "batch_size": b, "verdicts_per_s": round(per_s, 1),
                         "dtype": lm.dtype})
            print(f"layers {n:2d} batch {b:2d}: {per_s:7.1f} verdicts/s ({lm.dtype})",
                  flush=True)
    out = {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "data": f"{len(prompts)} test_slack steps (AgentDojo) as judge prompts, evidence "
                f"{args.evidence} ({args.encoder} encoder), max_chars {JUDGE.max_chars}",
        "prompt_tokens": {"median": sorted(tokens)[len(tokens) // 2], "max": max(tokens)},
        "prompt_writing_s_per_prompt": round(write_s / max(1, len(prompts)), 4),
        "results": rows,
        "machine": machine(load0),
    }
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: out[k] for k in ("prompt_tokens", "prompt_writing_s_per_prompt")}))


if __name__ == "__main__":
    main()
