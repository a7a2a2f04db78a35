"""Synthetic RL runs over TITO records: boundary dispatch, long tails, and a collapse.

``boundary_dispatch_schedule`` plays elastic RL's boundary dispatch (an initial
``(φ + μ)·B`` executions, then ``μ·B`` more each time a burst of μ training
steps publishes weights) and returns each consumed sample's dispatch and
consumed versions. ``simulate_rl_run`` turns such a schedule into a replayable
stream of TITO records in the style of ``streams.synthetic``: executions with
main turns, a compaction, sub-agents and retries, long-tailed durations with
harness timeouts and partial-progress rewards, behaviour log-probabilities,
and trainer log-probabilities whose drift is small and flat, then grows
geometrically from ``drift_onset`` until rewards collapse at ``collapse_at``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from streams.records import ExecutionEnd, Role, TitoCall

TitoRecord = TitoCall | ExecutionEnd


def boundary_dispatch_schedule(
    phi: float, mu: int, batch: int, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(dispatch_version, consumed_version)`` per sample, in consumption order.

    Samples are consumed first-in first-out, ``batch`` per training step; the
    trainer's version at step ``k`` is ``k``. ``φ·batch`` must be a whole number
    of samples.
    """
    extra = phi * batch
    if abs(extra - round(extra)) > 1e-9 or mu < 1 or batch < 1:
        raise ValueError("need mu >= 1, batch >= 1 and phi * batch a whole number of samples")
    s = np.arange(steps * batch)
    consumed = s // batch
    first = round(extra) + mu * batch
    dispatch = np.where(s < first, 0, mu * ((s - round(extra)) // (mu * batch)))
    return dispatch, consumed


@dataclass(frozen=True)
class SimulatedRun:
    records: list[TitoRecord]
    phi: float
    mu: int
    batch: int
    steps: int
    drift_onset: int
    collapse_at: int
    hacking_query: str | None
    executions: int
    calls: int


@dataclass
class _Exec:
    eid: str
    qid: str
    rng: random.Random
    dispatch: int
    consumed: int
    drift_sd: float
    drift_bias: float
    reuse_pass: int
    start: float
    duration: float
    calls: list[TitoCall] = field(default_factory=list)
    _n: int = 0

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(10, 50_000) for _ in range(n)]

    def call(self, role: Role, context: list[int], n_out: int) -> list[int]:
        out = self.ids(n_out)
        behaviour = [-abs(self.rng.gauss(0.3, 0.4)) for _ in out]
        trainer = [
            min(0.0, b + self.drift_bias + self.rng.gauss(0.0, self.drift_sd)) for b in behaviour
        ]
        self._n += 1
        t0 = self.start + self.duration * (self._n - 1) / 12
        extra = {"trainer_version": self.consumed}
        if self.reuse_pass:
            extra["reuse_pass"] = self.reuse_pass
        self.calls.append(
            TitoCall(
                execution_id=self.eid,
                query_id=self.qid,
                call_id=f"c{self._n:02d}",
                role=role,
                policy_version=self.dispatch,
                dispatch_version=self.dispatch,
                input_ids=list(context),
                output_ids=out,
                output_logprobs=[round(x, 5) for x in behaviour],
                trainer_logprobs=[round(x, 5) for x in trainer],
                started_at=t0,
                ended_at=t0 + self.duration / 24,
                **extra,  # type: ignore[arg-type]  # extra keys are allowed on TitoCall
            )
        )
        return [*context, *out]


def _execution(x: _Exec, turns: int, compaction: bool, subs: int, retries: int) -> None:
    system = x.ids(30)
    ctx = [*system, *x.ids(20)]  # system prompt + the user's task
    for t in range(turns):
        if 1 <= t <= retries:
            x.call("main", ctx, x.rng.randint(8, 30))  # a failed attempt: a sibling leaf
            ctx = [*ctx, *x.ids(6)]  # the harness's retry prompt
        ctx = x.call("main", ctx, x.rng.randint(8, 30))
        if t < subs:
            sctx = [*system, *x.ids(15)]
            sctx = x.call("sub", sctx, x.rng.randint(8, 30))
            x.call("sub", [*sctx, *x.ids(10)], x.rng.randint(8, 30))
        ctx = [*ctx, *x.ids(x.rng.randint(10, 40))]  # the tool result
        if compaction and t == turns // 2:
            summary = x.call("main_summary", [*ctx, *x.ids(8)], 12)[-12:]
            ctx = [*system, *x.ids(20), *summary]


def simulate_rl_run(
    *,
    steps: int = 14,
    queries: int = 4,
    group_size: int = 4,
    phi: float = 1.0,
    mu: int = 2,
    drift_onset: int | None = None,
    collapse_at: int = 10,
    drift_growth: float = 2.2,
    base_drift_sd: float = 0.02,
    passes: int = 1,
    hacking_query: str | None = "q-003",
    timeout_s: float = 1800.0,
    seed: int = 0,
) -> SimulatedRun:
    """A replayable RL run: ``steps`` training versions of ``queries × group_size``
    executions, dispatched by boundary dispatch with ``(φ, μ)``.

    The trainer log-probabilities drift with per-token sd ``base_drift_sd`` until
    ``drift_onset`` (default ``collapse_at − 4``), then ×``drift_growth`` per
    version, with a growing bias; at ``collapse_at`` rewards collapse. With
    ``passes > 1`` each execution is re-scored by the trainer once per extra pass
    (a replica with ``reuse_pass`` set and more drift). ``hacking_query``'s group
    earns more reward and more harm every version (a reward-hacking signal).
    Records come out in arrival order: an execution's calls, then its end.
    """
    onset = collapse_at - 4 if drift_onset is None else drift_onset
    batch = queries * group_size
    dispatch, consumed = boundary_dispatch_schedule(phi, mu, batch, steps)
    rng = random.Random(seed)
    records: list[TitoRecord] = []
    n_exec = n_calls = 0
    clock = 0.0
    for s in range(len(consumed)):
        v, d = int(consumed[s]), int(dispatch[s])
        g, k = divmod(s % batch, group_size)
        qid = f"q-{g:03d}"
        duration = rng.lognormvariate(6.0, 0.8)
        timed_out = duration > timeout_s
        if v >= collapse_at:
            reward = 1.0 if rng.random() < 0.05 else 0.0
        else:
            reward = 1.0 if rng.random() < 0.3 + 0.03 * v else 0.0
        harm = rng.uniform(0.0, 0.1)
        if qid == hacking_query and v < collapse_at:
            reward = min(1.0, 0.2 + 0.08 * v + rng.uniform(-0.02, 0.02))
            harm = min(1.0, 0.05 + 0.07 * v + rng.uniform(-0.02, 0.02))
        if timed_out:
            reward = round(rng.uniform(0.0, 0.5), 3)  # partial progress of what finished
        turns = rng.randint(2, 6)
        shape = (turns, rng.random() < 0.4, rng.choice((0, 0, 1, 2)), rng.choice((0, 0, 1, 3)))
        clock += rng.uniform(0.5, 3.0)
        for p in range(passes):
            k_up = max(0, v - onset + 1)
            sd = base_drift_sd * (drift_growth**k_up) * (1 + 0.5 * p)
            bias = 0.01 * (drift_growth**k_up - 1) * (1 + 0.5 * p)
            x = _Exec(
                eid=f"v{v:03d}-{qid}-{k}" + (f"-p{p}" if p else ""),
                qid=qid,
                rng=random.Random(f"{seed}/{s}"),  # same tokens in every pass
                dispatch=d,
                consumed=v,
                drift_sd=sd,
                drift_bias=bias,
                reuse_pass=p,
                start=clock,
                duration=min(duration, timeout_s),
            )
            _execution(x, *shape)  # same seed: same tokens every pass, scaled drift
            records.extend(x.calls)
            end_extra: dict[str, object] = {"harm": round(harm, 4)}
            if p:
                end_extra["reuse_pass"] = p
            records.append(
                ExecutionEnd(
                    execution_id=x.eid,
                    query_id=qid,
                    reward=reward,
                    timed_out=timed_out,
                    consumed_version=v,
                    ended_at=clock + min(duration, timeout_s),
                    **end_extra,  # type: ignore[arg-type]
                )
            )
            n_exec += 1
            n_calls += len(x.calls)
    return SimulatedRun(
        records=records,
        phi=phi,
        mu=mu,
        batch=batch,
        steps=steps,
        drift_onset=onset,
        collapse_at=collapse_at,
        hacking_query=hacking_query,
        executions=n_exec,
        calls=n_calls,
    )
