"""MiniLM text encoding in float32 and in bfloat16 autocast, on the world model's own texts.

    python bench/encoder_dtype_bench.py [--n 768] [--corpora openagentsafety toolemu ...]

The world model's L0 cost is mostly one MiniLM forward per new text (inline latency, issue
34) and ``make models`` spends ~15 min encoding its corpora's texts (issue 32). This measures
both dtypes on the same random sample of the built corpora's train-split texts ($VIGIL_HOME
data):
texts/s each way and how far the bfloat16 embeddings lie from the float32 ones (cosine).
Writes bench/results/encoder_dtype.json. Nothing here changes what ships.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.machine import machine, write_report  # noqa: E402
from vigil import paths  # noqa: E402
from worldmodel.encoders import TextEncoder  # noqa: E402

FIELDS = ("action_text", "observation_text", "next_observation_text")


def corpus_texts(corpora: list[str]) -> list[str]:
    texts: set[str] = set()
    for corpus in corpora:
        with (paths.dataset(corpus) / "transitions.jsonl").open() as f:
            for line in f:
                t = json.loads(line)
                if t.get("split") != "train":  # held-out splits stay unread
                    continue
                texts.update(v for k in FIELDS if isinstance(v := t.get(k), str) and v)
    return sorted(texts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=768, help="texts sampled")
    p.add_argument("--corpora", nargs="+",
                   default=["openagentsafety", "toolemu", "stepshield", "agentdojo"])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "encoder_dtype.json"))
    args = p.parse_args()
    load_before = os.getloadavg()
    texts = corpus_texts(args.corpora)
    rng = np.random.default_rng(0)
    sample = [texts[i] for i in rng.choice(len(texts), min(args.n, len(texts)), replace=False)]
    enc = TextEncoder()
    t0 = time.perf_counter()
    fp32 = enc._run(sample)
    s32 = time.perf_counter() - t0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t0 = time.perf_counter()
        bf16 = enc._run(sample)
        s16 = time.perf_counter() - t0
    cos = (fp32 * bf16).sum(1)
    results = {
        "texts": len(sample),
        "mean_chars": round(float(np.mean([len(t) for t in sample])), 1),
        "float32_texts_per_s": round(len(sample) / s32, 1),
        "bfloat16_texts_per_s": round(len(sample) / s16, 1),
        "speedup": round(s32 / s16, 2),
        "cosine_min": round(float(cos.min()), 6),
        "cosine_p01": round(float(np.quantile(cos, 0.01)), 6),
        "cosine_mean": round(float(cos.mean()), 6),
    }
    report = {
        "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""),
                               *[a.replace(str(ROOT) + "/", "") for a in sys.argv]]),
        "measured": "MiniLM (all-MiniLM-L6-v2, max 256 tokens, batch 64, texts sorted by "
                    "length) over the same sample: float32, then torch.autocast(bfloat16); "
                    "cosine between each text's two L2-normalised embeddings",
        "data": {"corpora": args.corpora, "split": "train", "distinct_texts": len(texts),
                 "sample_seed": 0},
        "results": results,
        "machine": machine(load_before),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_report(args.out, report)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
