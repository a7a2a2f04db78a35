"""`monitor dashboards`: export vigil's Grafana dashboards for file provisioning, or push them."""

from __future__ import annotations

import argparse
import os
import textwrap
from typing import Any

from monitor.cli.common import CliError

EPILOG = textwrap.dedent(
    """\
    dashboards (uids): vigil-overview, vigil-recall, vigil-rl-health; all query the
    Prometheus data source uid vigil-prometheus (or any chosen in the dashboard).

    examples:
      monitor dashboards export --out grafana --prometheus-url http://127.0.0.1:9090
      GF_PATHS_PROVISIONING=$PWD/grafana/provisioning grafana server ...   # then start Grafana
      monitor dashboards export --out grafana --dashboards-path /var/lib/grafana/dashboards/vigil
                                        # the path where a container mounts grafana/dashboards
      export GRAFANA_TOKEN=glsa_...     # service-account token: Editor (Admin to add the source)
      monitor dashboards push --url http://grafana:3000 --prometheus-url http://prometheus:9090

    environment:
      GRAFANA_URL, GRAFANA_TOKEN   defaults of push's --url and --token
    """
)


def cmd_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dashboards.provision import export_dashboards

    try:
        written = export_dashboards(Path(args.out), args.prometheus_url,
                                    dashboards_path=args.dashboards_path, folder=args.folder)
    except OSError as e:
        raise CliError(f"cannot write to {args.out}: {e.strerror or e}") from None
    for path in written:
        print(path)
    provisioning = (Path(args.out) / "provisioning").resolve()
    print(f"{len(written)} files written; point Grafana's provisioning path at {provisioning} "
          f"(GF_PATHS_PROVISIONING={provisioning})")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from dashboards.provision import GrafanaError, push_dashboards

    url = args.url or os.environ.get("GRAFANA_URL")
    token = args.token or os.environ.get("GRAFANA_TOKEN")
    if not url:
        raise CliError("no Grafana to push to: pass --url or set GRAFANA_URL")
    if not token:
        raise CliError(
            "no Grafana token: pass --token or set GRAFANA_TOKEN (a service-account token "
            "with the Editor role; Admin to create the data source)")
    try:
        result = push_dashboards(url, token, prometheus_url=args.prometheus_url,
                                 folder=args.folder, timeout_s=args.timeout)
    except GrafanaError as e:
        raise CliError(str(e)) from None
    print(f"Grafana {result.grafana_version} at {result.grafana_url}")
    if result.datasource == "unchecked":
        print(f"data source {result.datasource_uid}: not checked (the token may not read data "
              "sources; an Admin's token creates it, or provision it with `monitor dashboards "
              "export`)")
    else:
        print(f"data source {result.datasource_uid}: {result.datasource}")
    print(f"folder {args.folder!r} (uid {result.folder_uid}): {result.folder}")
    for d in result.dashboards:
        version = f" (version {d.version})" if d.version is not None else ""
        print(f"dashboard {d.uid}: {d.url}{version}")
    return 0


def add_parser(sub: Any) -> None:
    """Add ``dashboards`` (export, push) to the ``monitor`` command line."""
    p = sub.add_parser(
        "dashboards",
        help="export the Grafana dashboards for provisioning, or push them to a Grafana",
        description="vigil's Grafana dashboards (overview, recall, RL health), built as code: "
        "write them with Grafana's provisioning files, or create them in a running Grafana "
        "through its HTTP API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    e = actions.add_parser(
        "export",
        help="write the dashboards' JSON and Grafana provisioning files",
        description="Write DIR/dashboards/<uid>.json, DIR/provisioning/dashboards/vigil.yaml "
        "(a file provider for them) and DIR/provisioning/datasources/vigil.yaml (the "
        "Prometheus data source, uid vigil-prometheus). The output is the same byte for "
        "byte on every run.",
        epilog="example:\n  monitor dashboards export --out grafana --prometheus-url "
        "http://127.0.0.1:9090",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.set_defaults(fn=cmd_export)
    e.add_argument("--out", default="grafana", metavar="DIR",
                   help="output directory (default: ./grafana)")
    e.add_argument("--prometheus-url", default="http://prometheus:9090", metavar="URL",
                   help="Prometheus as Grafana's server reaches it (default: "
                   "http://prometheus:9090)")
    e.add_argument("--dashboards-path", metavar="PATH",
                   help="where Grafana reads the dashboard files (default: the absolute path of "
                   "DIR/dashboards; set it when Grafana mounts them elsewhere)")
    e.add_argument("--folder", default="vigil", help="Grafana folder (default: vigil)")

    q = actions.add_parser(
        "push",
        help="create or update the data source, folder and dashboards in a running Grafana",
        description="Push through Grafana's HTTP API with a service-account token: create the "
        "Prometheus data source (uid vigil-prometheus) when missing, the folder when missing, "
        "and create or overwrite each dashboard in it.",
        epilog="example:\n  GRAFANA_TOKEN=glsa_... monitor dashboards push --url "
        "http://grafana:3000 --prometheus-url http://prometheus:9090",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.set_defaults(fn=cmd_push)
    q.add_argument("--url", metavar="URL", help="Grafana's URL (default: $GRAFANA_URL)")
    q.add_argument("--token", metavar="TOKEN",
                   help="a service-account token (default: $GRAFANA_TOKEN)")
    q.add_argument("--prometheus-url", metavar="URL",
                   help="Prometheus as Grafana's server reaches it; sets the data source's URL "
                   "(default: keep an existing data source, create a missing one with "
                   "http://prometheus:9090)")
    q.add_argument("--folder", default="vigil", help="Grafana folder (default: vigil)")
    q.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="per-request timeout (default 10)")
