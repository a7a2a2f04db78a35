"""`monitor screen` (batch screening, DESIGN §2.1) and `monitor calibrate` (the tier policy)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import vigil.paths

if TYPE_CHECKING:
    from monitor.pipeline import Screener, StepVerdict
    from monitor.trajectory import TrajectoryAggregation
    from streams.records import Trajectory


def trajectory_line(
    traj: Trajectory,
    verdicts: list[StepVerdict],
    aggregation: TrajectoryAggregation | None = None,
) -> dict[str, Any]:
    """One output line of ``monitor screen`` (DESIGN §2.1).

    The trajectory's ``score`` and ``flagged`` aggregate its steps' written scores and flags
    (:func:`monitor.trajectory.aggregate`; ``aggregation=None``: highest step score, any
    step flagged).
    """
    from monitor.trajectory import aggregate

    steps = [v.to_json() for v in verdicts]
    score, flagged = aggregate(
        [s["score"] for s in steps], [s["flagged"] for s in steps], aggregation
    )
    return {
        "trajectory_id": traj.trajectory_id,
        "score": score,
        "flagged": flagged,
        "tier": max((v.tier for v in verdicts), default=0),
        "steps": steps,
    }


def _judge_trajectories(
    screener: Screener, batch: list[Trajectory], verdicts: list[StepVerdict], steps: list[Any]
) -> list[float | None] | None:
    """The fine-tuned judge's verdict on each whole trajectory of ``batch`` that has a step
    past L0, when the screener's reviewer is a judge; else None: the largest of its step
    verdicts over the trajectory's steps past L0 (those L2 reviewed keep their verdict; the
    others are asked the step question now, all together). A trajectory is unsafe when
    some action was, and a step is judged by what it did: the judge's trajectory question,
    asked at the last step of a view cut to a few hundred characters, flags a run that read
    a planted instruction as often as one that acted on it (``bench/results/
    judge_read_only.json``), so it is not asked here. Every step L0 did not clear (about a
    fifth of benign steps at the default budget) has a judge's verdict, so a harm the step
    gates rank low on traffic unlike their training data still meets a judge: where L1 ran
    the truncated judge (``judge_fast``, the full defaults) its verdict is that step's, and
    the full judge is asked only of steps past L0 that neither judge has read."""
    reviewer = screener.reviewer
    if reviewer is None or not getattr(reviewer, "judged", False):
        return None
    todo: list[int] = []  # steps past L0 the judge has not read yet
    known: dict[int, float] = {}
    for i, v in enumerate(verdicts):
        if v.tier < 1:
            continue
        if v.review is not None and v.review.judge_unsafe is not None:
            known[i] = v.review.judge_unsafe
        elif "judge_fast" in v.signals:  # L1's truncated judge read it already
            known[i] = float(v.signals["judge_fast"])
        else:
            todo.append(i)
    for i, p in zip(todo, reviewer.judge_steps([steps[i] for i in todo]), strict=True):
        if p is not None:
            known[i] = p
    out: list[float | None] = []
    i = 0
    for t in batch:
        mine = [known[j] for j in range(i, i + len(t.steps)) if j in known]
        out.append(max(mine) if mine else None)
        i += len(t.steps)
    return out


def screen_batch(screener: Screener, batch: list[Trajectory], through: int
                 ) -> list[dict[str, Any]]:
    """The output lines of ``batch``'s trajectories: their steps scored together."""
    from monitor.screening import screen_steps_of

    steps = [s for t in batch for s in screen_steps_of(t)]
    verdicts = screener.screen(steps, through=through) if steps else []
    judged = _judge_trajectories(screener, batch, verdicts, steps) if through >= 2 else None
    agg = screener.policy.trajectory
    live = screener.live
    thr = None if live is None else live.trajectory_threshold()
    if agg is not None and thr is not None:  # --adapt: the live trajectory threshold
        from dataclasses import replace

        agg = replace(agg, threshold=thr)
    lines, i = [], 0
    for k, t in enumerate(batch):
        line = trajectory_line(t, verdicts[i : i + len(t.steps)], agg)
        p = judged[k] if judged is not None else None
        if p is not None:
            line["judge_unsafe"] = round(p, 6)  # as the steps' signals are
        lines.append(line)
        i += len(t.steps)
    if live is not None:  # a run a step pages is flagged already: it spends the budget too
        from dashboards.canary import is_canary

        # a harmful canary run sets the recall floor; a benign canary replays training runs
        kinds = [("canary" if t.harmful else "replay") if is_canary(t.meta) else "real"
                 for t in batch]
        live.observe_trajectories([PAGED if any(s["flagged"] for s in line["steps"]) and
                                   kind == "real" else line["score"]
                                   for line, kind in zip(lines, kinds, strict=True)], kinds)
    return lines


