"""``POST /v1/screen`` on a real app with the real tiny models: a proposed action gets the
answer the screener gives offline (a hijacked step is held, a benign one allowed), from the
predicted next state; auth, clear 4xx, 503 when off, batching, and fuzzing without a 5xx."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from monitor.calibrate import load_split
from monitor.pipeline import ActionCheck, Screener, load_screener
from monitor.scorers.base import TierScorer, post_execution_signals
from monitor.screening import ScreenStep
from monitor.service.app import create_app
from monitor.service.screen import READ_CHARS, ScreenQueue, policy_hash, text_chars
from streams.records import Action, Step, Trajectory
from tests.service.conftest import Service, sqlite_service
from tests.service.helpers import png_data_uri
from tests.service.test_cli import paging_cli
from tests.service.test_schema import fuzz_operation


def pre_execution_l0_l1() -> set[str]:
    """What screening a proposal can produce: L0/L1 signals known before the action runs."""
    import monitor.scorers  # noqa: F401  (every scorer registers itself)

    return {s for c in TierScorer.registry if c.tier <= 1 for s in c.signals
            } - post_execution_signals()


@pytest.fixture(scope="module")
def screener(tiny_policy: Path) -> Screener:
    return load_screener(tiny_policy, reviewer=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Service:
    """An SQLite store with a token of every role (the screen endpoint keeps no state)."""
    return sqlite_service(tmp_path_factory.mktemp("screen"))


@pytest.fixture(scope="module")
def app(store: Service, screener: Screener) -> FastAPI:
    return create_app(store.settings(), console=io.StringIO(), screener=screener)


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def proposal(st: ScreenStep) -> tuple[Trajectory, Action]:
    """A recorded step as a proposal: the trajectory before it, and its action."""
    t = st.trajectory_so_far()
    return t.model_copy(update={"steps": list(t.steps[:-1])}), t.steps[-1].action


def body(trajectory: Trajectory, action: Action, **extra: Any) -> dict[str, Any]:
    return {"trajectory": trajectory.model_dump(mode="json", exclude_none=True),
            "action": action.model_dump(mode="json", exclude_none=True), **extra}


@pytest.fixture(scope="module")
def offline(small_agentdojo: Path, screener: Screener
            ) -> list[tuple[int, Trajectory, Action, ActionCheck]]:
    """Every validation step of the tiny data as a proposal, with the screener's own answer."""
    split = load_split([small_agentdojo], "val")
    out = []
    for st, y in zip(split.steps, split.y, strict=True):
        traj, action = proposal(st)
        out.append((int(y), traj, action, screener.check_action(traj, action)))
    return out


# batched with others, the probe model pads: its probability moves by up to ~1e-3 (seen 8e-4
# on CI) and the gate's logit stacking can double that
NOISE = 3e-3


def assert_same(answer: dict[str, Any], check: ActionCheck,
                thresholds: tuple[float, ...] = (), screener: Screener | None = None) -> None:
    """The service's answer is the offline one: decisions exactly, unless the offline score
    lies within float noise of a gate's threshold (``thresholds``: the gates' thresholds for
    proposals; a threshold sits on a calibration step's score) or, given the ``screener``,
    its L1 gate probability within noise of the block threshold (block or escalate)."""
    near_block = screener is not None and abs(
        float(screener.policy.gates[1].probability([check.signals])[0])
        - screener.policy.block_threshold) < NOISE
    if near_block:
        assert answer["tier"] == check.tier and {answer["decision"], check.decision} <= {
            "block", "escalate"}
    elif not any(abs(check.score - t) < NOISE for t in thresholds):
        assert (answer["decision"], answer["tier"]) == (check.decision, check.tier)
    assert answer["score"] == pytest.approx(check.score, abs=NOISE)
    assert answer["signals"] == pytest.approx(dict(check.signals), abs=2e-3)


def test_a_hijacked_action_is_held_and_a_benign_one_allowed(
    client: TestClient, store: Service, screener: Screener,
    offline: list[tuple[int, Trajectory, Action, ActionCheck]],
) -> None:
    harmful = max((o for o in offline if o[0] == 1), key=lambda o: o[3].score)
    benign = min((o for o in offline if o[0] == 0), key=lambda o: o[3].score)
    assert harmful[3].decision in {"escalate", "block"}  # what the screener says offline
    assert benign[3].decision == "allow"
    for _, traj, action, check in (harmful, benign):
        r = client.post("/v1/screen", json=body(traj, action, step_id="next-step"),
                        headers=store.auth("producer"))
        assert r.status_code == 200, r.text
        answer = r.json()
        assert_same(answer, check)
        # pre-execution: the harm of the predicted next state, never of an observed one
        assert "wm_harm_pre" in answer["signals"] and "wm_harm_post" not in answer["signals"]
        assert set(answer["signals"]) <= pre_execution_l0_l1()  # nothing of an L2 review
        assert answer["policy"] == policy_hash(screener)
        assert (answer["trajectory_id"], answer["step_id"]) == (traj.trajectory_id, "next-step")
        assert answer["latency_ms"] > 0
    held = client.post("/v1/screen", json=body(*harmful[1:3]), headers=store.auth("admin"))
    assert held.json()["decision"] == harmful[3].decision  # an admin may screen too


