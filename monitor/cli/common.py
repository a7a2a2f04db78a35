"""What the ``monitor`` commands share: the one-sentence error, the Kafka options, and
``add_command`` for a subcommand with an example.

Light on purpose (argparse only at import time): every command module imports it while the
parser is built, so ``monitor --help`` stays instant.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streams.config import KafkaSettings

BOOTSTRAP_SERVERS_HELP = "Kafka bootstrap servers (default: $VIGIL_KAFKA_BOOTSTRAP_SERVERS)"


class CliError(Exception):
    """A user-facing failure: printed as one sentence, exit status 2."""


def add_bootstrap_servers(p: argparse.ArgumentParser) -> None:
    """The ``--bootstrap-servers HOST:PORT`` option that :func:`kafka_settings` reads."""
    p.add_argument("--bootstrap-servers", metavar="HOST:PORT", help=BOOTSTRAP_SERVERS_HELP)


def add_command(
    sub: Any,
    name: str,
    fn: Callable[[argparse.Namespace], int],
    help: str,
    example: str,
    kafka: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand whose description is its help line, with one example as its epilog;
    ``kafka`` adds ``--bootstrap-servers``."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=help,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(fn=fn)
    if kafka:
        add_bootstrap_servers(p)
    return p


def kafka_settings(args: argparse.Namespace) -> KafkaSettings:
    """The environment's Kafka settings, ``--bootstrap-servers`` first; no broker: CliError."""
    from streams.config import KafkaSettings

    settings = KafkaSettings()
    if getattr(args, "bootstrap_servers", None):
        settings = settings.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
    if not settings.bootstrap_servers:
        raise CliError(
            "no broker to talk to: pass --bootstrap-servers, set VIGIL_KAFKA_BOOTSTRAP_SERVERS, "
            "or start one with `monitor broker`"
        )
    return settings


def check_reachable(settings: KafkaSettings) -> None:
    """Fail with one sentence unless one of the bootstrap servers accepts a TCP connection."""
    import socket

    assert settings.bootstrap_servers
    for server in settings.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=3).close()
            return
        except (OSError, ValueError):
            continue
    raise CliError(f"cannot reach a Kafka broker at {settings.bootstrap_servers}")
