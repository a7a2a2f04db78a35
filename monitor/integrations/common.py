"""What every integration shares: the default screener, a tool call as an :class:`Action`,
a run's calls so far as the :class:`Trajectory` a new call is judged in, and the reason a
stopped call gives the model."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

from monitor.pipeline import ActionCheck
from streams.records import Action, Observation, Step, ToolCall, Trajectory

Screen = Callable[[Trajectory, Action], ActionCheck]
MAX_STEPS = 32  # the screeners read the last few steps; a long session keeps memory bounded
MAX_RESULT_CHARS = 20_000

_DEFAULT: dict[str, Screen] = {}


def default_screen(policy: str | None = None) -> Screen:
    """The default policy's screener (L0 + L1), loaded once per process."""
    key = policy or ""
    if key not in _DEFAULT:
        from monitor.defaults import ensure_policy
        from monitor.pipeline import load_screener

        _DEFAULT[key] = load_screener(ensure_policy(policy), reviewer=False).check_action
    return _DEFAULT[key]


def service_screen(url: str, token: str | None) -> Screen:
    """A screen function that asks a running paging service (``POST /v1/screen``)."""
    import urllib.request

    from monitor.pipeline import ActionCheck

    def screen(trajectory: Any, action: Any) -> ActionCheck:
        body = json.dumps({"trajectory": trajectory.model_dump(mode="json"),
                           "action": action.model_dump(mode="json")}).encode()
        req = urllib.request.Request(f"{url.rstrip('/')}/v1/screen", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=30) as r:
            got = json.loads(r.read())
        return ActionCheck(got["decision"], int(got["tier"]), float(got["score"]),
                           got.get("signals") or {}, float(got["latency_ms"]) / 1000,
                           got.get("rule"))

    return screen


def tool_action(name: str, arguments: Any, text: str = "", **extra: Any) -> Action:
    """A tool call as vigil's :class:`Action`: arguments given as a JSON string are parsed
    (``{"raw": ...}`` where they do not parse); a value that is not an object is
    ``{"value": ...}``; ``extra`` keys travel with the call (e.g. the MCP ``server``, which
    tool rules match on)."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            arguments = {"raw": arguments}
    args = dict(arguments) if isinstance(arguments, dict) else (
        {} if arguments is None else {"value": arguments})
    return Action(text=text, tool=ToolCall.model_validate({"name": name, "arguments": args,
                                                           **extra}))


def next_step(last: Step | None, task: str, action: Action, result: str) -> Step:
    """The step after ``last`` (None: the run's first): numbered by its place in the run,
    its observation what ``last`` returned (the first's: the task)."""
    n = last.index + 1 if last is not None else 0
    seen = (last.result or Observation(text="")) if last is not None else Observation(text=task)
    return Step(step_id=str(n), index=n, observation=seen, action=action,
                result=Observation(text=result[:MAX_RESULT_CHARS]))


def screen_from(service: str | None, token: str | None, policy: str | None) -> Screen:
    """A running service's ``POST /v1/screen`` (``service``), else the screener of
    ``policy`` (default: the default policy) loaded here."""
    if service:
        return service_screen(service, token)
    return default_screen(policy)


def stops(got: ActionCheck, escalate: str) -> bool:
    """Whether a gate keeps the call from running: blocked, or escalated unless
    ``escalate="allow"``."""
    return got.decision == "block" or (got.decision == "escalate" and escalate == "reject")


def trajectory_from_calls(run_id: str, task: str, calls: Iterable[tuple[Action, str]],
                          *, meta: dict[str, Any] | None = None) -> Trajectory:
    """The run so far: each call with what it returned is a step, the last ``MAX_STEPS``
    kept, each numbered by its place in the whole run (a step id names one step however
    long the run grows); a step's observation is what the call before returned (the
    first's: the task)."""
    done = list(calls)
    start = max(0, len(done) - MAX_STEPS)
    steps: list[Step] = []
    seen = Observation(text=done[start - 1][1][:MAX_RESULT_CHARS] if start else task)
    for i, (action, output) in enumerate(done[start:], start):
        result = Observation(text=output[:MAX_RESULT_CHARS])
        steps.append(Step(step_id=str(i), index=i, observation=seen, action=action,
                          result=result))
        seen = result
    return Trajectory(trajectory_id=run_id, source="deployment", task=task, steps=steps,
                      meta=meta or {})


def stop_reason(name: str, got: ActionCheck) -> str:
    """What the model reads instead of the tool's output when vigil stopped the call."""
    return (f"vigil stopped this call to {name}: the safety screen "
            f"{'blocked' if got.decision == 'block' else 'escalated'} it (score "
            f"{got.score:.3f}, tier L{got.tier}" + (f"; {got.rule}" if got.rule else "")
            + "); it was not run")


class StepStream:
    """Each screened call as a :class:`~streams.records.StepEvent` on the deployment steps
    topic, so the async tiers (L1 to L3), pages and recall dashboards see a gate's traffic:
    an allowed call with what the tool returned, a stopped one with the refusal as its
    result; the gate's decision rides in ``meta`` (``vigil_forwarded``, ``vigil_decision``,
    ``vigil_rule``). A broker that fails is logged; the call is never failed for it."""

    def __init__(self, bus: Any, topic: str, *, log: Callable[[str], None] | None = None
                 ) -> None:
        self.bus, self.topic = bus, topic
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    @classmethod
    def from_env(cls) -> StepStream | None:
        """The stream of ``VIGIL_KAFKA_*`` (the deployment topic of ``VIGIL_TOPIC_*``), or
        None where ``VIGIL_KAFKA_BOOTSTRAP_SERVERS`` is unset."""
        import os

        if not os.environ.get("VIGIL_KAFKA_BOOTSTRAP_SERVERS"):
            return None
        from streams.config import KafkaSettings, Topics
        from streams.kafka import KafkaBus

        return cls(KafkaBus(KafkaSettings()), Topics().steps_deployment)

    def publish(self, trajectory: Trajectory, action: Action, result: str,
                check: ActionCheck | None, *, forwarded: bool,
                meta: dict[str, Any] | None = None) -> None:
        from streams.processor import publish_record
        from streams.records import StepEvent

        step = next_step(trajectory.steps[-1] if trajectory.steps else None, trajectory.task,
                         action, result)
        event = StepEvent(trajectory_id=trajectory.trajectory_id, source="deployment",
                          step=step, meta={**(meta or {}), "vigil_forwarded": forwarded,
                                           "vigil_decision": check.decision if check
                                           else "unscreened",
                                           **({"vigil_rule": check.rule}
                                              if check and check.rule else {})})
        try:
            publish_record(self.bus, self.topic, event, key=event.trajectory_id)
            self.bus.flush()
        except Exception as e:  # noqa: BLE001 - the stream is for the later tiers only
            self.log(f"vigil: could not publish the step to the stream ({e})")

    def close(self) -> None:
        self.bus.close()
