"""Transition datasets: the on-disk format and the builders that write it.

Read by the world model (training, evaluation), the probes and the tier policy;
nothing here imports model code.

- :mod:`~worldmodel.datasets.format` -- the dataset format: ``Transition``,
  ``Manifest``, ``DatasetWriter``, ``read_manifest``, ``read_transitions``;
- :mod:`~worldmodel.datasets.agentdojo` -- AgentDojo tool-use transitions
  (``agentdojo.build.build_agentdojo``): ground-truth traces run offline in
  the suites' own runtime, labels from the ground truth;
- :mod:`~worldmodel.datasets.miniwob` -- MiniWoB++ GUI transitions
  (``miniwob.build.build_miniwob``) recorded in headless Chromium, harm labels
  derived by rules.

The builder subpackages import their benchmark (``agentdojo``, ``miniwob``,
selenium) when loaded; :mod:`~worldmodel.datasets.format` needs neither.
"""
