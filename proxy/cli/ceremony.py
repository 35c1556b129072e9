"""``tufproxy gateway root draft|sign|status|publish``: the offline root ceremony from the shell.

``sign`` and ``status`` need only the package, the draft file and (for
``sign``) one key: no repository, no gateway, no network.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from proxy.cli.repo import _days
from proxy.repository import ceremony
from proxy.repository.signer import Repository
from proxy.storage.audit import AuditLog
from proxy.util.atomic import atomic_write

CEREMONY_HELP = """\
The ceremony (docs/guides/keys.md): on the gateway host
  tufproxy gateway root draft DIR --online-key URI -o next-root.json
each key holder, on their own machine, with only tufproxy, the draft and their key:
  tufproxy gateway root sign next-root.json --key URI
anyone, to see who signed and what is missing:
  tufproxy gateway root status next-root.json
and on the gateway host (the running gateway takes it up without a restart):
  tufproxy gateway root publish DIR next-root.json
"""


def register(sub: argparse._SubParsersAction, open_repo: Callable[[Path], Repository],
             guarded: Callable) -> None:
    """Add ``root`` and its four actions under ``sub``; ``open_repo`` opens DIR (checking its layout)."""
    root = sub.add_parser("root", help="rotate root, online, targets or bins keys in an offline ceremony",
                          description="Draft the next root, have each key holder sign it offline, publish it.",
                          epilog=CEREMONY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = root.add_subparsers(dest="root_command", metavar="ACTION", required=True)

    def cmd_draft(args: argparse.Namespace) -> int:
        d = ceremony.draft(open_repo(Path(args.dir)), add_root_keys=args.add_root_key, remove_root_keys=args.remove_root_key,
                           root_threshold=args.root_threshold, online_key=args.online_key, targets_key=args.targets_key,
                           bins_key=args.bins_key, expires=args.expires)
        atomic_write(Path(args.output), d.to_bytes(), mode=0o644)
        print(f"wrote {args.output}: root v{d.root.signed.version}" + "".join(
            f", {n} v{md.signed.version}" for n, md in d.roles.items() if n != "root") + ", unsigned")
        _print_status(d)
        return 0

    def cmd_sign(args: argparse.Namespace) -> int:
        d = ceremony.Draft.read(Path(args.file))
        for uri in args.key:
            signed = ceremony.sign(d, uri)
            print(f"signed {', '.join(signed)}" if signed else "already signed by this key: nothing to do")
        atomic_write(Path(args.file), d.to_bytes(), mode=0o644)
        _print_status(d)
        return 0

    def cmd_status(args: argparse.Namespace) -> int:
        _print_status(ceremony.Draft.read(Path(args.file)))
        return 0

    def cmd_publish(args: argparse.Namespace) -> int:
        draft = ceremony.Draft.read(Path(args.file))
        signed = ceremony.publish(draft, open_repo(Path(args.dir)))
        print("published " + ", ".join(f"{r} v{v}" for r, v in signed.items() if not r.startswith("bin-"))
              + f" and {sum(1 for r in signed if r.startswith('bin-'))} bin-n role(s)")
        audit = AuditLog(args.audit_log)
        try:
            audit.published_root(**ceremony.record(draft))
        finally:
            audit.close()
        return 0

    p = actions.add_parser("draft", help="write the next root version, unsigned, to FILE")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--add-root-key", action="append", default=[], metavar="URI|PUBKEYFILE", help="a root key to add")
    p.add_argument("--remove-root-key", action="append", default=[], metavar="KEYID",
                   help="a root key to remove (a keyid prefix)")
    p.add_argument("--root-threshold", type=int, metavar="N", help="root signatures the new root needs")
    p.add_argument("--online-key", metavar="URI", help="a new key for timestamp, snapshot and every bin-n")
    p.add_argument("--targets-key", metavar="URI", help="a new targets key")
    p.add_argument("--bins-key", metavar="URI", help="a new bins key")
    p.add_argument("--expires", type=_days, metavar="DAYS", help="the new root's lifetime (default: the repository's)")
    p.add_argument("-o", "--output", required=True, metavar="FILE")
    p.set_defaults(func=guarded(cmd_draft))

    p = actions.add_parser("sign", help="add your key's signature to a draft (offline; twice is a no-op)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--key", action="append", required=True, metavar="URI", help="the key to sign with (repeatable)")
    p.set_defaults(func=guarded(cmd_sign))

    p = actions.add_parser("status", help="who signed a draft and how many signatures are missing")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=guarded(cmd_status))

    p = actions.add_parser("publish", help="check a signed draft against DIR's root and publish it")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--audit-log", type=Path, metavar="FILE", help="append the audit record here (default: stdout)")
    p.set_defaults(func=guarded(cmd_publish))


def _print_status(d: ceremony.Draft) -> None:
    for row in ceremony.status(d):
        signed = ", ".join(k[:16] for k in row["signed"]) or "nobody"
        need = f"{row['missing']} missing" if row["missing"] else "complete"
        print(f"  {row['role']} v{row['version']} under {row['by']}: {len(row['signed'])}/{row['threshold']} ({need}); "
              f"signed by {signed}")
    if not any(r["missing"] for r in ceremony.status(d)):
        print("ready to publish")