def _batches(path: Path, batch_steps: int) -> Iterator[list[Trajectory]]:
    """``path``'s trajectories in batches of about ``batch_steps`` steps, read as needed: a
    first batch of 16 steps doubling up to ``batch_steps`` (the first lines come out while
    the models warm up)."""
    from monitor.screening import absolute_screens
    from streams.records import Trajectory, read_jsonl

    pending: list[Trajectory] = []
    n_pending = 0
    size = min(16, batch_steps)
    for t in read_jsonl(path, Trajectory, rejected=lambda *_: None):  # counted before
        pending.append(absolute_screens(t, path.parent))
        n_pending += len(t.steps)
        if n_pending >= size:
            yield pending
            pending, n_pending = [], 0
            size = min(2 * size, batch_steps)
    if pending:
        yield pending


# --workers: each worker process holds its own screener (loaded once, by _worker_start)
_WORKER: dict[str, Any] = {}


def _worker_start(policy: str, reviewer: bool, threads: int) -> None:
    import torch

    from monitor.pipeline import load_screener

    torch.set_num_threads(threads)
    _WORKER["screener"] = load_screener(policy, reviewer=reviewer)


def _worker_screen(batch: list[Trajectory], through: int) -> list[dict[str, Any]]:
    return screen_batch(_WORKER["screener"], batch, through)


def _screen_in_workers(policy: str, path: Path, *, workers: int, reviewer: bool,
                       batch_steps: int, through: int) -> Iterator[list[dict[str, Any]]]:
    """Batches screened by ``workers`` processes (each with its own models and
    ``cores / workers`` torch threads), yielded in input order; at most two batches per
    worker are read ahead, so memory does not grow with the file."""
    import multiprocessing as mp
    import os
    from collections import deque
    from concurrent.futures import Future, ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    ctx = mp.get_context("spawn")  # no forked torch thread pools
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_start,
                             initargs=(policy, reviewer, threads)) as pool:
        ahead: deque[Future[list[dict[str, Any]]]] = deque()
        for batch in _batches(path, batch_steps):
            ahead.append(pool.submit(_worker_screen, batch, through))
            if len(ahead) >= 2 * workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def screen_file(
    screener: Screener | None,
    path: Path,
    *,
    batch_steps: int = 256,
    through: int = 2,
    progress: bool = True,
    total: int | None = None,
    workers: int = 1,
    policy: str | Path | None = None,
) -> Iterator[dict[str, Any]]:
    """Screen every trajectory of ``path``, yielding output lines in input order.

    The file is read as it is screened (memory does not grow with its size); steps of
    several trajectories are scored together, ``batch_steps`` at a time after a first batch
    of 16 that doubles up to it (so the first lines come out while the models warm up).
    ``total``: the file's step count, for the progress bar's ETA. ``workers > 1``: the
    batches go to that many processes, each loading ``policy`` itself (``screener`` is
    then unused and may be None).
    """
    from monitor.progress import Progress

    if workers > 1:
        if policy is None:
            raise ValueError("screening in worker processes needs the policy's path")
        results: Iterator[list[dict[str, Any]]] = _screen_in_workers(
            str(policy), path, workers=workers, reviewer=through >= 2,
            batch_steps=batch_steps, through=through)
    elif screener is None:
        raise ValueError("screen_file needs a screener (or workers > 1 and a policy)")
    else:
        results = (screen_batch(screener, b, through) for b in _batches(path, batch_steps))
    with Progress(f"screening {path}", total=total, stream=sys.stderr, unit="step") as bar:
        for lines in results:
            yield from lines
            if progress:
                bar.advance(sum(len(line["steps"]) for line in lines))


