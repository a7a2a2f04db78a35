"""``monitor serve`` and ``monitor paging token ...`` as a user runs them (subprocesses)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from monitor.service.cli import add_parser, cmd_serve, cmd_token_create
from tests.service.helpers import trigger, wait_for

ROOT = Path(__file__).resolve().parents[2]


def paging_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    return subprocess.run([sys.executable, "-m", "monitor.service.cli", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def test_add_parser_wires_serve_and_paging_into_a_monitor_cli() -> None:
    parser = argparse.ArgumentParser(prog="monitor")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", "--port", "9001", "--database-url", "sqlite:///x.db"])
    assert (args.fn, args.port, args.host, args.database_url) == (
        cmd_serve, 9001, "127.0.0.1", "sqlite:///x.db")
    args = parser.parse_args(["paging", "token", "create", "--role", "reviewer", "--name", "al"])
    assert (args.fn, args.role, args.name) == (cmd_token_create, "reviewer", "al")


def test_token_create_prints_it_once_and_serve_accepts_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    made = paging_cli("paging", "token", "create", "--role", "producer", "--name", "worker",
                      "--database-url", url)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("vgl_") and "\n" not in token
    assert "shown only now" in made.stderr
    made = paging_cli("paging", "token", "create", "--role", "reviewer", "--name", "alice",
                      "--database-url", url)
    reviewer = made.stdout.strip()
    listed = paging_cli("paging", "token", "list", "--database-url", url)
    assert "alice" in listed.stdout and "worker" in listed.stdout
    assert token not in listed.stdout and reviewer not in listed.stdout

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIGIL_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "monitor.service.cli", "serve", "--port", str(port),
         "--database-url", url, "--log-level", "warning"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=30, every=0.1)
        r = httpx.post(f"{base}/api/v1/events", json=trigger("cli-t", 0),
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 202, r.text
        pages = httpx.get(f"{base}/api/v1/pages",
                          headers={"Authorization": f"Bearer {reviewer}"}).json()
        assert pages["items"][0]["trajectory_id"] == "cli-t"
        revoked = paging_cli("paging", "token", "revoke", "1", "--database-url", url)
        assert revoked.returncode == 0 and "revoked token 1" in revoked.stdout
        r = httpx.post(f"{base}/api/v1/events", json=trigger("cli-t", 1),
                       headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    assert server.returncode in (0, -signal.SIGTERM), err  # uvicorn re-raises the signal
    assert "[vigil] page.triggered page 1 CRITICAL" in out  # the default console channel
    assert f"paging service on http://127.0.0.1:{port}" in err


def test_cli_errors_are_one_sentence() -> None:
    r = paging_cli("paging", "token", "create", "--role", "overlord", "--name", "x")
    assert r.returncode == 2 and "invalid choice: 'overlord'" in r.stderr
    r = paging_cli("paging", "migrate", "--database-url", "postgresql://postgres@127.0.0.1:1/x")
    assert r.returncode == 2
    assert r.stderr.startswith("monitor paging: cannot reach the database postgresql://")
    assert len(r.stderr.strip().splitlines()) <= 2
    r = paging_cli("paging", "migrate", "--database-url", "mysql://db/x")
    assert r.returncode == 2 and "unsupported database 'mysql'" in r.stderr
    r = paging_cli("serve", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "VIGIL_PAGING_DATABASE_URL" in r.stdout
