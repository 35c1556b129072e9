"""``tufproxy gateway advisories``: import OSV advisories into a gateway, and show what is loaded and blocked.

``import DIR FILE...`` merges records (single JSON files, directories of
them, zips laid out like OSV's ``all.zip``) into ``DIR/gateway/advisories.json``;
a running gateway sees the change within a second and republishes the
projects it names.  ``DIR`` alone lists the store and the blocks in force (the
files the gateway's ledger has pinned that it keeps out) under the policy
``serve`` last recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.gateway.advisories import SourceError, Store, import_into, load, sign_store, store_path
from proxy.gateway.ledger import Ledger
from proxy.gateway.pages import withheld
from proxy.gateway.policy import Policy, PolicyError, resolve_policy
from proxy.protocol import index
from proxy.protocol.errors import CommandError
from proxy.protocol.osv import Block
from proxy.repository import Repository, RepositoryError
from proxy.util.progress import Meter

USAGE = "tufproxy gateway advisories [-h] [--json] [--quiet] (import DIR FILE... | DIR)"


def _policy(policy_path: Path) -> Policy:
    try:
        return resolve_policy(None, {}, json.loads(policy_path.read_text()), str(policy_path))
    except FileNotFoundError:
        return Policy()  # the defaults serve would start with
    except (OSError, ValueError, PolicyError) as e:
        raise CommandError(f"cannot read {policy_path}: {e}") from None


def blocks_in_force(gateway_dir: Path, store: Store, policy: Policy) -> list[Block]:
    """The files the gateway has seen (its ledger's pins) that the store keeps out under ``policy``."""
    projects = store.advisories.projects()
    found: list[Block] = []
    for (project, filename), pin in sorted(Ledger(gateway_dir).pins.items()):
        if project in projects:
            dist = index.DistFile(filename, pin.url, dict(pin.hashes))
            block = withheld(store.advisories, policy, project, dist, pin)
            if block is not None and not block.allowed:
                found.append(block)
    return found


def _show(gateway_dir: Path, policy_path: Path, as_json: bool) -> int:
    try:
        store = load(store_path(gateway_dir))
    except (OSError, ValueError) as e:  # RecordError is a ValueError
        raise CommandError(f"cannot read {store_path(gateway_dir)}: {e}") from None
    policy = _policy(policy_path)
    blocks = blocks_in_force(gateway_dir, store, policy)
    out: dict[str, Any] = {
        "records": len(store.advisories), "counts": store.counts(), "newest_modified": store.newest_modified(),
        "last_import": store.imported, "sources": store.sources[-5:],
        "policy": {k: v for k, v in policy.to_json().items() if k in ("block_malicious", "block_vulnerable", "allow_advisory")},
        "blocks_in_force": [b.audit_fields() for b in blocks],
    }
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['records']} advisories; newest modified {out['newest_modified'] or '-'}; "
          f"last import {out['last_import'] or 'never'}")
    for kind, count in out["counts"].items():
        print(f"  {kind}: {count}")
    rules = out["policy"]
    print(f"policy: block-malicious {rules['block_malicious']}, block-vulnerable {rules['block_vulnerable']}, "
          f"allow-advisory {', '.join(rules['allow_advisory']) or 'none'}")
    print(f"blocks in force (files the gateway has seen, kept out of its signed pages): {len(blocks)}")
    for b in blocks:
        aliases = f" ({', '.join(b.aliases)})" if b.aliases else ""
        print(f"  {b.rule} {b.id}{aliases} {b.severity or '-'}: {b.project} {b.version or '?'} {b.filename}")
    return 0


def _import(gateway_dir: Path, files: list[str], quiet: bool = False) -> int:
    if not files:
        raise CommandError("import: give DIR and at least one FILE (an OSV record, a directory of them, or a zip)")
    if not gateway_dir.is_dir():
        raise CommandError(f"{gateway_dir.parent} is not a gateway (no {gateway_dir.name}/); create one with "
                           "'tufproxy gateway init'")
    try:
        with Meter("importing advisories", unit="records", quiet=quiet) as meter:
            store, report = import_into(store_path(gateway_dir), [Path(f) for f in files], meter=meter)
        sign_store(Repository.open(gateway_dir.parent), store_path(gateway_dir))
    except SourceError as e:
        raise CommandError(str(e)) from None
    except ValueError as e:  # the store itself: nothing was written
        raise CommandError(f"cannot read {store_path(gateway_dir)}: {e}") from None
    except RepositoryError as e:
        raise CommandError(f"imported, but the advisory target could not be signed: {e}") from None
    warning = report.warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"read {report.read} record(s): {report.pypi} name PyPI packages, {report.kept} new or newer, "
          f"{len(report.skipped)} skipped; {len(store.advisories)} advisories loaded")
    return 0


def register(sub: argparse._SubParsersAction, gateway_dir: Callable[[Path], Path], policy_file: Callable[[Path], Path]) -> None:
    """Add ``tufproxy gateway advisories`` (``gateway_dir`` and ``policy_file`` say where DIR keeps its state)."""
    p = sub.add_parser(
        "advisories",
        usage=USAGE,
        help="import OSV advisories (malicious and vulnerable releases) and list what they block",
        description="'import DIR FILE...' merges OSV records (JSON files, directories of them, zips laid out "
        "like OSV's all.zip; only PyPI packages count) into DIR/gateway/advisories.json: a newer 'modified' "
        "replaces a record, 'withdrawn' lifts it, and malformed records are skipped with a warning naming "
        "them. A running gateway republishes the projects an import changes within seconds. 'DIR' alone "
        "lists what is loaded and the blocks in force under the policy serve recorded "
        "(--block-malicious, --block-vulnerable, --allow-advisory).",
    )
    p.add_argument("words", nargs="+", metavar="import DIR FILE... | DIR", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="machine-readable listing")
    p.add_argument("--quiet", action="store_true", help="import: no progress bar or line while records are read")

    def run(args: argparse.Namespace) -> int:
        words = args.words
        if words[0] == "import" and len(words) > 1:
            directory = Path(words[1])
            return _import(gateway_dir(directory), words[2:], args.quiet)
        if len(words) != 1:
            raise CommandError(f"give 'import DIR FILE...' or one DIR (usage: {USAGE})")
        directory = Path(words[0])
        if not gateway_dir(directory).is_dir():
            raise CommandError(f"{directory} is not a gateway (no {gateway_dir(directory)})")
        return _show(gateway_dir(directory), policy_file(directory), args.json)

    p.set_defaults(func=run)