def _otlp_as_trajectories(src: Path, args: argparse.Namespace) -> Path:
    """``src`` itself, or, when it holds OpenTelemetry traces (OTLP JSON), their
    trajectories written beside the output (:mod:`monitor.integrations.otlp`)."""
    from monitor.integrations.otlp import read_otlp_file, sniff_otlp, trajectories_from_otlp

    if not sniff_otlp(src):
        return src
    runs = trajectories_from_otlp(read_otlp_file(src),
                                  warn=lambda m: print(f"{src}: {m}", file=sys.stderr))
    if not runs:
        raise ValueError(f"{src}: OTLP traces without a tool span (execute_tool, or an "
                         "OpenInference TOOL span): nothing to screen")
    out = Path(f"{args.out or src.name}.trajectories.jsonl")
    out.write_text("".join(t.model_dump_json() + "\n" for t in runs))
    print(f"{src}: {len(runs)} traces with tool calls, as trajectories in {out}",
          file=sys.stderr)
    return out


# what the live trajectory threshold sketches for a run a step pages: above every score, so
# such runs spend the budget before any is flagged by its score
PAGED = 2.0
# the exit status of a `monitor screen` run that set some unreadable lines aside, and how
# much of each such line its rejects file keeps
REJECTED_EXIT, REJECT_HEAD = 3, 1024


