"""Learning harm from trajectory labels (MIL), and harm heads blind to tool identity.

On a small real ToolEmu subset (split by case, never one case on both sides): training
lowers the held-out trajectory loss; the noisy-OR loss is what its docstring says; an
action that differs only in its tool's name reaches the harm heads as the same input,
the bundle records that and its scorer applies it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression

from worldmodel.datasets.format import View, read_transitions
from worldmodel.encoders import TextEncoder, text_key
from worldmodel.features import StepInput, mask_action, mask_tool, tabulate
from worldmodel.mil import MILLogisticRegression, bag_loss, harm_loss
from worldmodel.model import JEPA, JEPAConfig
from worldmodel.score import WorldModelScorer, load_weights
from worldmodel.train import TrainConfig, load_rows, predict, prepare, train

SMALL = JEPAConfig(
    latent_dim=32, hidden_dim=64, history=2, predictor_layers=1, predictor_heads=2,
    use_images=False,
)  # fmt: skip
CASES_PER_GROUP = 3
AGENTS = 12


@pytest.fixture(scope="module")
def toolemu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ToolEmu build from 3 cases per domain x 12 agent models (~108 runs)."""
    from worldmodel.datasets.toolemu.build import build_toolemu, default_source

    src = default_source()
    assert src.is_file(), f"no ToolEmu source at {src} (set $VIGIL_TOOLEMU)"
    runs = [json.loads(line) for line in src.open()]
    agents = sorted({r["meta"]["agent_model"] for r in runs})[:AGENTS]
    by_case: dict[int, list[dict]] = {}
    for r in runs:
        if r["meta"]["agent_model"] in agents:
            by_case.setdefault(r["meta"]["case_idx"], []).append(r)
    # the builder splits by case within each domain: take cases whose domain and split vary
    tmp = tmp_path_factory.mktemp("toolemu")
    full = build_toolemu(tmp / "full", source=src, progress=False)
    picked: list[int] = []
    for group in full.builder_args["groups"].values():
        picked += group["case_idx"][:CASES_PER_GROUP]
    source = tmp / "subset.jsonl"
    with source.open("w") as f:
        for c in picked:
            for r in by_case[c]:
                f.write(json.dumps(r) + "\n")
    out = tmp / "data"
    build_toolemu(out, source=source, val_fraction=0.34, progress=False)
    return out


@pytest.fixture(scope="module")
def text_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("textcache")


