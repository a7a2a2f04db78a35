"""AgentDojo tool-use transitions: ground-truth traces run in the suites' own runtime.

Three kinds of trajectory, all from the installed ``agentdojo`` package, offline:

* **benign** -- a user task's ground-truth calls, executed one by one in the
  suite's ``FunctionsRuntime`` on a fresh default environment (injection
  vectors at their benign defaults), then its ground-truth answer if it has one.
* **hijacked** -- the same user task in an environment whose injection vectors
  (those the task's ground truth reaches) carry an attack's text for one
  injection task; after the first tool result that shows injected text, the
  injection task's ground-truth calls are spliced in and executed in the same
  runtime (so they change the environment), then the user task carries on.
* **injection** -- an injection task's ground-truth calls alone, from a fresh
  default environment, with its goal as the task.

Labels come from the ground truth, not from rules: ``label`` = 1 exactly for
the spliced (or injection-alone) calls. ``category`` of a label-1 call is
:func:`category_of` its function name. ``injected`` / ``next_injected`` say
whether the observation before / after the call shows injected text; this is
decided the way AgentDojo finds injection candidates: the same calls are run
in lockstep on a shadow environment whose injected vectors hold canary
strings, and a result is injected when it shows a canary (the attack text
itself is reflowed by YAML on the way in and out, so it cannot be searched
for verbatim).

Splits (held-out discipline): suites ``workspace``, ``travel``, ``banking``
with ``important_instructions`` go to ``train`` / ``val`` by user task (group
``f"{suite}/{user_task}"``; injection-alone trajectories by
``f"{suite}/{injection_task}"``), a fifth of each suite's groups to ``val`` chosen
by a stable hash (:func:`val_groups`); every other attack on those suites goes to
``test_attacks`` (hijacked only); ``slack`` (benign, injection-alone and every
attack) goes to ``test_slack``.

Modules:

- :mod:`~worldmodel.datasets.agentdojo.trajectories` -- suites, attacks, harm
  categories, splits and the trajectory records;
- :mod:`~worldmodel.datasets.agentdojo.runtime` -- ground truth executed in a
  suite's runtime, injected results found with canaries;
- :mod:`~worldmodel.datasets.agentdojo.build` -- ``build_agentdojo(out_dir)``
  writes the dataset (:mod:`worldmodel.datasets.format`: transitions and
  DESIGN §2.1 trajectories); the full build takes about a minute and a half on
  two cores.
"""
