"""The streaming worker (``monitor stream``): steps in, scores, escalations, pages and verdicts out.

Five stages, each a consumer group of its own, so each scales by running more members
(threads of one ``monitor stream``, or processes on many machines)::

    vigil.tito.calls/executions ─ reassemble ─> vigil.steps.rollout ─┐
                                          vigil.steps.deployment ─────┴─ screen (L0)
        ├─> vigil.scores            Score(tier=0) for every step, at once
        ├─> vigil.steps.l0          every step with its L0 signals and gate-0 decision
        ├─> vigil.labels            the labels of replayed benchmark steps and canaries
        └─> vigil.gates             live gate sketches (--adapt), read back on a restart
    vigil.steps.l0 ─ probe (L1, on what L0 passed up)
        ├─> vigil.scores            Score(tier=1) for what L1 scored
        ├─> vigil.escalations       Escalation(tier=2) with the trajectory so far
        ├─> vigil.verdicts.rollout  one RolloutVerdict per execution (trainer admission)
        └─> vigil.gates             live gate sketches of gates 1 and 2 (--adapt)
    vigil.escalations (tier 2) ─ review (L2) ─> Score(tier=2), Escalation(tier=3),
                                                and a page: POST {paging}/api/v1/events
    vigil.labels + vigil.scores ─ recall ─> vigil_labelled_steps_total (Prometheus)

Where each part lives:

* :mod:`monitor.stream.build`: :func:`~monitor.stream.build.build_worker` wires a worker
  (start here);
* :mod:`monitor.stream.screen`, :mod:`~monitor.stream.probe`, :mod:`~monitor.stream.review`,
  :mod:`~monitor.stream.recall`: one module per stage, each read top to bottom
  (consume → score → decide → publish); the reassembly stage is
  :func:`streams.rollouts.reassembly_processor`;
* :mod:`monitor.stream.verdicts`: open rollout executions and their verdicts;
* :mod:`monitor.stream.history`: each step's history, and escalations cut to fit the bus;
* :mod:`monitor.stream.paging`: the page event and the paging service's client;
* :mod:`monitor.stream.runner`: threads, the broker watch, health and SIGTERM;
* :mod:`monitor.stream.stats`: the counters of the progress line.

Guarantees:

* **Micro-batches.** The screen stage scores each polled batch in one call of the L0
  models (``Screener.screen(batch, through=0)``), the probe stage the escalated steps of
  its batch in one call of the L1 models (``Screener.screen_escalated``); a batch that
  makes them fail is retried one record at a time, so only the poisoned record is dead-lettered.
* **At least once** (DESIGN §2.4). Inputs are committed only after every output
  of their batch is acknowledged by the broker; outputs carry the idempotency key
  ``trajectory/step/tier`` (a verdict: ``execution/verdict``); a page's dedup key is
  ``trajectory/step``, and the paging service never opens a second page for a
  known key, so a redelivered step never pages twice. When the paging service
  cannot be reached the batch is not committed: it is consumed again later.
* **State, and what a restart loses.** The screen and probe stages each keep, in memory,
  the recent steps of the last ``history_trajectories`` trajectories (LRU) to give
  each step its history. Rollout executions are held: the stage never commits
  past the first step of an execution whose ``final`` step it has not seen, so
  after a crash or a rebalance the whole open execution is screened again and its
  history and quarantine verdict are rebuilt exactly. An execution whose final
  step does not come within ``execution_timeout_s`` of its newest step (by the
  wall clock, or by the producer times of later steps on its partition), or that
  is the oldest of more than ``max_open_executions``, gets a verdict marked
  ``incomplete`` and stops holding commits. Deployment trajectories are
  not held (they may never end): after a restart or a rebalance, the next steps of
  a trajectory in flight are screened with only the steps seen since as history.
* **Nothing goes back to the agent.** The worker writes only the scores, its own
  ``vigil.steps.l0``, escalations, labels, gates, rollout-verdict and dead-letter topics
  and the paging service; no topic or API a monitored agent reads (DESIGN §3).
* **Shutdown.** On SIGTERM or SIGINT every stage stops polling, finishes its
  batch, flushes, commits and leaves its group.
"""
