"""Generated images as steps the tiers screen: one :class:`StepEvent` per ART endpoint.

An ART rollout (:class:`streams.media.MediaRollout`) is one prompt's K endpoints at one
policy version. Each endpoint becomes a step of the trajectory ``art/<run>/<prompt>``,
which runs across policy versions, so the stream's history of a step is the prompt's
earlier endpoints (this version's before it, then the last ones of earlier versions):

- task: the prompt; action: the call ``generate_image(prompt=..., seed=...)``
  (``generate_video`` for video), its text holding the prompt, so the L0 rules read it;
- result: what the call produced: the endpoint's thumbnail (for video, a frame) and a line
  naming it and its rewards. The world model's surprise is its error in predicting this
  result's latent (the thumbnail through its vision tower) from the steps before;
- observation: text only, as the world model reads a trajectory (each step sees what the
  one before produced): the previous endpoint's line, or, for the first, the group it
  starts. No image: the world model calibrates the surprise of a step whose observation
  has a screenshot against web-page steps, whose next screenshot barely changes;
- the step's ``media`` key: run, prompt id, policy version, endpoint, kind, ref, seed, the
  rewards by reward model and the scalar reward R_i; a case page shows them.

Step ids are ``v<version>-e<i>``, indices ``version * 1024 + i``: unique within the
trajectory and increasing with the version. Every event names its ART group as its
execution (``meta.execution_id`` = :attr:`MediaRollout.rollout_id`) and the group's last
endpoint is ``final``: the group gets its rollout verdict then, while the trajectory, and
the prompt's history with it, goes on (``monitor.stream.screen`` forgets a history only
when a final step ends its trajectory).
"""

from __future__ import annotations

from typing import Any

from streams.media import MediaEndpoint, MediaRollout
from streams.records import Action, Observation, Step, StepEvent, ToolCall

VERSION_STRIDE = 1024  # endpoints a rollout may have at most (MediaRollout.endpoints)
TOOLS = {"image": "generate_image", "video": "generate_video"}


def media_trajectory_id(run_id: str, prompt_id: str) -> str:
    """The trajectory of one prompt in one run, across its policy versions."""
    return f"art/{run_id}/{prompt_id}"


def media_step_id(policy_version: int, endpoint: int) -> str:
    return f"v{policy_version}-e{endpoint}"


def _rewards_text(rollout: MediaRollout, e: MediaEndpoint, reward: float) -> str:
    heads = ", ".join(f"{h} {e.rewards[h]:.3f}" for h in rollout.heads)
    return f"rewards: {heads}; reward {reward:.3f}"


def _endpoint_text(rollout: MediaRollout, i: int, reward: float) -> str:
    """One line: what endpoint ``i`` is, and what the reward models gave it."""
    e = rollout.endpoints[i]
    return (f"Generated {e.media} {i + 1} of {len(rollout.endpoints)} at policy version "
            f"{rollout.policy_version}; {_rewards_text(rollout, e, reward)}.")


def _call(rollout: MediaRollout, e: MediaEndpoint) -> Action:
    args: dict[str, Any] = {"prompt": rollout.prompt}
    if e.seed is not None:
        args["seed"] = e.seed
    name = TOOLS[e.media]
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return Action(text=f"{name}({shown})", tool=ToolCall(name=name, arguments=args))


def _media(rollout: MediaRollout, i: int, reward: float) -> dict[str, Any]:
    e = rollout.endpoints[i]
    return {
        "run_id": rollout.run_id,
        "prompt_id": rollout.prompt_id,
        "policy_version": rollout.policy_version,
        "endpoint": i,
        "endpoints": len(rollout.endpoints),
        "kind": e.media,
        "ref": e.ref,
        "seed": e.seed,
        "rewards": {h: e.rewards[h] for h in rollout.heads},
        "reward": reward,
    }


def media_step_events(rollout: MediaRollout) -> list[StepEvent]:
    """One step event per endpoint of ``rollout``, in endpoint order (module docstring)."""
    rewards = rollout.scalar_rewards()
    k = len(rollout.endpoints)
    tid = media_trajectory_id(rollout.run_id, rollout.prompt_id)
    meta = {"execution_id": rollout.rollout_id, "run_id": rollout.run_id,
            "prompt_id": rollout.prompt_id, "policy_version": rollout.policy_version,
            "trajectory_continues": True}  # the prompt's next versions extend it
    before = Observation(text=f"Prompt {rollout.prompt_id} at policy version "
                              f"{rollout.policy_version}: {k} endpoints to sample.")
    events = []
    for i, e in enumerate(rollout.endpoints):
        result = Observation(text=_endpoint_text(rollout, i, rewards[i]), screenshot=e.thumbnail)
        step = Step.model_validate({
            "step_id": media_step_id(rollout.policy_version, i),
            "index": rollout.policy_version * VERSION_STRIDE + i,
            "observation": before,
            "action": _call(rollout, e),
            "result": result,
            "media": _media(rollout, i, rewards[i]),  # an extra key of the interchange format
        })
        events.append(StepEvent(trajectory_id=tid, source="rollout", task=rollout.prompt,
                                step=step, final=i == k - 1, meta=meta))
        before = Observation(text=result.text)
    return events