def cmd_screen(args: argparse.Namespace) -> int:
    """``monitor screen``: every trajectory of a file through the tiers, one line each."""
    from monitor.pipeline import load_screener
    from streams.records import Trajectory, read_jsonl

    src = Path(args.file)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file")
    src = _otlp_as_trajectories(src, args)
    count = total = 0  # a file with nothing to screen fails before any model is loaded
    bad: list[dict[str, Any]] = []  # lines that cannot be read: set aside, the rest screened

    def reject(n: int, raw: bytes, e: Exception) -> None:
        line = raw.rstrip(b"\r\n")
        bad.append({"line": n, "error": str(e), "bytes": len(line),
                    "head": line[:REJECT_HEAD].decode("utf-8", "backslashreplace")})

    for t in read_jsonl(src, Trajectory, rejected=None if args.strict else reject):
        count += 1
        total += len(t.steps)
    if count == 0:
        if bad:
            raise ValueError(f"{src}: no line could be read as a trajectory ({len(bad)} "
                             f"rejected; first, {bad[0]['error']})")
        raise ValueError(f"{src}: no trajectories (the file is empty or only blank lines)")
    rejects = Path(args.rejects or (f"{args.out}.rejected.jsonl" if args.out else
                                    f"{src.name}.rejected.jsonl"))
    if bad:
        with rejects.open("w") as f:
            f.writelines(json.dumps(b) + "\n" for b in bad)
        print(f"{src}: {len(bad)} line(s) could not be read and are not screened (first, "
              f"{bad[0]['error']}); each is in {rejects} with its reason", file=sys.stderr)
    from monitor.defaults import ensure_policy

    policy = ensure_policy(args.policy)  # home, else shipped, else built once
    print(f"screening with {policy}", file=sys.stderr)
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    if args.workers > 1 and args.adapt:
        raise ValueError("--adapt needs --workers 1: the live gates learn from the whole "
                         "stream in order, which several processes would each see a part of")
    screener = (load_screener(policy, reviewer=not args.no_review) if args.workers == 1
                else None)
    if args.adapt and screener is not None:
        from monitor.adaptive import LiveGates

        screener.live = LiveGates(screener.policy, window=args.adapt_window,
                                  trajectory_window=args.adapt_trajectory_window)
    through = 1 if args.no_review else 2
    out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115
    t0 = time.perf_counter()
    n = flagged = steps = 0
    tiers = [0, 0, 0, 0]
    try:
        for line in screen_file(screener, src, batch_steps=args.batch_steps, through=through,
                                total=total, workers=args.workers, policy=policy):
            out.write(json.dumps(line) + "\n")
            out.flush()
            n += 1
            flagged += line["flagged"]
            for s in line["steps"]:
                steps += 1
                tiers[s["tier"]] += 1
    finally:
        if out is not sys.stdout:
            out.close()
    dt = time.perf_counter() - t0
    print(
        f"screened {n} trajectories ({steps} steps) in {dt:.1f} s; {flagged} flagged; steps by "
        f"highest tier L0 {tiers[0]}, L1 {tiers[1]}, L2 {tiers[2]}, L3 {tiers[3]}"
        + (f"; wrote {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    if screener is not None and screener.live is not None:
        for name, g in zip(("L0->L1", "L1->L2", "L2->L3"), screener.live.status(), strict=True):
            print(f"adapted gate {name}: threshold {g['calibrated']:.4f} -> {g['threshold']:.4f} "
                  f"(passes {g['window_share']:.1%} of the last {g['seen']} scores reaching it; "
                  f"target {g['target_share']:.1%})", file=sys.stderr)
        tg = screener.live.trajectory_status()
        if tg is not None:
            floor = (f"; canaries' recall floor stops it at {tg['ceiling']:.4f}, "
                     f"{tg['canaries_seen']:.0f} harmful canary runs"
                     if tg["canaries_seen"] else "")
            print(f"adapted trajectory threshold: {tg['calibrated']:.4f} -> "
                  f"{tg['threshold']:.4f} (flags {tg['window_share']:.1%} of the last "
                  f"{tg['seen']} trajectories; target {tg['target_share']:.1%}{floor})",
                  file=sys.stderr)
    return REJECTED_EXIT if bad else 0


def _refit_out(args: argparse.Namespace, policy: Path) -> Path:
    """Where a re-fitted policy goes: ``--out``, else ``$VIGIL_HOME/models/policy.json`` where
    none is yet; never over the policy it starts from."""
    out = Path(args.out) if args.out else vigil.paths.policy()
    if out.resolve() == Path(policy).resolve() or not args.out and out.exists():
        raise ValueError(f"{out} exists: name where the re-fitted policy goes with --out "
                         "(the policy it starts from is kept)")
    return out


def _write_refit(refit: Any, out: Path, report: list[str]) -> int:
    """Save a re-fitted policy and print what changed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    refit.save(out)
    for line in report:
        print(line, file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _calibrate_benign(args: argparse.Namespace) -> int:
    """``monitor calibrate --benign FILE``: the policy's thresholds re-fitted to the user's
    known-good runs (:mod:`monitor.benign`), models and weights kept."""
    from monitor.benign import MIN_BENIGN_STEPS, describe, refit_thresholds
    from monitor.defaults import ensure_policy
    from monitor.pipeline import load_screener
    from streams.records import Trajectory, read_jsonl

    src = Path(args.benign)
    if not src.exists():
        raise FileNotFoundError(f"{src}: no such file")
    runs = list(read_jsonl(src, Trajectory))  # a bad line: one sentence, before any model
    benign = sum(s.label != 1 for t in runs for s in t.steps)
    if benign < MIN_BENIGN_STEPS:
        raise ValueError(f"{src}: {benign} benign steps; re-fitting the thresholds needs at "
                         f"least {MIN_BENIGN_STEPS} (a 1 % budget of fewer rests on one or "
                         "two scores)")
    policy = ensure_policy(args.policy)
    out = _refit_out(args, policy)
    print(f"re-fitting the thresholds of {policy} on {src}", file=sys.stderr)
    screener = load_screener(policy, reviewer=not args.no_review)
    refit, report = refit_thresholds(screener, runs, source=str(src))
    return _write_refit(refit, out, describe(report))


def _calibrate_runs(args: argparse.Namespace) -> int:
    """``monitor calibrate --runs FILE...``: the policy's trajectory verdict re-fitted on
    labelled runs (:mod:`monitor.trajectory_fit`), everything else kept."""
    from monitor.defaults import ensure_policy
    from monitor.pipeline import load_screener
    from monitor.trajectory_fit import describe, pick_runs, read_runs, refit_trajectory, score_runs

    if args.split and args.split.startswith("test"):
        raise ValueError(f"--split {args.split}: test splits are held out; fit on train or val")
    # every file read (a bad line: one sentence) before any model
    pairs = [p for name in args.runs for p in read_runs(Path(name), args.split)]
    by = pick_runs(pairs, max_runs=args.max_runs)
    if not by:
        raise ValueError(f"no runs in {' '.join(args.runs)}"
                         + (f" with meta.split {args.split!r}" if args.split else ""))
    policy = ensure_policy(args.policy)
    out = _refit_out(args, policy)
    print(f"re-fitting the trajectory verdict of {policy} on {sum(map(len, by.values()))} "
          f"runs of {len(by)} domains", file=sys.stderr)
    screener = load_screener(policy, reviewer=not args.no_review)
    scored = {d: score_runs(screener, d, ts, through=1 if args.no_review else 2)
              for d, ts in by.items()}
    refit, report = refit_trajectory(screener.policy, scored, form=args.form,
                                     threshold_by=args.threshold_by,
                                     source=" ".join(Path(n).name for n in args.runs))
    return _write_refit(refit, out, describe(report))


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``monitor calibrate``: fit the tier policy (``--defaults``: build what is missing first)."""
    from monitor.defaults import FULL, SMALL, calibrate_default, prepare_defaults
    from monitor.tiers import load_policy_config

    if args.benign and args.runs:
        raise ValueError("--benign and --runs re-fit different parts; run them one at a time")
    if args.benign:
        return _calibrate_benign(args)
    if args.runs:
        return _calibrate_runs(args)
    config = load_policy_config(args.config)
    if args.defaults:
        prepare_defaults(small=args.small, config=config)
        return 0
    models = {
        "worldmodel": str(
            args.worldmodel or config.model("worldmodel") or vigil.paths.worldmodel_bundle()
        ),
        "probes": str(args.probes or config.model("probes") or vigil.paths.probes_bundle()),
    }
    data = args.data or [str(vigil.paths.dataset("agentdojo"))]
    out = Path(args.out) if args.out else vigil.paths.policy()
    calibrate_default(
        config,
        data,
        out,
        models=models,
        sizes=SMALL if args.small else FULL,
        reviewer=not args.no_review,
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Add ``screen`` and ``calibrate`` to the ``monitor`` command line."""
    p = sub.add_parser(
        "screen",
        help="screen a JSON Lines file of trajectories offline (all tiers but the human)",
        description=(
            "Screen every step of every trajectory with the calibrated tiers: L0 on every "
            "step, L1 on what L0 escalates, the L2 reviewer on what L1 escalates. Writes one "
            'line per trajectory: {"trajectory_id", "score", "flagged", "tier", "steps": '
            '[{"step_id", "score", "flagged", "tier", "signals"}]}; tier 3 means a human '
            "would have been paged. A trajectory's score is the policy's calibrated "
            "aggregation of its step scores, flagged when it reaches the trajectory threshold "
            "or any step is flagged (a policy without a trajectory section: the highest step "
            "score, flagged when a step is). Without --policy: $VIGIL_HOME/models/policy.json "
            "where one was calibrated, else the default models shipped with vigil (no "
            "training), else the defaults built once (with progress)."
        ),
        epilog="examples:\n  monitor screen runs.jsonl --out screened.jsonl\n"
        "  monitor screen runs.jsonl --policy my-policy.json --no-review",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="trajectories, one a line (DESIGN §2.1)")
    p.add_argument("--out", help="output JSON Lines (default: standard output)")
    p.add_argument("--rejects", metavar="FILE",
                   help="where lines that cannot be read go, one JSON object each with the "
                   "line number, the reason, the line's size and its first KB (default: "
                   "OUT.rejected.jsonl, or FILE.rejected.jsonl in the working directory "
                   "without --out); the rest is screened and the exit status is 3")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first line that cannot be read (exit status 2, nothing "
                   "screened)")
    p.add_argument("--policy", help="calibrated policy (default: $VIGIL_HOME/models/policy.json)")
    p.add_argument("--no-review", action="store_true", help="stop after L1 (no L2 reviewer)")
    p.add_argument("--batch-steps", type=int, default=256, help="steps scored together")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="screen in N processes, each with its own models and cores/N torch "
                   "threads (default 1; more where there are more cores; memory grows "
                   "with N)")
    p.add_argument("--adapt", action="store_true",
                   help="move each gate's threshold, and the trajectory threshold, to hold "
                   "its budget on this file's own score distribution (sliding-window "
                   "quantile sketch; never below the recall the calibrated threshold gives "
                   "canary steps)")
    p.add_argument("--adapt-window", type=int, default=20_000, metavar="STEPS",
                   help="the window of latest scores each gate keeps (default 20000)")
    p.add_argument("--adapt-trajectory-window", type=int, default=2_000, metavar="RUNS",
                   help="with --adapt, the trajectory threshold flags its budget of the "
                   "latest RUNS trajectory scores (default 2000; it moves after a quarter "
                   "of them, at most 200)")
    p.set_defaults(fn=cmd_screen)

    c = sub.add_parser(
        "calibrate",
        help="fit the tier policy's gates and budgets",
        description=(
            "Fit each escalation gate by non-negative logistic stacking of the signals known "
            "at it (train split) and set its threshold so the gate passes its budget of "
            "benign validation steps. Held-out test splits are never read."
        ),
        epilog="examples:\n  monitor calibrate --defaults          # build all default models\n"
        "  monitor calibrate --config policy.yaml --out policy.json\n"
        "  monitor calibrate --benign our-runs.jsonl --out ours.json   # your traffic's "
        "thresholds",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--config", help="policy YAML (default: the built-in defaults)")
    c.add_argument("--out", help="where to write (default: $VIGIL_HOME/models/policy.json)")
    c.add_argument("--data", nargs="+", help="datasets (default: $VIGIL_HOME/data/agentdojo)")
    c.add_argument("--worldmodel", help="world-model bundle")
    c.add_argument("--probes", help="probe bundle")
    c.add_argument("--no-review", action="store_true", help="fit without the L2 reviewer")
    c.add_argument("--small", action="store_true", help="small models and samples (demo)")
    c.add_argument(
        "--defaults",
        action="store_true",
        help="build whatever default data and models are missing, then calibrate",
    )
    c.add_argument("--benign", metavar="FILE",
                   help="your own known-good runs (trajectories, one a line): keep --policy's "
                   "models and weights, move only its thresholds to hold each budget on "
                   "these runs, write the result to --out and report what changed")
    c.add_argument("--runs", nargs="+", metavar="FILE",
                   help="labelled runs (trajectories with label 0 or 1, one a line): keep "
                   "--policy's models, gates and step thresholds, re-fit only its trajectory "
                   "verdict (form, weights, threshold at the trajectory budget of the benign "
                   "runs) on these runs screened with it; with two domains or more, report "
                   "each form on each domain left out")
    c.add_argument("--split", help="with --runs: only runs whose meta.split is this")
    c.add_argument("--max-runs", type=int, default=120, metavar="N",
                   help="with --runs: at most N runs a domain (an AgentDojo suite, a corpus, "
                   "or a file), harmful and benign in proportion (default 120)")
    c.add_argument("--form", default="null", choices=["legacy", "max", "null", "null_max"],
                   help="with --runs: the trajectory verdict's form (default null: "
                   "length-aware, see monitor.trajectory)")
    c.add_argument("--threshold-by", choices=["pooled", "domain"], default="domain",
                   help="with --runs: the trajectory threshold flags at most its budget of "
                   "each domain's benign runs (domain, the default: the highest of their "
                   "thresholds, over domains with 20 benign runs or more), or of all the "
                   "benign runs together (pooled)")
    c.add_argument("--policy", help="with --benign or --runs: the policy to start from "
                   "(default: as monitor screen picks it)")
    c.set_defaults(fn=cmd_calibrate)
