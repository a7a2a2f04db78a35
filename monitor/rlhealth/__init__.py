"""RL rollout health and harm attribution (DESIGN §5): the signals of the RL systems
whose rollouts vigil screens.

- ``formulas``: one pure numpy function per formula (staleness, drift, mismatch,
  SymMax, MPO credit assignment);
- ``signals``: per-call, per-execution, per-group and per-version aggregates;
- ``alerts``: staleness band, drift early warning, mismatch spikes, reward hacking;
- ``stream``: the monitor state machine and its ``StreamProcessor`` over the TITO topics;
- ``metrics``: the ``vigil_rl_*`` Prometheus metrics;
- ``attribution``: MPO harm attribution per turn and token, with a ``Critic`` protocol;
- ``simulate``: boundary-dispatch schedules and synthetic RL runs with a collapse.

Import the submodules; this package imports nothing heavy at import time.
"""
