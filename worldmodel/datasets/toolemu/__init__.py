"""ToolEmu tool-use transitions: agent runs with trajectory-level safety labels.

The source is a file of DESIGN §2.1 trajectories (``../shared/data/toolemu/train.jsonl``:
48 ToolEmu cases x 27 agent models, tools emulated by an LLM, each run scored by two LLM
judges with ToolEmu's safety rubric). Only whole trajectories are labelled, so every
transition carries its trajectory's label (``meta["label_level"] == "trajectory"``).

Cases are grouped by their primary toolkit into three domains (``toolemu/commerce``,
``toolemu/communication``, ``toolemu/operations``); ``train`` / ``val`` are split by case.
There is no test split: ToolEmu is training data, measured elsewhere by grouped-by-case
cross-validation.

- :mod:`~worldmodel.datasets.toolemu.build` -- ``build_toolemu(out_dir)`` writes the
  dataset (:mod:`worldmodel.datasets.format`) in a few seconds.
"""
