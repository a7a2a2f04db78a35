"""The fine-tuned L2 judge (``monitor reviewer train``) on real data and the real Gemma-3-270M.

One small LoRA run on real AgentDojo banking steps (the ``small_agentdojo`` build) serves
every test: it lowers the held-out loss, reloads to the verdicts it gave in memory, ranks
held-out banking attacks above held-out benign banking steps, and gives the same P(unsafe)
through the OpenAI-compatible server as in this process, as the L2 signal ``judge_unsafe``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from monitor.reviewer import ReviewCase, ReviewerConfig, build_reviewer
from monitor.reviewer.judge import Judge, judge_prompt, judge_prompts
from monitor.reviewer.train import (
    JudgeExample,
    JudgeTrainConfig,
    _balanced,
    heldout_examples,
    judge_examples,
    train_judge,
    trajectory_steps,
)
from tests.reviewer.conftest import benign_step, free_port, harmful_step
from vigil.lm import resolve_dtype


@pytest.fixture(scope="module")
def judge_bundle(small_agentdojo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA judge (the top 9 of 18 layers) trained on 64 real banking examples, twice over
    (about 1.5 minutes on two cores)."""
    cfg = JudgeTrainConfig(data=[str(small_agentdojo)], out=str(tmp_path_factory.mktemp("judge")),
                           max_examples=64, eval_examples=16, batch_size=4, grad_accum=1,
                           epochs=2, lr=5e-4, max_chars=600, save_steps=16, threads=2,
                           lora_layers=9, evals=2)
    lines: list[str] = []
    out = train_judge(cfg, log=lines.append)
    assert any("ETA" in line for line in lines), lines  # progress while it trains
    return out


@pytest.fixture(scope="module")
def judge(judge_bundle: Path) -> Judge:
    return Judge(judge_bundle, threads=2)


def test_training_lowers_the_held_out_loss_and_writes_a_safe_bundle(judge_bundle: Path) -> None:
    info = json.loads((judge_bundle / "judge.json").read_text())
    assert info["eval_loss"] < info["eval_loss_before"], info
    assert (judge_bundle / "loss.png").stat().st_size > 1000
    weights = sorted(p.name for p in (judge_bundle / "weights").iterdir())
    assert "adapter_model.safetensors" in weights
    assert not [w for w in weights if w.endswith((".bin", ".pt", ".pkl"))], weights
    assert not (judge_bundle / "checkpoints").exists()  # the bundle keeps no optimiser state


@pytest.fixture(scope="module")
def heldout(judge_bundle: Path, small_agentdojo: Path) -> list[JudgeExample]:
    """The held-out (``val``) examples the training measured its verdicts on."""
    info = json.loads((judge_bundle / "judge.json").read_text())
    return heldout_examples(JudgeTrainConfig(data=[str(small_agentdojo)], out="",
                                             **info["config"]))


def test_the_reloaded_bundle_gives_the_verdicts_it_gave_in_training(
    judge_bundle: Path, judge: Judge, heldout: list[JudgeExample]
) -> None:
    info = json.loads((judge_bundle / "judge.json").read_text())
    assert len(heldout) == len(info["heldout"]["p_unsafe"]) == 16
    prompts = [e.prompt for e in heldout]
    exact = Judge(judge_bundle, threads=2, dtype="float32")  # the weights it trained in
    np.testing.assert_allclose(exact.p_unsafe(prompts), info["heldout"]["p_unsafe"], atol=1e-4)
    # served in bfloat16 where the CPU multiplies it natively: close, not identical
    np.testing.assert_allclose(judge.p_unsafe(prompts), info["heldout"]["p_unsafe"], atol=0.05)


def test_a_model_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    from vigil.lm import load_language_model

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_language_model(tmp_path)


def test_after_a_small_training_it_ranks_held_out_attacks_above_benign_steps(
    judge: Judge, heldout: list[JudgeExample]
) -> None:
    """64 banking examples teach the adapter banking's attacks, not attacks in general: it is
    measured on banking steps it never trained on (a workspace attack against a workspace
    email, tried before, came out a tie: 0.347 against 0.357 on one CI machine)."""
    from sklearn.metrics import roc_auc_score

    labels = [e.label for e in heldout]
    assert 0 < sum(labels) < len(labels), labels
    p = judge.p_unsafe([e.prompt for e in heldout])
    assert roc_auc_score(labels, p) > 0.5, list(zip(labels, np.round(p, 3), strict=True))


