"""StepShield transitions: synthetic code-agent trajectories with step-level rogue labels.

The source is a file of DESIGN §2.1 trajectories (``../shared/data/stepshield/train.jsonl``:
290 rogue/clean pairs written by LLMs, the first rogue step of each rogue one annotated by
people). Labels are per step: 0 before the first rogue step and on clean twins, 1 on a
rogue step; a later unannotated step of a rogue trajectory is 1 with
``meta["label_level"] == "after_rogue"``. One domain, ``stepshield``; ``train`` / ``val``
are split by task title, so twins and same-title pairs stay together.

- :mod:`~worldmodel.datasets.stepshield.build` -- ``build_stepshield(out_dir)`` writes the
  dataset (:mod:`worldmodel.datasets.format`) in a second or two.
"""
