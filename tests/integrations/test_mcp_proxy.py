"""`monitor mcp` in front of a real MCP server (mcp-server-git from PyPI), driven by the MCP
SDK's client over stdio: a call the policy blocks never reaches the server (no commit is
made), an allowed one returns the server's own result, --monitor-only forwards everything,
a screener that cannot answer fails closed, or open with --fail-open, and a call escalated for
review waits for a reviewer's verdict on a live paging service (--hold-timeout)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.integrations.conftest import consume_steps

RULES = {"rules": [{"match": "git_commit", "server": "git", "action": "deny"},
                   {"match": "git_status", "action": "allow"},
                   {"match": "git_add", "action": "allow"}]}


def _repo(root: Path) -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    for cmd in (["init", "-q"], ["config", "user.email", "t@example.com"],
                ["config", "user.name", "t"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run(["git", "add", "a.txt"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "first"], cwd=repo, check=True)
    (repo / "b.txt").write_text("b\n")
    return repo


def _commits(repo: Path) -> int:
    out = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=repo, check=True,
                         capture_output=True, text=True)
    return int(out.stdout)


def _git_server(repo: Path) -> list[str]:
    return [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)]


async def _session(command: list[str], calls: list[tuple[str, dict[str, Any]]],
                   env: dict[str, str] | None = None) -> list[tuple[bool, str]]:
    from mcp import Client, StdioServerParameters

    out = []
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with Client(params, read_timeout_seconds=180) as client:
        for name, args in calls:
            r = await client.call_tool(name, args)
            text = "\n".join(getattr(c, "text", "") for c in r.content)
            out.append((bool(r.is_error), text))
    return out


def _run(command: list[str], calls: list[tuple[str, dict[str, Any]]],
         env: dict[str, str] | None = None) -> list[tuple[bool, str]]:
    return anyio.run(_session, command, calls, env)


def _proxy(*flags: str, repo: Path) -> list[str]:
    return [sys.executable, "-m", "monitor.cli", "mcp", "--server-name", "git", *flags, "--",
            *_git_server(repo)]


@pytest.fixture(scope="module")
def ruled_policy(ruled_policy_with: Any) -> Path:
    return ruled_policy_with(RULES)  # type: ignore[no-any-return]


@pytest.mark.broker
def test_a_blocked_call_never_reaches_the_server_and_every_call_reaches_the_stream(
    ruled_policy: Path, tmp_path: Path, kafka_settings: Any, topics: Any, unique: str
) -> None:
    repo = _repo(tmp_path)
    status = ("git_status", {"repo_path": str(repo)})
    [(_, direct)] = _run(_git_server(repo), [status])
    env = {"VIGIL_KAFKA_BOOTSTRAP_SERVERS": str(kafka_settings.bootstrap_servers),
           "VIGIL_TOPIC_STEPS_DEPLOYMENT": topics.steps_deployment}
    got = _run(_proxy("--policy", str(ruled_policy), repo=repo), [
        status,
        ("git_add", {"repo_path": str(repo), "files": ["b.txt"]}),
        ("git_commit", {"repo_path": str(repo), "message": "sneaky"}),
    ], env)
    assert got[0] == (False, direct)  # the server's own answer, unchanged
    assert got[1][0] is False and "staged" in got[1][1].lower()
    assert got[2][0] is True and "vigil blocked this call to git_commit" in got[2][1]
    assert "git_commit" in got[2][1] and "deny" in got[2][1]
    assert _commits(repo) == 1  # the commit never happened
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=repo,
                            capture_output=True, text=True, check=True).stdout.split()
    assert staged == ["b.txt"]  # the allowed git_add did
    # every screened call, the blocked one too, reached the deployment steps topic
    events = consume_steps(kafka_settings, topics.steps_deployment, f"{unique}.reader", 3)
    assert [e.step.action.tool.name for e in events if e.step.action.tool] == [
        "git_status", "git_add", "git_commit"]
    assert len({e.trajectory_id for e in events}) == 1  # one MCP session, one trajectory
    assert [e.step.step_id for e in events] == ["0", "1", "2"]
    assert events[0].meta["mcp_server"] == "git"
    first, commit = events[0], events[2]
    assert first.meta["vigil_forwarded"] is True and "Repository status" in (
        first.step.result.text if first.step.result else "")
    assert commit.meta["vigil_forwarded"] is False and commit.meta["vigil_decision"] == "block"
    assert "git_commit" in commit.meta["vigil_rule"]


def test_monitor_only_forwards_what_it_would_block(ruled_policy: Path, tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    got = _run(_proxy("--policy", str(ruled_policy), "--monitor-only", repo=repo), [
        ("git_add", {"repo_path": str(repo), "files": ["b.txt"]}),
        ("git_commit", {"repo_path": str(repo), "message": "watched"}),
    ])
    assert [e for e, _ in got] == [False, False]
    assert _commits(repo) == 2


def test_a_screener_that_cannot_answer_fails_closed_or_open(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    down = ["--service", "http://127.0.0.1:9"]  # nothing listens there
    status = ("git_status", {"repo_path": str(repo)})
    [(err, text)] = _run(_proxy(*down, repo=repo), [status])
    assert err and "could not screen" in text and "not run" in text
    [(err, text)] = _run(_proxy(*down, "--fail-open", repo=repo), [status])
    assert not err and "Repository status" in text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE_GIT_OVER_HTTP = """