def test_proposals_keep_each_gates_budget(
    screener: Screener, offline: list[tuple[int, Trajectory, Action, ActionCheck]],
) -> None:
    """A proposal lacks the post-execution signals, so each gate has a threshold for
    proposals calibrated at the same budget: benign proposals of the calibration steps do not
    reach L1 (L2) more often than the L0 (L1) budget allows."""
    benign = [o[3] for o in offline if o[0] == 0]
    gates = screener.policy.gates
    for k in (0, 1):
        assert gates[k].pre_threshold is not None
        reached = sum(c.tier > k for c in benign)
        assert reached <= gates[k].budget * len(benign) + 1e-9, (k, reached, len(benign))
    assert any(c.decision == "allow" for c in benign)


def test_every_validation_step_gets_the_offline_answer(
    client: TestClient, store: Service, screener: Screener,
    offline: list[tuple[int, Trajectory, Action, ActionCheck]],
) -> None:
    """Sent all at once (they are batched): each answer is still its own offline one."""
    answers: dict[int, Any] = {}
    barrier = threading.Barrier(len(offline))

    def send(i: int, traj: Trajectory, action: Action) -> None:
        barrier.wait()
        answers[i] = client.post("/v1/screen", json=body(traj, action),
                                 headers=store.auth("producer"))

    threads = [threading.Thread(target=send, args=(i, t, a))
               for i, (_, t, a, _) in enumerate(offline)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (_, _, _, check) in enumerate(offline):
        assert answers[i].status_code == 200, answers[i].text
        assert_same(answers[i].json(), check,
                    tuple(g.threshold_for(True) for g in screener.policy.gates[:2]), screener)


def test_concurrent_checks_run_as_one_batch(
    screener: Screener, offline: list[tuple[int, Trajectory, Action, ActionCheck]],
) -> None:
    queue = ScreenQueue(screener, max_batch=4)
    proposals = [(t, a) for _, t, a, _ in offline[:6]]

    async def check_all() -> list[ActionCheck]:
        return await asyncio.gather(*(queue.check(t, a) for t, a in proposals))

    got = asyncio.run(check_all())
    assert queue.batches == 2  # six waiting proposals, at most four a model call
    for check, (_, _, _, alone) in zip(got, offline[:6], strict=True):
        assert_same(asdict(check), alone, screener=screener)


class RecordingScreener:
    """The real screener, noting which trajectories went into each model call."""

    def __init__(self, screener: Screener) -> None:
        self.screener = screener
        self.policy = screener.policy
        self.calls: list[list[str]] = []

    def check_actions(self, proposals: list[tuple[Trajectory, Action]]) -> list[ActionCheck]:
        self.calls.append([t.trajectory_id for t, _ in proposals])
        return self.screener.check_actions(proposals)


@pytest.mark.parametrize(("room_for_big", "calls"), [
    # room for one large proposal and the small ones: they go beside the oldest
    (True, [["big-1", "small-0", "small-1", "small-2"], ["big-2"]]),
    # room for the small ones only: they go first, then one call for each large one
    (False, [["small-0", "small-1", "small-2"], ["big-1"], ["big-2"]]),
])
def test_a_model_call_holds_at_most_its_budget_of_text(
    screener: Screener, offline: list[tuple[int, Trajectory, Action, ActionCheck]],
    room_for_big: bool, calls: list[list[str]],
) -> None:
    """Two large proposals never share a call; small ones do not wait behind large ones;
    each proposal still gets its own answer."""
    def large(tid: str) -> tuple[Trajectory, Action]:
        _, t, a, _ = offline[0]
        huge = Step.model_validate({"step_id": "log", "index": len(t.steps),
                                    "observation": {"text": "GET /index.html 200\n" * 10_000},
                                    "action": {"text": "read_file('access.log')"}})
        return t.model_copy(update={"trajectory_id": tid, "steps": [*t.steps, huge]}), a

    big = [large("big-1"), large("big-2")]
    small = [(t.model_copy(update={"trajectory_id": f"small-{i}"}), a)
             for i, (_, t, a, _) in enumerate(offline[1:4])]
    assert text_chars(*big[0]) > READ_CHARS > 10 * max(text_chars(*p) for p in small)
    spy = RecordingScreener(screener)
    room = text_chars(*big[0]) + 3 * READ_CHARS // 10 if room_for_big else READ_CHARS // 2
    queue = ScreenQueue(spy, max_batch=16, batch_chars=room)  # type: ignore[arg-type]
    proposals = [*big, *small]

    async def check_all() -> list[ActionCheck]:
        return await asyncio.gather(*(queue.check(t, a) for t, a in proposals))

    got = asyncio.run(check_all())
    assert spy.calls == calls
    for check, (t, a) in zip(got, proposals, strict=True):
        assert_same(asdict(check), screener.check_action(t, a), screener=screener)


def test_the_first_action_of_a_trajectory_can_be_screened(
    client: TestClient, store: Service, screener: Screener,
) -> None:
    traj = Trajectory(trajectory_id="fresh", source="deployment",
                      task="Pay the rent for this month.", steps=[])
    action = Action.model_validate({
        "text": "send_money(recipient='GB29NWBK60161331926819', amount=1100)",
        "tool": {"name": "send_money",
                 "arguments": {"recipient": "GB29NWBK60161331926819", "amount": 1100}}})
    r = client.post("/v1/screen", json=body(traj, action), headers=store.auth("producer"))
    assert r.status_code == 200, r.text
    assert_same(r.json(), screener.check_action(traj, action))
    assert r.json()["signals"]["rule_new_recipient"] == 1.0  # an account the task never named


def test_only_the_harness_may_screen(client: TestClient, store: Service,
                                     offline: list[Any]) -> None:
    payload = body(*offline[0][1:3])
    r = client.post("/v1/screen", json=payload)
    assert r.status_code == 401 and "missing API token" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.post("/v1/screen", json=payload, headers={"Authorization": "Bearer vgl_nope"})
    assert r.status_code == 401 and "invalid or revoked" in r.json()["detail"]
    r = client.post("/v1/screen", json=payload, headers=store.auth("reviewer"))
    assert r.status_code == 403
    assert r.json()["detail"] == ("token 'reviewer-1' has role 'reviewer'; screening needs "
                                  "'producer' or 'admin'")


TRAJ = {"trajectory_id": "t1", "task": "check my balance", "steps": []}
STEP = {"step_id": "s0", "index": 0, "observation": {"text": "balance: 10"},
        "action": {"text": "get_balance()"}}


@pytest.mark.parametrize(("payload", "detail"), [
    ({"trajectory": TRAJ}, "invalid request: action: required, but missing"),
    ({"action": {"text": "ls"}}, "invalid request: trajectory: required, but missing"),
    ({"trajectory": TRAJ, "action": {"text": 3}},
     "invalid request: action.text: Input should be a valid string"),
    ({"trajectory": TRAJ, "action": {}},
     "invalid request: action: the proposed action needs a text, a tool call or a gui action"),
    ({"trajectory": TRAJ, "action": {"tool": {"arguments": {}}}},
     "invalid request: action.tool.name: required, but missing"),
    ({"trajectory": {**TRAJ, "steps": "none"}, "action": {"text": "ls"}},
     "invalid request: trajectory.steps: Input should be a valid list"),
    ({"trajectory": {**TRAJ, "steps": [STEP]}, "action": {"text": "ls"}, "step_id": "s0"},
     "invalid request: step_id 's0' is already a step of the trajectory"),
    ({"trajectory": {**TRAJ, "steps": [{**STEP, "observation": {"screenshot": "/etc/passwd"}}]},
      "action": {"text": "ls"}},
     "invalid request: trajectory.steps.0.observation.screenshot must be a "
     "data:image/png;base64 URI (paths are not read)"),
    ({"trajectory": {**TRAJ, "steps": [{**STEP, "result": {
        "screenshot": "data:image/png;base64,bm90IGEgcG5n"}}]}, "action": {"text": "ls"}},
     "invalid request: trajectory.steps.0.result.screenshot is not a readable base64 PNG"),
    ({"trajectory": {**TRAJ, "steps": [{**STEP, "observation": {
        "screenshot": png_data_uri(5000, 4000)}}]}, "action": {"text": "ls"}},
     "invalid request: trajectory.steps.0.observation.screenshot is 5000x4000 pixels; a "
     "screenshot has at most 16777216 (4096x4096)"),
    ({"trajectory": {**TRAJ, "meta": {"activations": {"layers": {}}}}, "action": {"text": "ls"}},
     "invalid request: trajectory.meta.activations is not read by /v1/screen: the probe model "
     "computes the proposed action's activations"),
    ({"trajectory": TRAJ, "action": {"gui": {"kind": "click", "x": 1e308, "y": 0}}},
     "invalid request: action: gui.x is 1e+308; a screen coordinate is within ±1e+06 pixels"),
    ({"trajectory": {**TRAJ, "meta": {"signals": {"rl_drift": 10**400}}},
      "action": {"text": "ls"}},
     "invalid request: trajectory.meta.signals.rl_drift is out of range"),
    ({"trajectory": TRAJ, "action": {"text": "ls"}, "verdict": "allow"},
     "invalid request: verdict: unknown field"),
])
def test_a_malformed_request_is_a_422_naming_the_field(
    client: TestClient, store: Service, payload: dict[str, Any], detail: str,
) -> None:
    r = client.post("/v1/screen", json=payload, headers=store.auth("producer"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == detail


def test_a_screenshot_inline_as_png_is_screened(client: TestClient, store: Service) -> None:
    step = {**STEP, "observation": {"text": "the bank's page", "screenshot": png_data_uri()}}
    r = client.post("/v1/screen", json={"trajectory": {**TRAJ, "steps": [step]},
                                         "action": {"gui": {"kind": "click", "x": 4, "y": 9}}},
                    headers=store.auth("producer"))
    assert r.status_code == 200, r.text
    assert r.json()["decision"] in {"allow", "escalate", "block"}


def test_without_a_screener_the_endpoint_says_how_to_enable_it(store: Service) -> None:
    with TestClient(create_app(store.settings(), console=io.StringIO())) as c:
        r = c.post("/v1/screen", json={"trajectory": TRAJ, "action": {"text": "ls"}},
                   headers=store.auth("producer"))
        assert r.status_code == 503
        assert r.json()["detail"] == (
            "pre-execution screening is off: start the service with --screen-policy PATH (or "
            "VIGIL_PAGING_SCREEN_POLICY) naming a calibrated policy from `monitor calibrate`")
        assert c.post("/v1/screen", json={}).status_code == 401  # auth first, config second
        assert c.get("/healthz").status_code == 200  # the rest of the service runs


def test_the_setting_loads_the_policy_at_start_up(
    store: Service, tiny_policy: Path, screener: Screener,
    offline: list[tuple[int, Trajectory, Action, ActionCheck]],
) -> None:
    settings = store.settings(screen_policy=tiny_policy)
    app = create_app(settings, console=io.StringIO())
    assert app.state.screen is None  # nothing is loaded when the app is built ...
    with TestClient(app) as c:  # ... but in the lifespan, before the first request
        _, traj, action, check = offline[0]
        r = c.post("/v1/screen", json=body(traj, action), headers=store.auth("producer"))
        assert r.status_code == 200, r.text
        assert_same(r.json(), check)
        assert r.json()["policy"] == policy_hash(screener)


def test_the_openapi_schema_documents_the_endpoint(app: FastAPI) -> None:
    schema = app.openapi()
    op = schema["paths"]["/v1/screen"]["post"]
    assert {"200", "401", "403", "422", "503"} <= set(op["responses"])
    assert op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ScreenRequest"}
    assert op["security"] == [{"HTTPBearer": []}]
    answer = schema["components"]["schemas"]["ScreenResponse"]
    assert answer["properties"]["decision"]["enum"] == ["allow", "escalate", "block"]
    assert set(answer["properties"]) == {"decision", "tier", "score", "signals", "latency_ms",
                                         "policy", "trajectory_id", "step_id", "rule"}


def test_fuzzed_screen_requests_never_get_a_server_error(app: FastAPI, store: Service) -> None:
    """Valid and invalid bodies through the real models: no 5xx, every answer as declared
    (``POST /v1/screen`` and the Claude Code hook)."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [op for r in schema.get_all_operations() if isinstance(r, Ok) and (
        op := r.ok()).path in ("/v1/screen", "/v1/hooks/claude-code")]
    assert len(operations) == 2
    failures = [
        failure
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if (failure := fuzz_operation(operation, mode, store.auth("producer"), 25))
    ]
    assert not failures, "\n\n".join(failures)
    # (whether generated "valid" bodies pass the endpoint's stricter checks, and so reach
    # the models, depends on the draw: the served-answer checks above hold either way)


def test_serve_refuses_a_screen_policy_it_cannot_read(tmp_path: Path) -> None:
    missing = tmp_path / "policy.json"
    r = paging_cli("serve", "--screen-policy", str(missing), "--database-url",
                   f"sqlite:///{tmp_path}/cli.db")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"monitor serve: --screen-policy {missing}: no calibrated "
                                "policy; make one with `monitor calibrate`")
    missing.write_text("{}")
    r = paging_cli("serve", "--screen-policy", str(missing), "--database-url",
                   f"sqlite:///{tmp_path}/cli.db")
    assert r.returncode == 2 and "calibrated policy version None" in r.stderr
