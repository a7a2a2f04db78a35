"""`monitor models pack|verify`: the default models shipped with vigil (``make models``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import vigil.paths
from monitor.cli.common import CliError


def cmd_pack(args: argparse.Namespace) -> int:
    from monitor.shipped import pack, shipped_dir

    policy = Path(args.policy).expanduser() if args.policy else vigil.paths.policy()
    if not policy.exists():
        raise CliError(f"{policy}: no calibrated policy to pack; build one with "
                       "`monitor calibrate --defaults` first")
    out = Path(args.out) if args.out else shipped_dir()
    manifest = pack(policy, out, log=lambda m: print(m, file=sys.stderr))
    print(f"wrote {out} ({manifest['bytes'] / 1e6:.1f} MB, {len(manifest['files'])} files, "
          f"code {manifest['code_version']})", file=sys.stderr)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from monitor.shipped import MANIFEST, shipped_dir, verify

    folder = Path(args.folder) if args.folder else shipped_dir()
    problems = verify(folder)
    for p in problems:
        print(f"{folder}: {p}", file=sys.stderr)
    if problems:
        return 1
    m = json.loads((folder / MANIFEST).read_text())
    print(f"{folder}: {len(m['files'])} files as packed (code {m['code_version']}, "
          f"{m['built']})", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "models", help="pack or verify the default models shipped with vigil",
        description="The default models ship with vigil in vigil/shipped/ (a calibrated policy "
        "and its bundles: JSON and safetensors only, with a manifest of SHA-256s, code version, "
        "data hashes and metrics; a fully fine-tuned judge packed as int4 deltas of the tensors "
        "training changed). `make models` builds them with `monitor calibrate --defaults` in a "
        "fresh VIGIL_HOME and packs them with `monitor models pack`.")
    s = p.add_subparsers(dest="models_command", required=True)
    pk = s.add_parser("pack", help="copy a calibrated policy and its bundles into one folder")
    pk.add_argument("--policy", help="the policy (default: $VIGIL_HOME/models/policy.json)")
    pk.add_argument("--out", help="the folder (default: the package's vigil/shipped/)")
    pk.set_defaults(fn=cmd_pack)
    v = s.add_parser("verify", help="check a packed folder against its manifest")
    v.add_argument("folder", nargs="?", help="the folder (default: vigil/shipped/)")
    v.set_defaults(fn=cmd_verify)
