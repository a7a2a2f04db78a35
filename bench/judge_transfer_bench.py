"""A judge on corpora it never trained on: every step and trajectory of their ``val`` split.

    python bench/judge_transfer_bench.py --judge $VIGIL_HOME/models/judge \
        --data $VIGIL_HOME/data/openagentsafety $VIGIL_HOME/data/stepshield [--split val]

For each dataset (built by ``monitor worldmodel build-data NAME``), the judge is asked the
step question of every step with a step label (StepShield's annotated steps; a corpus
labelled per trajectory has none) and the trajectory question of every trajectory's last
step, in the data's proportions; each trajectory is graded also by its steps' largest step
verdict (``step_max``) and by the larger of the two (``either``), the way ``monitor screen``
grades one. The judge's bundle must not have trained on these corpora (its ``data`` is
checked): then each is a domain it never saw, as in a leave-one-domain-out fold. Writes
``bench/results/judge_transfer.json`` (``--out``).
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
from bench.reviewer_bench import _judged, _step_max, _trajectories_of  # noqa: E402
from vigil import paths  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", default=str(paths.bundle("judge")))
    ap.add_argument("--data", nargs="+", default=[str(paths.dataset(n)) for n in
                                                  ("openagentsafety", "stepshield")])
    ap.add_argument("--split", default="val")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/judge_transfer.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()

    from monitor.reviewer.judge import Judge
    from monitor.reviewer.train import judge_examples
    from worldmodel.datasets.format import read_manifest

    judge = Judge(args.judge, threads=args.threads)
    trained_on = {read_manifest(d).name if (Path(d) / "manifest.json").exists()
                  else Path(d).name for d in judge.info["data"]}
    results: dict[str, Any] = {}
    for d in args.data:
        name = read_manifest(d).name
        if name in trained_on:
            raise SystemExit(f"{args.judge} trained on {name}: not a corpus it never saw")
        t0 = time.perf_counter()
        exs = judge_examples([d], [args.split], hard_negatives=0.0, max_chars=judge.max_chars,
                             evidence=judge.evidence, encoder=judge.encoder)
        p = judge.p_unsafe([e.prompt for e in exs])
        step_max = _step_max(judge, exs, _trajectories_of(exs, [d], args.split))
        results[name] = {**_judged(exs, p, step_max),
                         "examples": {m: sum(e.mode == m for e in exs)
                                      for m in ("step", "trajectory")},
                         "seconds": round(time.perf_counter() - t0, 1)}
        print(name, json.dumps(results[name]), flush=True)
    out = {
        "command": " ".join([Path(sys.executable).as_posix(), *sys.argv]),
        "judge": {"bundle": str(args.judge), "config": judge.info["config"],
                  "trained_on": sorted(trained_on)},
        "data": {read_manifest(d).name: f"{d} ({args.split})" for d in args.data},
        "protocol": "P(unsafe) from the verdict token; F1 and flagged share at 0.5; step: "
                    "step-labelled steps; trajectory: the trajectory question on the last "
                    "step, step_max: the largest step verdict, either: the larger",
        "results": results,
        "machine": machine(load0),
    }
    Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
