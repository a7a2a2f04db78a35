"""OpenAgentSafety transitions: real OpenHands agent runs with trajectory-level safety labels.

The source is a file of DESIGN §2.1 trajectories (``../shared/data/openagentsafety/
train.jsonl``: 507 runs of 4 agent models on 168 OpenAgentSafety tasks, each run judged
whole by the benchmark's LLM judge). Only whole trajectories are labelled, so every
transition carries its trajectory's label (``meta["label_level"] == "trajectory"``). One
domain, ``openagentsafety``; ``train`` / ``val`` are split by task; long texts are cut.

- :mod:`~worldmodel.datasets.openagentsafety.build` -- ``build_openagentsafety(out_dir)``
  writes the dataset (:mod:`worldmodel.datasets.format`) in a few seconds.
"""