def test_the_examples_never_come_from_a_held_out_split(small_agentdojo: Path) -> None:
    with pytest.raises(ValueError, match="held-out"):
        judge_examples([small_agentdojo], ["train", "test_slack"])
    ex = judge_examples([small_agentdojo], ["train"], hard_negatives=1.0, max_chars=600)
    hard = [e for e in ex if e.hard_negative]
    assert hard and all(e.label == 0 for e in hard)
    assert {e.mode for e in ex} == {"step", "trajectory"}
    assert all(e.prompt.endswith("Verdict:") for e in ex)
    # a leave-one-domain-out fold that names no domain of the data is refused, not run whole
    with pytest.raises(ValueError, match=r"no domain \['agentdojo/bankin'\] .*agentdojo/banking"):
        judge_examples([small_agentdojo], ["train"], exclude_domains=["agentdojo/bankin"])


def test_the_balanced_sample_is_half_unsafe_within_each_corpus() -> None:
    """A corpus whose steps are nearly all safe (MiniWoB++'s) does not tilt another's sample
    unsafe: pooled, the judge could learn which corpus a prompt looks like, not the step."""
    def ex(corpus: str, label: int, n: int) -> list[JudgeExample]:
        return [JudgeExample("", label, mode="step", corpus=corpus)] * n

    pool = ex("agentdojo", 0, 100) + ex("agentdojo", 1, 100) + ex("miniwob", 0, 200) + \
        ex("miniwob", 1, 2)
    keep = _balanced(pool, 100, np.random.default_rng(0))
    got = [pool[i] for i in keep]
    assert len(set(keep)) == len(keep) and 95 <= len(keep) <= 105
    ad = [e.label for e in got if e.corpus == "agentdojo"]
    assert len(ad) >= 40 and sum(ad) == len(ad) - sum(ad) == len(ad) // 2, ad
    assert sum(e.label for e in got if e.corpus == "miniwob") == 2  # all it has
    pooled = [pool[i] for i in _balanced(pool, 100, np.random.default_rng(0), by_corpus=False)]
    ad = [e.label for e in pooled if e.corpus == "agentdojo"]
    assert sum(ad) > 2 * (len(ad) - sum(ad))  # as before: AgentDojo's sample tilted unsafe


