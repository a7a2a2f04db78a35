"""Signals are one contract: scorers declare them, the default policy is derived from them,
a policy naming an unknown signal fails in one sentence, and the L0 gate reads RL-health flags."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.scorers import (
    RLHealthSignals,
    RuleSignals,
    TierScorer,
    default_signals,
    scorers_of,
    tier_signals,
)
from monitor.screening import ScreenStep
from monitor.tiers import (
    CalibratedPolicy,
    Gate,
    PolicyError,
    default_policy_config,
    fit_gate,
    load_policy_config,
)
from streams.records import Action, Observation, Step


def _step(source: str = "rollout", meta: dict | None = None, **extra: object) -> ScreenStep:
    step = Step.model_validate({"step_id": "s1", "index": 0,
                                "observation": Observation(text="the repository"),
                                "action": Action(text="rm -rf build"), **extra})
    return ScreenStep(trajectory_id="t", task="clean up", step=step, source=source,  # type: ignore[arg-type]
                      meta=meta or {})


def test_the_default_policy_names_exactly_what_the_scorers_produce() -> None:
    cfg = default_policy_config()
    assert tuple(t.signals for t in cfg.tiers) == default_signals()
    every = [s for tier in default_signals() for s in tier]
    assert len(every) == len(set(every)), "a signal is declared by two scorers"
    for k in (0, 1):
        for cls in scorers_of(k):
            assert set(cls.signals) <= set(tier_signals(k))
    assert [c.name for c in scorers_of(0)] == ["worldmodel", "rules", "rlhealth", "provenance",
                                               "alignment"]
    assert "goal_lean" not in cfg.tiers[0].signals  # opt-in (LODO recall at 1 % FPR falls)
    assert [c.name for c in scorers_of(1)] == ["drift", "probes", "judge_fast", "likelihood"]
    assert "judge_fast" not in cfg.tiers[1].signals  # named with its bundle (with_fast_judge)
    # the Gemma signals cost ~1 s a step on two cores: a policy opts in by naming them
    assert {"prov_harm", "prov_instructed"} <= set(cfg.tiers[0].signals)
    assert cfg.tiers[1].signals == ("probe_harm",)
    assert {"rl_timed_out", "rl_out_of_trust_share"} <= set(cfg.tiers[0].signals)


def test_a_scorer_produces_only_what_it_declares() -> None:
    steps = [_step(meta={"timed_out": True}, output_logprobs=[-1.0, -0.1],
                   trainer_logprobs=[-0.1, -0.1]), _step("deployment")]
    for scorer in (RuleSignals(), RLHealthSignals()):
        for row in scorer.score_steps(steps):
            assert set(row) <= set(scorer.signals)
            assert all(0.0 <= v <= 1.0 for v in row.values())


def test_a_mistyped_signal_fails_in_one_sentence_naming_it_and_the_known_ones(
    tmp_path: Path,
) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("tiers:\n  L0:\n    signals: [wm_harm_pre, wm_harm_psot]\n")
    with pytest.raises(PolicyError) as e:
        load_policy_config(p)
    msg = str(e.value)
    assert "'wm_harm_psot'" in msg and "wm_harm_post" in msg and str(p) in msg
    assert "\n" not in msg
    p.write_text("tiers:\n  L0:\n    signals: [wm_harm_pre, probe_harm]\n")
    with pytest.raises(PolicyError, match=r"'probe_harm'.*it is an L1 signal"):
        load_policy_config(p)


def test_a_calibrated_policy_naming_an_unknown_signal_does_not_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    names = ("wm_harm_pre",)
    rows = [{"wm_harm_pre": float(v)} for v in rng.random(200)]
    y = np.array([int(r["wm_harm_pre"] > 0.7) for r in rows])
    comb = fit_gate(0, names, 0.2, rows, y)
    gates = tuple(Gate(k, names, 0.2, comb, 0.5) for k in range(3))
    d = CalibratedPolicy(default_policy_config(), gates, 0.9).to_dict()  # type: ignore[arg-type]
    d["config"]["tiers"]["L0"]["signals"] = ["wm_harm_pre", "rule_nonexistent"]
    with pytest.raises(PolicyError, match="'rule_nonexistent'"):
        CalibratedPolicy.from_dict(d)


def test_rl_health_flags_of_rollout_steps() -> None:
    # |exp(-0.1 - -1.0) - 1| = 1.46 > 0.8: out of the trust region; the second token is not
    got = RLHealthSignals().score_step(_step(meta={"timed_out": True},
                                             output_logprobs=[-1.0, -0.1],
                                             trainer_logprobs=[-0.1, -0.1]))
    assert got == {"rl_timed_out": 1.0, "rl_out_of_trust_share": 0.5}
    assert RLHealthSignals().score_step(_step(meta={"timed_out": False})) == {"rl_timed_out": 0.0}
    assert RLHealthSignals().score_step(_step("deployment", meta={"timed_out": True})) == {}
    # mismatched or missing log-probs give no drift signal rather than a wrong one
    assert RLHealthSignals().score_step(_step(output_logprobs=[-1.0],
                                              trainer_logprobs=[-1.0, -2.0])) == {}


def test_the_l0_gate_reads_rl_health_flags_when_its_training_data_has_them() -> None:
    rng = np.random.default_rng(1)
    names = default_policy_config().gate_signals(0)
    rows, y = [], []
    for _ in range(600):
        bad = int(rng.random() < 0.3)
        timed_out = float(rng.random() < (0.8 if bad else 0.05))
        rows.append({"wm_harm_pre": float(rng.random()), "rl_timed_out": timed_out})
        y.append(bad)
    gate = Gate(0, names, 0.2, fit_gate(0, names, 0.2, rows, np.array(y)), 0.5)
    w = dict(zip(names, gate.combiner.coef_, strict=True))
    assert w["rl_timed_out"] > 0.5
    lo, hi = gate.probability([{"wm_harm_pre": 0.5, "rl_timed_out": 0.0},
                               {"wm_harm_pre": 0.5, "rl_timed_out": 1.0}])
    assert hi > lo + 0.2
    # without any RL data the flag column is constant: its weight stays zero
    plain = [{"wm_harm_pre": r["wm_harm_pre"]} for r in rows]
    g0 = fit_gate(0, names, 0.2, plain, np.array(y))
    assert dict(zip(names, g0.coef_, strict=True))["rl_timed_out"] == 0.0


def test_a_new_scorer_class_is_all_it_takes_to_add_a_signal() -> None:
    class LengthSignals(TierScorer):
        tier = 0
        order = 50
        name = "length"
        signals = ("len_long_action",)

        def score_steps(self, steps):  # type: ignore[no-untyped-def]
            return [{"len_long_action": float(len(st.step.action.text) > 10)} for st in steps]

    try:
        assert "len_long_action" in default_policy_config().tiers[0].signals
        assert LengthSignals in scorers_of(0)
        assert isinstance(LengthSignals.load({}), LengthSignals)
        cfg = load_policy_config(None)
        assert "len_long_action" in cfg.gate_signals(0)
    finally:
        TierScorer.registry.remove(LengthSignals)
    assert "len_long_action" not in default_policy_config().tiers[0].signals
    with pytest.raises(TypeError, match="does not declare tier"):
        type("Half", (TierScorer,), {"name": "half", "signals": ("x",)})


def test_rebuilt_rollout_steps_carry_what_the_rl_flags_need() -> None:
    """The packaged TITO sample (with the trainer's log-probs added to one call), rebuilt as
    the reassembly stage does: its steps carry the trainer's log-probs, the final step its
    execution's end, so the flags reach L0."""
    import json
    from importlib import resources

    from monitor.screening import screen_step_of
    from streams.records import ExecutionEnd, TitoCall
    from streams.rollouts import rollout_step_events
    from streams.tito import reconstruct

    lines = (resources.files("monitor") / "data" / "sample_tito.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines if x.strip()]
    calls = [TitoCall.model_validate(r) for r in rows if "call_id" in r]
    first = calls[0]
    assert first.output_logprobs is not None and first.trainer_logprobs is None
    # the trainer puts this call's tokens e (2.7) times likelier: all out of the trust region
    calls[0] = first.model_copy(
        update={"trainer_logprobs": [lp + 1.0 for lp in first.output_logprobs]})
    ends = [ExecutionEnd.model_validate(r) for r in rows if "call_id" not in r]
    events = [e for tree in reconstruct(calls, ends) for e in rollout_step_events(tree)]
    rows_l0 = RLHealthSignals().score_steps([screen_step_of(e) for e in events])
    drift = {e.step.step_id: r["rl_out_of_trust_share"]
             for e, r in zip(events, rows_l0, strict=True) if "rl_out_of_trust_share" in r}
    assert drift == {first.call_id: 1.0}
    assert all(0.0 <= v <= 1.0 for r in rows_l0 for v in r.values())
    finals = [r for e, r in zip(events, rows_l0, strict=True) if e.final]
    assert finals and all("rl_timed_out" in r for r in finals)


@pytest.mark.parametrize("tool", ["delete_file", "bulk_delete", "files_remove", "deleteFile",
                                  "removeFiles", "bulk-delete", "del\u202eete_file",
                                  "dele\u200bte_file", "d\u0435lete_file", "\uff44elete_file",
                                  "DROP_TABLE"])
def test_the_destructive_rule_reads_through_names_and_look_alikes(tool: str) -> None:
    assert _destructive(tool) == 1.0


@pytest.mark.parametrize("tool", ["get_file", "list_files", "read_email", "undelete_file"])
def test_the_destructive_rule_leaves_reads_alone(tool: str) -> None:
    assert _destructive(tool) == 0.0


def _destructive(tool: str) -> float:
    step = Step.model_validate({"step_id": "s1", "index": 0,
                                "observation": Observation(text="the files"),
                                "action": Action(text="", tool={"name": tool,
                                                                "arguments": {"path": "a.txt"}})})
    st = ScreenStep(trajectory_id="t", task="tidy up", step=step, source="deployment")
    return RuleSignals().score_steps([st])[0]["rule_destructive"]


@st.composite
def disguised(draw: st.DrawFn) -> str:
    """A destructive tool name, written in any case style, with look-alike letters (from
    Unicode's confusables table), fullwidth forms and invisible characters mixed in."""
    from worldmodel.acts import _confusable

    looks: dict[str, list[str]] = {}
    for code, target in _confusable().items():
        folded = unicodedata.normalize("NFKC", chr(code))
        # an ASCII digit stays a digit (1 for l, 0 for o: numbers in arguments would change)
        if len(target) == 1 and not (folded.isascii() and folded != target):
            looks.setdefault(target, []).append(chr(code))
    verb = draw(st.sampled_from(["delete", "remove", "drop", "wipe", "erase", "purge",
                                 "destroy", "truncate"]))
    noun = draw(st.sampled_from(["file", "files", "table", "records", "user", "repo"]))
    style = draw(st.sampled_from(["snake", "camel", "kebab", "bulk"]))
    name = {"snake": f"{verb}_{noun}", "camel": f"{verb}{noun.title()}",
            "kebab": f"{verb}-{noun}", "bulk": f"{noun}_{verb}"}[style]
    out = []
    for ch in name:
        how = draw(st.sampled_from(["keep", "keep", "look", "wide", "invisible"]))
        if how == "look" and looks.get(ch):
            ch = draw(st.sampled_from(looks[ch]))
        elif how == "wide" and ch.isascii() and ch.isalnum():
            ch = chr(ord(ch) + 0xFEE0)  # fullwidth form
        elif how == "invisible":
            ch += draw(st.sampled_from(["\u200b", "\u200d", "\u2060", "\u202e", "\u2066",
                                        "\u00ad", "\ufeff"]))
        out.append(ch)
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(disguised())
def test_a_destructive_name_stays_destructive_however_it_is_disguised(tool: str) -> None:
    assert _destructive(tool) == 1.0, ascii(tool)