import sys
from pathlib import Path

import uvicorn
from mcp_server_git.server import create_server

app = create_server(Path(sys.argv[1])).streamable_http_app()
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def test_a_server_on_streamable_http_is_screened_as_one_on_stdio(
    ruled_policy: Path, tmp_path: Path
) -> None:
    """``--upstream URL``: mcp-server-git's own server served over streamable HTTP (its
    package has no HTTP entry point; the server and its tools are the package's)."""
    import socket

    repo = _repo(tmp_path)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE_GIT_OVER_HTTP, str(repo), str(port)])
    try:
        end = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < end, "the server did not start"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        proxy = [sys.executable, "-m", "monitor.cli", "mcp", "--server-name", "git", "--policy",
                 str(ruled_policy), "--upstream", f"http://127.0.0.1:{port}/mcp",
                 "--header", "X-Team: vigil-tests"]
        got = _run(proxy, [("git_add", {"repo_path": str(repo), "files": ["b.txt"]}),
                           ("git_commit", {"repo_path": str(repo), "message": "sneaky"})])
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert got[0][0] is False and "staged" in got[0][1].lower()
    assert got[1][0] is True and "vigil blocked this call to git_commit" in got[1][1]
    assert _commits(repo) == 1  # blocked: the commit never happened


def test_the_server_is_named_once_as_a_command_or_a_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from monitor.cli.main import main

    assert main(["mcp", "--upstream", "http://127.0.0.1:9/mcp", "--", "git"]) == 2
    assert main(["mcp"]) == 2
    assert main(["mcp", "--upstream", "ftp://example.com/mcp"]) == 2
    assert main(["mcp", "--upstream", "http://127.0.0.1:9/mcp", "--header", "nocolon"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4, err
    assert "not both" in err[0] and "--upstream" in err[1] and "ftp://" in err[2]
    assert "nocolon" in err[3]


@pytest.fixture(scope="module")
def held_service(ruled_policy_with: Any, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[str, dict[str, str]]]:
    """A live paging service (uvicorn, an SQLite store) screening with the tiny policy whose
    tool rule sends git_commit to a reviewer; its URL and a token of each role."""
    import io

    from monitor.pipeline import load_screener
    from monitor.service.app import create_app
    from tests.service.conftest import sqlite_service
    from tests.service.helpers import serving

    policy = ruled_policy_with({"rules": [{"match": "git_commit", "action": "review"},
                                          {"match": "git_add", "action": "allow"}]})
    store = sqlite_service(tmp_path_factory.mktemp("held"))
    screener = load_screener(policy, reviewer=False)
    with serving(lambda base: create_app(store.settings(public_url=base),
                                         console=io.StringIO(), screener=screener)) as base:
        yield base, store.tokens


def _answer_the_page(base: str, token: str, harmful: bool, found: list[dict[str, Any]]
                     ) -> None:
    """A reviewer: wait for the held call's page, read its case, give a verdict."""
    import httpx

    auth = {"Authorization": f"Bearer {token}"}
    end = time.monotonic() + 60
    while time.monotonic() < end:
        pages = httpx.get(f"{base}/api/v1/pages", params={"status": "open"},
                          headers=auth).json()["items"]
        if pages:
            found.append(httpx.get(f"{base}/api/v1/pages/{pages[0]['id']}",
                                   headers=auth).json())
            httpx.post(f"{base}/api/v1/verdicts", headers=auth, json={
                "page_id": pages[0]["id"], "harmful": harmful, "note": "checked by hand"})
            return
        time.sleep(0.2)


def test_an_escalated_call_waits_for_a_reviewer(
    held_service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """``--hold-timeout``: the call a `review` rule escalates runs only once a reviewer says
    it is not harmful; rejected, or unanswered in time, it never runs."""
    import threading

    base, tokens = held_service
    env = {"VIGIL_TOKEN": tokens["producer"]}
    for harmful in (False, True):
        repo = _repo(tmp_path / f"harmful-{harmful}")
        found: list[dict[str, Any]] = []
        reviewer = threading.Thread(target=_answer_the_page,
                                    args=(base, tokens["reviewer"], harmful, found))
        reviewer.start()
        got = _run(_proxy("--service", base, "--hold-timeout", "90", repo=repo), [
            ("git_add", {"repo_path": str(repo), "files": ["b.txt"]}),
            ("git_commit", {"repo_path": str(repo), "message": "checked"})], env)
        reviewer.join(timeout=60)
        assert got[0][0] is False  # git_add: allowed, never held
        [page] = found
        case = page["alerts"][0]["details"]
        assert [s["action"]["tool"]["name"] for s in case["trajectory"]["steps"]] == [
            "git_add", "git_commit"]  # the session so far and the proposed call
        if harmful:
            assert got[1][0] is True and "rejected it: checked by hand" in got[1][1]
            assert _commits(repo) == 1
        else:
            assert got[1][0] is False and _commits(repo) == 2  # approved: it ran
    repo = _repo(tmp_path / "unanswered")
    got = _run(_proxy("--service", base, "--hold-timeout", "1", repo=repo), [
        ("git_commit", {"repo_path": str(repo), "message": "nobody looked"})], env)
    assert got[0][0] is True and "no reviewer answered within 1 s" in got[0][1]
    assert _commits(repo) == 1