@pytest.fixture(scope="module")
def bundle(toolemu: Path, text_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wm") / "toolemu"
    train(
        TrainConfig(data=[str(toolemu)], out=str(out), epochs=6, batch_size=32, lr=3e-3,
                    text_cache=str(text_cache), model=replace(SMALL)),
        log=lambda _: None,
    )  # fmt: skip
    return out


def _trajectory_bce(logits: np.ndarray, bags: np.ndarray, labels: np.ndarray) -> float:
    """Mean BCE of the noisy-OR pooled step scores against the trajectory labels."""
    _, index = np.unique(bags, return_inverse=True)
    k = int(index.max()) + 1
    y = np.zeros(k)
    y[index] = labels
    loss = bag_loss(torch.from_numpy(logits).double(), torch.from_numpy(index), k,
                    torch.from_numpy(y))  # fmt: skip
    return float(loss.mean())


def test_the_split_never_puts_a_case_on_both_sides(toolemu: Path) -> None:
    cases = {s: {t.meta["case_idx"] for t in read_transitions(toolemu, [s])} for s in
             ("train", "val")}  # fmt: skip
    assert cases["train"] and cases["val"] and not cases["train"] & cases["val"]
    assert all(t.meta["label_level"] == "trajectory" for t in read_transitions(toolemu))


def test_mil_training_lowers_the_held_out_trajectory_loss(
    bundle: Path, toolemu: Path, text_cache: Path
) -> None:
    rows, bases = load_rows([str(toolemu)], ("val",))
    config = JEPAConfig.from_dict(json.loads((bundle / "config.json").read_text())["model"])
    prep = prepare(rows, bases, TextEncoder(cache_dir=text_cache), config, mask_tools=True)
    held = np.arange(len(rows))
    assert (prep.bags >= 0).all() and len(np.unique(prep.bags)) > 20
    trained = load_weights(JEPA(config), bundle)
    torch.manual_seed(0)
    initial = JEPA(config)
    for head in ("harm_pre", "harm_post"):
        before = _trajectory_bce(predict(initial, prep.tables, held, config)[head], prep.bags,
                                 prep.labels)  # fmt: skip
        after = _trajectory_bce(predict(trained, prep.tables, held, config)[head], prep.bags,
                                prep.labels)  # fmt: skip
        assert after < before - 0.05, (head, before, after)
    metrics = json.loads((bundle / "metrics.json").read_text())
    assert metrics["train_trajectory_labelled"] > 50
    assert metrics["val"]["harm_auroc_pre"] is None  # no step is labelled on its own
    assert 0.0 <= metrics["val"]["harm_auroc_trajectory_pre"] <= 1.0


def test_noisy_or_loss_is_per_step_for_a_safe_trajectory_and_pooled_for_an_unsafe_one() -> None:
    logits = torch.tensor([4.0, -5.0, -5.0, -6.0], requires_grad=True)
    one = torch.zeros(4, dtype=torch.long)
    naive_safe = F.binary_cross_entropy_with_logits(logits, torch.zeros(4), reduction="sum")
    safe = bag_loss(logits, one, 1, torch.tensor([0.0]))[0]
    assert safe.item() == pytest.approx(naive_safe.item(), rel=1e-5)  # every step is safe
    # an unsafe run whose one harmful step is already found: low loss, where labelling
    # every step unsafe calls the three harmless steps errors
    unsafe = bag_loss(logits, one, 1, torch.tensor([1.0]))[0]
    naive = F.binary_cross_entropy_with_logits(logits, torch.ones(4), reduction="sum")
    assert unsafe.item() < 0.05 and naive.item() > 15
    (grad,) = torch.autograd.grad(unsafe, logits)
    (naive_grad,) = torch.autograd.grad(naive, logits)
    assert grad.abs().max() < 0.05  # nothing left to push
    assert (naive_grad[1:] < -0.9).all()  # naive labelling pushes every harmless step up
    # no step looks harmful yet: the credit goes to the likeliest step, by its probability
    low = torch.tensor([-1.0, -3.0, -6.0], requires_grad=True)
    (g,) = torch.autograd.grad(bag_loss(low, one[:3], 1, torch.tensor([1.0]))[0], low)
    assert g[0] < g[1] < g[2] < 0 and abs(g[2]) < 0.05 * abs(g[0])
    # max pooling: only the top step learns
    m = torch.tensor([-1.0, -3.0, -6.0], requires_grad=True)
    (gm,) = torch.autograd.grad(bag_loss(m, one[:3], 1, torch.tensor([1.0]), pool="max")[0], m)
    assert gm[0] < 0 and gm[1] == 0 and gm[2] == 0
    # a batch mixes step-labelled rows (bag -1) and bags; each is one example of the mean
    mixed = harm_loss(torch.tensor([2.0, -2.0, 4.0, -5.0]), torch.tensor([1.0, 0.0, 1.0, 1.0]),
                      torch.tensor([-1, -1, 7, 7]))  # fmt: skip
    steps = F.binary_cross_entropy_with_logits(torch.tensor([2.0, -2.0]), torch.tensor([1.0, 0.0]),
                                               reduction="sum")  # fmt: skip
    pooled = bag_loss(torch.tensor([4.0, -5.0]), one[:2], 1, torch.tensor([1.0]))[0]
    assert mixed.item() == pytest.approx(((steps + pooled) / 3).item(), rel=1e-5)


def test_mil_logistic_regression_is_an_estimator_and_without_bags_is_logistic_regression(
    bundle: Path, toolemu: Path, text_cache: Path
) -> None:
    rows, bases = load_rows([str(toolemu)], ("train", "val"))
    prep = prepare(rows, bases, TextEncoder(cache_dir=text_cache), SMALL, mask_tools=True)
    assert prep.tables.rel is not None
    x = prep.tables.rel
    y = prep.labels
    plain = MILLogisticRegression(C=0.5).fit(x, y)
    ref = LogisticRegression(C=0.5, class_weight="balanced", max_iter=10_000, tol=1e-10)
    ref.fit(x, y)
    np.testing.assert_allclose(plain.coef_, ref.coef_[0], rtol=1e-3, atol=1e-3)
    # trajectory labels only: y unknown (NaN) on every row, the runs' labels by bag
    bags = [t.trajectory_id for t in rows]
    labels = {t.trajectory_id: t.label for t in rows}
    est = MILLogisticRegression(C=0.5)
    assert est.fit(x, np.full(len(rows), np.nan), bags, labels) is est
    twin = clone(est)
    assert twin.get_params() == est.get_params() and not hasattr(twin, "coef_")
    with pytest.raises(RuntimeError, match="not fitted"):
        twin.predict_proba(x)
    ids, p = est.predict_bag_proba(x, bags)
    assert len(ids) == len(labels) and ((p >= 0) & (p <= 1)).all()
    assert not np.allclose(est.coef_, plain.coef_)  # not the same as naive labelling
    with pytest.raises(ValueError, match="no step label and no labelled bag"):
        MILLogisticRegression().fit(x, np.full(len(rows), -1.0), bags, {})


# --- tool identity masked -----------------------------------------------------------------


def _step(action: str, tool: dict | None = None) -> StepInput:
    return StepInput(
        task="Pay my landlord the rent for May.",
        observation=View("Landlord: IBAN GB29NWBK60161331926819, rent 1100 EUR."),
        action_text=action,
        history=(("Pay my landlord the rent for May.", "read_file(file_path='landlord.txt')"),),
        next_observation=View("Transaction 4411 sent."),
        tool=tool,
    )


PAIRS = [
    ("send_money(recipient='GB29NWBK60161331926819', amount=1100)",
     "wire_funds(iban='GB29NWBK60161331926819', value=1100)"),
    ('I will pay with the BankManagerTransfer tool.\nAction: BankManagerTransfer\n'
     'Action Input: {"to_account": "GB29NWBK60161331926819", "amount": 1100}',
     'I will pay with the VenmoSendMoney tool.\nAction: VenmoSendMoney\n'
     'Action Input: {"recipient": "GB29NWBK60161331926819", "value": 1100}'),
]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_two_actions_differing_only_in_tool_reach_the_harm_heads_as_the_same_input(
    a: str, b: str, bundle: Path
) -> None:
    assert mask_action(a) == mask_action(b)
    assert "1100" in mask_action(a) and "GB29NWBK60161331926819" in mask_action(a)
    config = JEPAConfig.from_dict(json.loads((bundle / "config.json").read_text())["model"])
    model = load_weights(JEPA(config), bundle)
    encoder = TextEncoder()
    for masked in (True, False):
        tables = tabulate([_step(a), _step(b)], encoder, config, mask_tools=masked)
        out = predict(model, tables, np.arange(2), config)
        same = tables.act[0, -1] == tables.act[1, -1]
        assert same == masked
        for head in ("harm_pre", "harm_post"):  # the same input: equal up to batched float noise
            close = bool(np.isclose(out[head][0], out[head][1], rtol=0.0, atol=1e-5))
            assert close == masked, (head, masked, out[head][0], out[head][1])


def test_masked_and_unmasked_texts_never_share_a_cache_key() -> None:
    action = PAIRS[0][0]
    assert text_key(mask_action(action)) != text_key(action)
    encoder = TextEncoder()
    masked, plain = encoder.encode([mask_action(action), action])
    fresh = TextEncoder()
    np.testing.assert_allclose(plain, fresh.encode([action])[0], atol=1e-6)
    np.testing.assert_allclose(masked, fresh.encode([mask_action(action)])[0], atol=1e-6)
    assert not np.allclose(masked, plain)


def test_masking_on_real_actions_hides_names_and_keys_and_keeps_values(toolemu: Path) -> None:
    """ToolEmu runs: a step's action masked from its text alone is masked as with its tool
    dict (so a live step, text only, reads as its training rows did), and no tool name or
    argument key of the call is left where the call spells it out."""
    steps = [t for t in read_transitions(toolemu) if t.tool]
    assert len(steps) > 100
    same = sum(mask_action(t.action_text) == mask_action(t.action_text, t.tool) for t in steps)
    assert same >= 0.98 * len(steps)
    for t in steps:
        masked = mask_action(t.action_text)
        assert re.search(r"^[ \t]*Action[ \t]*:[ \t]*tool\b", masked, re.M)
        assert t.tool is not None
        assert not re.search(rf"Action\s*:\s*{re.escape(t.tool['name'])}", masked)
        assert not any(f'"{k}":' in masked for k in t.tool["arguments"])
    d = mask_tool({"name": "GmailSendEmail", "arguments": {"to": "a@b.c", "body": "hi"}})
    assert d == {"name": "tool", "arguments": {"arg1": "a@b.c", "arg2": "hi"}}


def test_the_bundle_records_mask_tools_and_its_scorer_applies_it(
    bundle: Path, tmp_path: Path
) -> None:
    assert json.loads((bundle / "config.json").read_text())["mask_tools"] is True
    a, b = PAIRS[1]
    masked = WorldModelScorer.load(bundle)
    assert masked.mask_tools
    sa, sb = masked.score([_step(a), _step(b)])
    # the two calls differ only in what the tools are called (equal up to batched float noise)
    assert sa.signals() == pytest.approx(sb.signals(), abs=1e-5)
    # the same weights told they were trained on unmasked actions score them apart
    plain = tmp_path / "plain"
    shutil.copytree(bundle, plain)
    cfg = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({**cfg, "mask_tools": False}))
    pa, pb = WorldModelScorer.load(plain).score([_step(a), _step(b)])
    assert abs(pa.harm_pre - pb.harm_pre) > 1e-5
    # a bundle written before the option existed was trained unmasked: scored unmasked
    del cfg["mask_tools"]
    (plain / "config.json").write_text(json.dumps(cfg))
    assert WorldModelScorer.load(plain).mask_tools is False


def test_a_rogue_step_and_the_unannotated_steps_after_it_are_one_harmful_bag() -> None:
    """StepShield: the first rogue step is annotated; the steps after it carry label 1 with
    ``label_level: after_rogue`` (nobody said which of them are harmful). The world model
    learns them as one bag (one of them is harmful), the steps before as benign steps."""
    from worldmodel.datasets.format import Transition
    from worldmodel.train import trajectory_bags

    def t(tid: str, i: int, label: int, level: str) -> Transition:
        return Transition(f"{tid}/{i}", tid, "train", i, "task", View("o"), "a", View("o"),
                          label=label, meta={"label_level": level})

    rows = [t("run", 0, 0, "step"), t("run", 1, 1, "step"), t("run", 2, 1, "after_rogue"),
            t("run", 3, 1, "after_rogue"), t("clean", 0, 1, "step"),
            t("toolemu", 0, 1, "trajectory"), t("toolemu", 1, 1, "trajectory")]
    bags = trajectory_bags(rows)
    assert bags[0] == -1 and bags[4] == -1  # step-labelled, benign or harmful
    assert bags[1] == bags[2] == bags[3] >= 0  # the rogue step and those after it
    assert bags[5] == bags[6] >= 0 and bags[5] != bags[1]
