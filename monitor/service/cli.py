"""``monitor serve`` and ``monitor paging ...``: run the paging service, manage its store.

``add_parser(subparsers)`` adds both commands to the ``monitor`` CLI; each sets
``fn`` (returning an exit status). ``python -m monitor.service.cli`` runs them alone.
Heavy imports happen inside the commands, so ``--help`` stays instant.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROLES = ("producer", "reviewer", "admin")

SERVE_EPILOG = textwrap.dedent(
    """\
    examples:
      monitor serve                                   # SQLite file vigil-paging.db, port 8000
      monitor serve --port 9000 --database-url postgresql://vigil@db.internal/vigil
      monitor serve --screen-policy ~/.cache/vigil/models/policy.json   # + POST /v1/screen
      monitor paging token create --role reviewer --name alice   # then sign in at /login

    configuration (environment, VIGIL_PAGING_*):
      VIGIL_PAGING_DATABASE_URL   sqlite:///FILE (default vigil-paging.db) or postgresql://...
      VIGIL_PAGING_SECRET_KEY     signs browser sessions (set it, or logins end on restart)
      VIGIL_PAGING_PUBLIC_URL     base URL used in notification links
      VIGIL_PAGING_SCREEN_POLICY  calibrated policy for POST /v1/screen (as --screen-policy)
      VIGIL_PAGING_POLL_INTERVAL_S, VIGIL_PAGING_WEBHOOK_MAX_ATTEMPTS, ...
      VIGIL_KAFKA_BOOTSTRAP_SERVERS  publish verdicts to the labels topic
    """
)

PAGING_EPILOG = textwrap.dedent(
    """\
    examples:
      monitor paging migrate --database-url postgresql://vigil@db.internal/vigil
      monitor paging token create --role producer --name worker    # for the streaming worker
      monitor paging token create --role reviewer --name alice     # for a person
      monitor paging token list
      monitor paging token revoke 3
    """
)


class PagingCliError(ValueError):
    """A user-facing failure: one sentence (the ``monitor`` CLI prints it and exits 2)."""


def _database_url(args: argparse.Namespace) -> str:
    from monitor.service.settings import PagingSettings

    return str(getattr(args, "database_url", None) or PagingSettings().database_url)


def _migrated_engine(url: str) -> Any:
    from sqlalchemy.exc import OperationalError

    from monitor.service.db import make_engine, upgrade_database

    engine = make_engine(url)
    try:
        upgrade_database(engine)
    except OperationalError as e:
        raise PagingCliError(f"cannot reach the database {url}: {e.orig}") from None
    return engine


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from monitor.service.app import create_app
    from monitor.service.settings import PagingSettings

    settings = PagingSettings()
    update: dict[str, Any] = {}
    if args.database_url:
        update["database_url"] = args.database_url
    if args.screen_policy:
        update["screen_policy"] = Path(args.screen_policy).expanduser()
    if "public_url" not in settings.model_fields_set:
        update["public_url"] = f"http://{args.host}:{args.port}"
    settings = settings.model_copy(update=update)
    _migrated_engine(settings.database_url).dispose()  # fail here, in one sentence, if unreachable
    if settings.screen_policy is not None:
        _check_policy(settings.screen_policy)
    app = create_app(settings)
    screening = (f"; POST /v1/screen with {settings.screen_policy}" if settings.screen_policy
                 else "; POST /v1/screen off (--screen-policy)")
    print(f"paging service on http://{args.host}:{args.port} (database {settings.database_url}"
          f"{screening})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _check_policy(path: Path) -> None:
    """Fail in one sentence, before serving, when the screening policy cannot be read."""
    from monitor.tiers import CalibratedPolicy, PolicyError

    try:
        CalibratedPolicy.load(path)
    except PolicyError as e:
        raise PagingCliError(f"--screen-policy {e}") from None


def cmd_migrate(args: argparse.Namespace) -> int:
    from monitor.service.db import current_revision

    url = _database_url(args)
    engine = _migrated_engine(url)
    print(f"{url}: schema at revision {current_revision(engine)}")
    engine.dispose()
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from monitor.service.auth import create_token
    from monitor.service.db import make_sessionmaker, session_scope

    engine = _migrated_engine(_database_url(args))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            row, token = create_token(session, args.name, args.role)
            token_id = row.id
    finally:
        engine.dispose()
    print(token)
    print(f"token {token_id} for {args.name!r} ({args.role}); it is shown only now: store it.",
          file=sys.stderr)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from monitor.service.db import make_sessionmaker
    from monitor.service.models import ApiToken

    engine = _migrated_engine(_database_url(args))
    with make_sessionmaker(engine)() as session:
        rows = session.scalars(select(ApiToken).order_by(ApiToken.id)).all()
        print(f"{'id':>4}  {'name':<20} {'role':<9} {'prefix':<9} {'created':<20} state")
        for t in rows:
            state = f"revoked {t.revoked_at:%Y-%m-%d}" if t.revoked_at else "active"
            print(f"{t.id:>4}  {t.name:<20} {t.role:<9} {t.prefix:<9} "
                  f"{t.created_at:%Y-%m-%d %H:%M:%S}  {state}")
    engine.dispose()
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from monitor.service.auth import revoke_token
    from monitor.service.db import make_sessionmaker, session_scope

    engine = _migrated_engine(_database_url(args))
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            row = revoke_token(session, args.token_id)
            if row is None:
                raise PagingCliError(f"no token with id {args.token_id}")
            name = row.name
    finally:
        engine.dispose()
    print(f"revoked token {args.token_id} ({name!r})")
    return 0


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", metavar="URL",
                   help="sqlite:///FILE or postgresql://... (default: $VIGIL_PAGING_DATABASE_URL "
                        "or sqlite:///vigil-paging.db)")


def add_parser(subparsers: Any) -> None:
    """Add ``serve`` and ``paging`` to the ``monitor`` command line."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "serve", help="run the L3 paging service (API and review pages)",
        description="Run the paging service: the events API, escalation timers, webhooks, and "
                    "the review pages. Migrates the database first.",
        epilog=SERVE_EPILOG, formatter_class=fmt)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    _db_arg(p)
    p.add_argument("--screen-policy", metavar="PATH",
                   help="calibrated policy (monitor calibrate) that answers POST /v1/screen "
                        "(default: $VIGIL_PAGING_SCREEN_POLICY; unset = the endpoint answers 503)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(fn=cmd_serve)

    paging = subparsers.add_parser(
        "paging", help="manage the paging service's store: migrations and API tokens",
        description="Manage the paging service's database: migrate it, create and revoke API "
                    "tokens (roles: producer may trigger; reviewer may acknowledge, resolve and "
                    "label; admin may do everything).",
        epilog=PAGING_EPILOG, formatter_class=fmt)
    sub = paging.add_subparsers(dest="paging_command", metavar="COMMAND", required=True)

    m = sub.add_parser("migrate", help="bring the database schema up to date",
                       epilog="example:\n  monitor paging migrate --database-url "
                              "postgresql://vigil@db/vigil", formatter_class=fmt)
    _db_arg(m)
    m.set_defaults(fn=cmd_migrate)

    token = sub.add_parser("token", help="create, list and revoke API tokens",
                           epilog=PAGING_EPILOG, formatter_class=fmt)
    tsub = token.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    c = tsub.add_parser("create", help="create a token and print it (once)",
                        epilog="example:\n  monitor paging token create --role reviewer "
                               "--name alice", formatter_class=fmt)
    c.add_argument("--role", required=True, choices=ROLES)
    c.add_argument("--name", required=True, help="who or what uses it (shown in audit trails)")
    _db_arg(c)
    c.set_defaults(fn=cmd_token_create)
    ls = tsub.add_parser("list", help="list tokens (never their secrets)")
    _db_arg(ls)
    ls.set_defaults(fn=cmd_token_list)
    r = tsub.add_parser("revoke", help="revoke a token by id",
                        epilog="example:\n  monitor paging token revoke 3", formatter_class=fmt)
    r.add_argument("token_id", type=int)
    _db_arg(r)
    r.set_defaults(fn=cmd_token_revoke)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monitor", description="vigil paging service")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except ValueError as e:  # PagingCliError, bad URLs, bad names: one sentence
        print(f"monitor {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