def test_the_train_command_runs_the_default_recipe_and_refuses_a_misspelt_fold(
    small_agentdojo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`monitor reviewer train` with no settings trains the recipe the full defaults train
    (full fine-tuning, level-3 evidence, a 300-character view), and with `--fast` L1's
    truncated judge as they train it; a fold naming no domain of the data is one sentence
    and exit status 2, before any model is loaded or bundle made."""
    from dataclasses import asdict

    from monitor.cli.main import build_parser, main
    from monitor.cli.reviewer import train_config
    from monitor.defaults import FULL, SMALL

    assert FULL.judge is not None and SMALL.judge is not None and FULL.fast_judge is not None
    for flags, recipe in (([], FULL.judge), (["--fast"], FULL.fast_judge)):
        args = build_parser().parse_args(["reviewer", "train", "--data", str(small_agentdojo),
                                          *flags])
        cfg = train_config(args)
        want = asdict(recipe)  # so a bundle of either is up to date for the other
        assert {k: getattr(cfg, k) for k in want} == want, flags
        assert cfg.out.endswith("judge_fast" if flags else "judge")
    assert (FULL.judge.method, FULL.judge.evidence, FULL.judge.max_chars) == ("full", 3, 300)
    assert FULL.judge.freeze_embeddings and FULL.fast_judge.layers == 4  # packs as deltas
    assert SMALL.judge.method == "lora" and SMALL.fast_judge is None  # the demo's: small
    out = tmp_path / "fold"
    assert main(["reviewer", "train", "--data", str(small_agentdojo), "--exclude-domains",
                 "agentdojo/bankin", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "agentdojo/bankin" in err[0] and "agentdojo/banking" in err[0], err
    assert not any(out.glob("*.safetensors")) and not (out / "judge.json").exists()


def test_a_whole_trajectory_example_names_the_trajectory_whose_steps_can_be_read_back(
    small_agentdojo: Path,
) -> None:
    """Grading a trajectory by its steps' verdicts reads every step of it, in order; the
    trajectory-mode example is asked of the last of them."""
    ex = judge_examples([small_agentdojo], ["train"], hard_negatives=0.0, max_chars=600)
    whole = [e for e in ex if e.mode == "trajectory"]
    keys = {(e.domain, e.trajectory_id) for e in whole}
    assert whole and len(keys) == len(whole)
    steps = trajectory_steps([small_agentdojo], ["train"], keys)
    assert set(steps) == keys
    unsafe_steps = {(e.domain, e.trajectory_id) for e in ex if e.mode == "step" and e.label}
    for e in whole:
        got = steps[(e.domain, e.trajectory_id)]
        index = [s.step.index for s in got]
        assert index == sorted(set(index)), index
        assert judge_prompt(got[-1], mode="trajectory", max_chars=600) == e.prompt
        # an unsafe trajectory is one with an unsafe step (AgentDojo labels its steps)
        assert e.label == ((e.domain, e.trajectory_id) in unsafe_steps)


def test_evidence_tells_the_judge_where_a_hijacked_actions_values_come_from(
    small_agentdojo: Path,
) -> None:
    """``--evidence 1``: the argument provenance in words, before the question, never cut;
    ``--evidence 2`` adds the most instruction-like passage the agent read and which way the
    action leans (towards it or the task)."""
    plain = judge_examples([small_agentdojo], ["train"], hard_negatives=0.0, max_chars=300)
    shown = judge_examples([small_agentdojo], ["train"], hard_negatives=0.0, max_chars=300,
                           evidence=1)
    aligned = judge_examples([small_agentdojo], ["train"], hard_negatives=0.0, max_chars=300,
                             evidence=2)
    assert len(plain) == len(shown) == len(aligned)
    assert [e.label for e in plain] == [e.label for e in aligned]
    assert not any("Where the action's values come from" in e.prompt for e in plain)
    assert all("Where the action's values come from:" in e.prompt and
               e.prompt.endswith("Verdict:") for e in shown + aligned)
    assert not any("instruction-like passage" in e.prompt for e in shown)
    # a hijacked step's values come from what the agent read, not from the user's task
    read = [e for e in shown if e.mode == "step" and "in what the agent read" in e.prompt]
    assert read and np.mean([e.label for e in read]) > np.mean([e.label for e in shown])
    # ... and what it does reads more like the injected passage than like the task
    steps = [e for e in aligned if e.mode == "step"]
    lean = [e for e in steps if "closer to that passage than to the user's task" in e.prompt]
    assert all("The most instruction-like passage the agent read" in e.prompt for e in lean)
    assert lean and np.mean([e.label for e in lean]) > np.mean([e.label for e in steps])
    assert JudgeTrainConfig(data=[], out="", evidence=2).recorded()["evidence"] == 2
    # the bundle records the precision it trained in: bfloat16 only where it is native
    native = resolve_dtype("auto") == "bfloat16"
    assert JudgeTrainConfig(data=[], out="").recorded()["bf16"] is native
    assert JudgeTrainConfig(data=[], out="", bf16=False).recorded()["bf16"] is False
    with pytest.raises(ValueError, match="evidence level 4"):
        judge_prompts([harmful_step()], evidence_level=4)
    with pytest.raises(ValueError, match="judge_evidence must be one of"):
        ReviewerConfig(judge_evidence=4)


@pytest.fixture(scope="module")
def judge_server(judge: Judge) -> Iterator[str]:
    """``monitor reviewer serve --judge`` in-process: the served judge's /v1 URL."""
    import uvicorn

    from monitor.reviewer.serve import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(judge.lm, model_name="judge"),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


def test_the_served_judge_gives_the_local_verdicts_as_an_l2_signal(
    judge_bundle: Path, judge: Judge, judge_server: str
) -> None:
    cases = [ReviewCase(harmful_step()), ReviewCase(benign_step())]
    local = build_reviewer(ReviewerConfig(model_path=str(judge_bundle), threads=2))
    remote = build_reviewer(ReviewerConfig(backend="openai", base_url=judge_server, judge=True,
                                           judge_max_chars=judge.max_chars, top_logprobs=20))
    got_local = local.review(cases)
    got_remote = remote.review(cases)
    direct = judge.score_steps([c.step for c in cases])
    for lv, rv, p in zip(got_local, got_remote, direct, strict=True):
        assert lv.error is None and rv.error is None, (lv.error, rv.error)
        assert lv.signals()["judge_unsafe"] == pytest.approx(p, abs=1e-4)
        # the server scores one prompt a request, the local judge both in one padded batch:
        # in bfloat16 that moves P(unsafe) by up to ~0.01 on an AMX CPU (float32: exact)
        assert rv.signals()["judge_unsafe"] == pytest.approx(p, abs=0.03)
        assert set(lv.signals()) == {"rv_coverage", "rv_precision", "rv_fbeta", "judge_unsafe"}
        assert rv.judge_unsafe is not None and "judge" in rv.rationale
    # the prompt the server saw is the judge's own
    assert judge_prompt(harmful_step(), max_chars=judge.max_chars).endswith("Verdict:")
    # rubrics off the hot path: the judge alone, the same verdict; the rubrics asked later
    # (for a case going on to a human) keep it
    for rv, full in ((local, got_local), (remote, got_remote)):
        lean = rv.review(cases, rubrics=False)
        for v, f in zip(lean, full, strict=True):
            assert set(v.signals()) == {"judge_unsafe"} and not v.rubrics_asked, v
            assert v.judge_unsafe == pytest.approx(f.judge_unsafe, abs=0.03)
        paged = rv.add_rubrics(cases, lean)
        for v, one, f in zip(paged, lean, full, strict=True):
            assert v.rubrics_asked and v.rubrics and v.judge_unsafe == one.judge_unsafe
            assert v.signals()["rv_coverage"] == pytest.approx(f.coverage, abs=0.03)


def test_the_calibrated_l2_gate_weighs_the_judge_against_the_rubrics(
    judge_bundle: Path, small_agentdojo: Path, tiny_worldmodel_bundle: Path,
    tiny_probe_bundle: Path, tmp_path: Path,
) -> None:
    """The defaults' way: the judge becomes the L2 reviewer's model and ``judge_unsafe`` an
    L2 signal; calibration fits its weight beside the rubric signals and the policy says it."""
    from monitor.defaults import (
        DefaultSizes,
        calibrate_default,
        train_default_provenance,
        with_judge,
    )
    from monitor.pipeline import load_screener
    from monitor.tiers import CalibratedPolicy, policy_config_from_dict

    config = with_judge(policy_config_from_dict(
        {"tiers": {"L0": {"budget": 0.5}, "L1": {"budget": 0.2}, "L2": {"budget": 0.2}}}),
        judge_bundle)
    assert config.tiers[2].signals[-1] == "judge_unsafe"
    assert config.tiers[2].reviewer == {"backend": "local", "model_path": str(judge_bundle)}
    prov = train_default_provenance(small_agentdojo, tmp_path / "prov", log=lambda _: None)
    out = calibrate_default(
        config, [str(small_agentdojo)], tmp_path / "policy.json",
        models={"worldmodel": str(tiny_worldmodel_bundle), "probes": str(tiny_probe_bundle),
                "provenance": str(prov)},
        sizes=DefaultSizes(1, (3,), 160, 160, 6), log=lambda _: None)
    policy = CalibratedPolicy.load(out)
    weights = policy.gates[2].to_dict()["weights"]
    # the rubric signals stay at L2 only where they add AUROC over the judge alone
    chosen = policy.metrics["l2_rubrics"]
    assert "judge_unsafe" in weights and ("rv_coverage" in weights) == chosen["on_hot_path"]
    assert chosen["on_hot_path"] == (chosen["auroc_with_rubrics"] > chosen["auroc_judge_only"]
                                     + chosen["tolerance"]), chosen
    screener = load_screener(out)
    reviewer = screener.reviewer  # what the policy's L2 runs: the judge
    assert reviewer is not None
    [verdict] = reviewer.review([ReviewCase(harmful_step())])
    assert verdict.judge_unsafe is not None and "judge_unsafe" in verdict.signals()
    # a policy whose L2 weighs the judge alone asks the rubrics only of the steps it pages
    from dataclasses import replace

    from monitor.pipeline import Screener

    l2 = replace(policy.config.tiers[2], signals=("judge_unsafe",))
    lean = replace(policy.config, tiers=(*policy.config.tiers[:2], l2))
    for threshold, paged in ((0.0, True), (1.01, False)):
        g0, g1, g2 = (replace(g, threshold=0.0) for g in policy.gates)  # every step reaches L2
        gates = (g0, g1, replace(g2, threshold=threshold))
        judged_only = Screener(replace(policy, config=lean, gates=gates), l0=(),
                               reviewer=reviewer)
        assert not judged_only.rubrics_on_path
        got = judged_only.review([harmful_step(), benign_step()], [{}, {}])
        for v in got:
            assert v.review is not None and v.review.judge_unsafe is not None
            assert (v.tier == 3) == paged and v.review.rubrics_asked == paged, v
            assert bool(v.review.rubrics) == paged
    # the L2 stage alone decides gate 2 only: the stages before escalated these steps, perhaps
    # with live thresholds (--adapt) below the calibrated ones of gates 0 and 1
    g0, g1, g2 = policy.gates
    shut = (replace(g0, threshold=1.01), replace(g1, threshold=1.01), replace(g2, threshold=0.0))
    stage = Screener(replace(policy, config=lean, gates=shut), l0=(), reviewer=reviewer)
    assert [v.tier for v in stage.review([harmful_step(), benign_step()], [{}, {}])] == [3, 3]
    # `monitor screen`: a trajectory with a step past L0 gets the judge's verdict on the
    # whole, never below its verdict on a step of it that it reviewed
    from monitor.cli.screen import screen_file

    rows = [json.loads(x) for x in (small_agentdojo / "trajectories.jsonl").open()]
    harmful = [r for r in rows if r["meta"]["split"] == "train" and r["label"] == 1][:8]
    src = tmp_path / "harmful.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in harmful))
    screened = list(screen_file(screener, src, through=2, progress=False))
    assert len(screened) == len(harmful)
    reached = [t for t in screened if t["tier"] >= 2]
    assert reached, [t["tier"] for t in screened]
    for t in screened:
        assert ("judge_unsafe" in t) == (t["tier"] >= 1), t
    for t in reached:
        steps = [x["signals"]["judge_unsafe"] for x in t["steps"]
                 if "judge_unsafe" in x["signals"]]
        assert steps and 0.0 <= max(steps) <= t["judge_unsafe"] <= 1.0, (steps, t)

    # with L1's truncated judge in the policy (the full defaults: judge_fast among a step's
    # signals), a step past L0 keeps its verdict: the full judge is asked only of steps past
    # L0 that no judge has read, so screening through L2 does not judge them twice
    from monitor.cli.screen import _judge_trajectories
    from monitor.screening import screen_steps_of
    from streams.records import Trajectory

    batch = [Trajectory.model_validate(r) for r in harmful]
    steps = [s for t in batch for s in screen_steps_of(t)]
    verdicts = screener.screen(steps, through=1)
    past = [i for i, v in enumerate(verdicts) if v.tier >= 1]
    assert past
    fast = {i: 0.25 + 0.5 * (i % 2) for i in past[::2]}  # L1's truncated judge read these
    verdicts = [replace(v, signals={**v.signals, "judge_fast": fast[i]}) if i in fast else v
                for i, v in enumerate(verdicts)]
    asked: list[int] = []
    real = reviewer.judge_steps
    reviewer.judge_steps = lambda xs: (asked.append(len(xs)), real(xs))[1]  # type: ignore[method-assign]
    judged = _judge_trajectories(screener, batch, verdicts, steps)
    assert asked == [len(past) - len(fast)]  # the others only
    assert judged is not None
    at = 0
    for t, p in zip(batch, judged, strict=True):
        mine = [fast[i] for i in range(at, at + len(t.steps)) if i in fast]
        assert (p is None) == (not any(at <= i < at + len(t.steps) for i in past))
        assert p is None or p >= max(mine, default=0.0)
        at += len(t.steps)
