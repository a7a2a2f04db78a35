"""How much key/value-cache reuse could save L1 (issue 17, item 3).

    python bench/probe_prefix_bench.py [--split test_slack] [--data DIR]

Writes bench/results/probe_prefix.json. The probe reads a step rendered by
``probes.capture.Template`` (the leave-one-domain-out choice: the task, one earlier
step, the observation and the action, cut from the left to ``max_tokens``). A step's
input can reuse the keys and values of its trajectory's previous step only over the
token prefix the two share; this bench tokenises every step of ``--split`` in trajectory
order with Gemma-3-270M's tokenizer and reports that prefix: its mean length, its share
of all tokens (the most a prefix cache could save of the probe's forward passes), and the
share of steps whose rendering is cut from the left (a cut moves the start of the window,
so nothing before it is shared).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine, write_report  # noqa: E402


def main() -> None:
    from transformers import AutoTokenizer

    import vigil.paths
    from probes.capture import ProbeStep, Template, encode_step
    from vigil.lm import convert_default_model
    from worldmodel.datasets.format import read_transitions

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(vigil.paths.dataset("agentdojo")))
    p.add_argument("--split", default="test_slack")
    args = p.parse_args()
    load = os.getloadavg()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(convert_default_model(), local_files_only=True)
    template = Template()
    prev: dict[str, list[int]] = {}
    shared, lengths = [], []
    cut = steps = 0
    for t in read_transitions(args.data, [args.split]):
        step = ProbeStep.from_transition(t)
        ids, n_action = encode_step(tok, template, step)
        context = tok(template.context(step), add_special_tokens=False)["input_ids"]
        cut += len(context) + n_action + 1 > template.max_tokens
        steps += 1
        before = prev.get(t.trajectory_id)
        if before is not None:
            k = 0
            for a, b in zip(before, ids, strict=False):
                if a != b:
                    break
                k += 1
            shared.append(k)
            lengths.append(len(ids))
        prev[t.trajectory_id] = ids
    s, n = np.array(shared), np.array(lengths)
    report = {
        "bench": "probe_prefix",
        "command": shlex.join([sys.executable, *sys.argv]),
        "data": {"dataset": args.data, "split": args.split, "steps": steps,
                 "consecutive_pairs": len(s)},
        "template": template.to_dict(),
        "figure": {
            "mean_tokens_per_step": round(float(n.mean()), 1),
            "mean_shared_prefix_tokens": round(float(s.mean()), 1),
            "shared_token_share": round(float(s.sum() / n.sum()), 4),
            "pairs_sharing_more_than_bos": round(float((s > 1).mean()), 4),
            "left_cut_share": round(cut / steps, 4),
        },
        "seconds": round(time.perf_counter() - t0, 1),
        "machine": machine(load),
    }
    write_report(ROOT / "bench" / "results" / "probe_prefix.json", report)
    print(report["figure"])


if __name__ == "__main__":
    main()
