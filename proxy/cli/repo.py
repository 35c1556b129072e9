"""``tufproxy repo``: create and maintain a PEP 458 repository from the shell."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from proxy.protocol.bins import bins_for_targets
from proxy.protocol.errors import CommandError
from proxy.protocol.profiles import PROFILES, get_profile
from proxy.repository.keys import KeyURIs, MissingKey
from proxy.repository.keysource import KeyUnavailable
from proxy.repository.signer import ChangeReport, Expiry, Repository, RepositoryError
from proxy.util.progress import Meter

LAYOUT_HELP = """\
Layout of DIR:
  DIR/repository.json     settings (bin count, expiry periods)
  DIR/keys/               private keys (mode 0600): root-*.pem, targets.pem,
                          bins.pem (offline), online.pem (timestamp, snapshot,
                          bin-n); uris.json for keys named by URI (a token, a
                          KMS: no private key here). Never serve this directory.
  DIR/public/             serve this, e.g. python -m http.server -d DIR/public
    metadata/             N.root.json, root.json, timestamp.json,
                          V.snapshot.json, V.targets.json, V.bins.json,
                          V.bin-XXXX.json (consistent snapshots)
    simple/               PEP 503 HTML + PEP 691 JSON pages (TUF targets
                          simple/index.{html,json}, simple/P/index.{html,json})
    packages/P/FILE       distributions and FILE.metadata (PEP 658), each also
                          under SHA256.FILE and SHA512.FILE

Roles (PEP 458): root, targets, bins offline; timestamp, snapshot and every
bin-n signed by one online key; targets delegates to bins, bins to the
bin-n roles by TAP 15 succinct hash delegation. With --layout warehouse:
metadata under tuf-metadata/, targets delegates to bins-N directly, and
each project's HTML page is the only target (path: the project name). Expiry by default: root,
targets, bins 365 days; timestamp, snapshot, bin-n 1 day: run
'tufproxy repo refresh DIR' from cron or a systemd timer (hourly is fine).
"""


def _print_report(verb: str, report: ChangeReport) -> None:
    for name in report.added:
        print(f"added {name}")
    for name in report.unchanged:
        print(f"unchanged {name} (already present with the same contents)")
    for name in report.yanked:
        print(f"yanked {name} (still installable when pinned exactly, PEP 592)")
    for name in report.removed:
        print(f"deleted {name} (no longer a target; its bytes stay on disk for old snapshots)")
    if report.signed:
        top = {r: v for r, v in report.signed.items() if not r.startswith("bin-")}
        bins = sum(1 for r in report.signed if r.startswith("bin-"))
        roles = ", ".join(f"{r} v{v}" for r, v in top.items())
        print(f"{verb}: signed {roles}" + (f" and {bins} bin-n role(s)" if bins else ""))
    else:
        print(f"{verb}: nothing to do")


def _days(value: str) -> timedelta:
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {value!r}") from None
    if days <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 days")
    return timedelta(days=days)


KEY_URI_HELP = """\
Keys by URI (--online-key, --root-key, --targets-key, --bins-key): an RFC 7512
PKCS#11 URI, pkcs11:token=LABEL;object=LABEL?module-path=/path/module.so&pin-source=file:/path
(or id=%01; the PIN may instead come from TUFPROXY_PKCS11_PIN), or any private-key
URI securesystemslib knows (hsm:, awskms:, gcpkms:, azurekms:, hv:, file2:PATH).
init reads the public key from the token or KMS; no private key of such a role is
written under DIR, and DIR/keys/uris.json keeps the URI (never a PIN).
"""


def add_key_arguments(p: argparse.ArgumentParser) -> None:
    """The key options ``repo init`` and ``gateway init`` share."""
    p.add_argument("--root-keys", type=int, help="number of root key files to create (default: 1; not with --root-key)")
    p.add_argument("--root-key", action="append", default=[], metavar="URI",
                   help="a root key by URI (repeat for each; the root keys are then exactly these)")
    p.add_argument("--root-threshold", type=int, default=1, help="signatures a new root needs (PEP 458 recommends >1)")
    p.add_argument("--online-key", metavar="URI", help="the key for timestamp, snapshot and every bin-n, by URI")
    p.add_argument("--targets-key", metavar="URI", help="the targets key, by URI")
    p.add_argument("--bins-key", metavar="URI", help="the bins key, by URI")
    p.add_argument("--quiet", action="store_true", help="no progress bar or line while the first metadata is signed")


BINS_HELP = """\
Bins: --expected-projects N picks the bin count by PEP 458's rule (16,384
bins for 2,273,481 targets; the count doubles when the targets grow
fourfold), counting each project's signed pages; the docs' scaling page
gives the figures. 'rebin' grows the count of a running repository.
"""


def add_bins_arguments(p: argparse.ArgumentParser, default: int) -> None:
    """``--bins N`` or ``--expected-projects N`` (init and rebin of ``repo`` and ``gateway``)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--bins", type=int, help=f"number of hash bins, a power of two (default for init: {default})")
    group.add_argument("--expected-projects", type=int, metavar="N",
                       help="choose the bin count for about N projects by PEP 458's rule (see below)")
    p.set_defaults(default_bins=default)


def chosen_bins(args: argparse.Namespace, layout: str) -> int:
    """The bin count ``--bins`` or ``--expected-projects`` asks for (the default when neither is given)."""
    if args.expected_projects is None:
        return args.default_bins if args.bins is None else args.bins
    if args.expected_projects < 1:
        raise CommandError(f"--expected-projects must be at least 1, not {args.expected_projects}")
    profile = get_profile(layout)
    if profile.files_are_targets:
        raise CommandError(f"the {layout} layout signs every file as a target, so projects do not say how many "
                           "targets it signs: give --bins")
    return bins_for_targets(args.expected_projects * len(profile.signed_formats))


def init_repository(args: argparse.Namespace, **settings: object) -> Repository:
    """``init`` from the shared key and expiry options (one implementation for ``repo`` and ``gateway``)."""
    if args.root_key and args.root_keys is not None:
        raise CommandError("give --root-keys N (key files) or --root-key URI, not both")
    expiry = Expiry(
        root=args.root_expiry, targets=args.offline_expiry, bins=args.offline_expiry,
        timestamp=args.online_expiry, snapshot=args.online_expiry, bin_n=args.online_expiry,
    )
    uris = KeyURIs(online=args.online_key, targets=args.targets_key, bins=args.bins_key, root=tuple(args.root_key))
    bins = chosen_bins(args, str(settings.get("layout", "tufproxy")))
    with Meter("signing the first metadata", unit="roles", quiet=args.quiet) as meter:
        return Repository.init(Path(args.dir), bins=bins, root_keys=args.root_keys or 1,
                               root_threshold=args.root_threshold, expiry=expiry, key_uris=uris, meter=meter,
                               **settings)  # type: ignore[arg-type]


def describe_keys(repo: Repository, args: argparse.Namespace) -> str:
    """Where each key of a new repository is, for ``init`` to print."""
    roots = len(args.root_key) or args.root_keys or 1
    by_uri = [f"--{role}-key" for role in ("online", "targets", "bins") if getattr(args, f"{role}_key")]
    by_uri += ["--root-key"] if args.root_key else []
    files = [name for name, flag in (("root-*.pem", "--root-key"), ("targets.pem", "--targets-key"), ("bins.pem", "--bins-key"),
                                     ("online.pem", "--online-key")) if flag not in by_uri]
    text = f"{roots} root key(s), threshold {args.root_threshold}\n"
    if files:
        text += f"key files in {repo.keys.directory}: {', '.join(files)} (keep all but online.pem offline)\n"
    if by_uri:
        text += f"keys by URI ({', '.join(by_uri)}): recorded in {repo.keys.directory / 'uris.json'}, no private key written\n"
    return text


def _cmd_init(args: argparse.Namespace) -> int:
    repo = init_repository(args, layout=args.layout)
    print(f"initialised {repo.path} ({args.layout} layout): {repo.settings.bins} bins, " + describe_keys(repo, args), end="")
    print(f"serve {repo.public_dir}; pin {repo.metadata_dir / '1.root.json'} in clients")
    return 0


def _cmd_add(args: argparse.Namespace) -> int:
    _print_report("add", Repository.open(Path(args.dir)).add([Path(f) for f in args.files]))
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    repo = Repository.open(Path(args.dir))
    _print_report("remove", repo.remove(args.file, delete=args.delete, reason=args.reason))
    return 0


def _cmd_refresh(args: argparse.Namespace) -> int:
    _print_report("refresh", Repository.open(Path(args.dir)).refresh(force=args.force))
    return 0


def rebin_repository(repo: Repository, args: argparse.Namespace) -> int:
    """``rebin`` (one implementation for ``repo`` and ``gateway``): grow the bin count, signed by the bins key."""
    if args.bins is None and args.expected_projects is None:
        raise CommandError("give the new bin count: --bins N or --expected-projects N")
    before = repo.settings.bins
    report = repo.rebin(chosen_bins(args, repo.profile.name))
    print(f"rebinned {repo.path}: {before} -> {repo.settings.bins} bins, {repo.profile.bin_delegator} "
          f"v{report.signed[repo.profile.bin_delegator]}, snapshot v{report.signed['snapshot']}")
    return 0


def add_rebin_parser(sub: argparse._SubParsersAction, cmd: Callable[[argparse.Namespace], int]) -> None:
    """The ``rebin`` action of ``repo`` and ``gateway``."""
    p = sub.add_parser(
        "rebin",
        help="grow the number of hash bins (needs the bins key; edges and mirrors follow as any update)",
        description="Re-sign the bins role (the targets role with --layout warehouse) with its offline key to "
        "delegate to more hash bins, and move every target to its new bin, in one snapshot. Clients that "
        "trust the old metadata follow it as any update. Run it with the repository in service.",
        epilog=BINS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR")
    add_bins_arguments(p, 0)
    p.set_defaults(func=_guarded(cmd))


def _cmd_rebin(args: argparse.Namespace) -> int:
    return rebin_repository(Repository.open(Path(args.dir)), args)


def _cmd_rotate_root(args: argparse.Namespace) -> int:
    repo = Repository.open(Path(args.dir))
    report = repo.rotate_root(new_keys=args.new_keys, threshold=args.threshold, rotate_online=args.rotate_online)
    _print_report("rotate-root", report)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    status = Repository.open(Path(args.dir)).status()
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"repository {status['path']} (serve {status['served_tree']})")
    for role, info in status["roles"].items():
        flag = "  EXPIRED" if info["expired"] else ""
        print(f"  {role:<10} v{info['version']:<6} expires {info['expires']}{flag}")
    bins = status["bins"]
    print(f"  bin-n      {bins['count']} roles, earliest expiry {bins['earliest_expiry']}")
    print(f"  {status['targets']} targets, {status['projects']} projects")
    return 0


def _guarded(func):
    """Signer errors become one line on stderr and exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (RepositoryError, MissingKey, KeyUnavailable) as e:
            raise CommandError(str(e)) from e
        except OSError as e:
            raise CommandError(f"{e.filename or ''}: {e.strerror or e}") from e

    return run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy repo`` and its subcommands."""
    repo = subparsers.add_parser(
        "repo",
        description="Create and maintain a PEP 458 repository: keys, signed TUF metadata, "
        "simple index pages and distribution files, as a static tree any HTTP server can serve.",
        epilog=LAYOUT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = repo.add_subparsers(dest="repo_command", metavar="ACTION", required=True)

    p = sub.add_parser("init", help="create keys and an empty signed repository in DIR", epilog=KEY_URI_HELP + "\n" + BINS_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--layout", choices=sorted(PROFILES), default="tufproxy",
                   help="tufproxy (default: pages, files and .metadata are targets) or warehouse "
                   "(PyPI's PEP 458 draft: one target per project page, blake2b-256; see the docs: guides/warehouse.md)")
    add_bins_arguments(p, 16384)
    add_key_arguments(p)
    p.add_argument("--root-expiry", type=_days, default=timedelta(days=365), metavar="DAYS", help="root lifetime (default: 365)")
    p.add_argument("--offline-expiry", type=_days, default=timedelta(days=365), metavar="DAYS",
                   help="targets and bins lifetime (default: 365)")
    p.add_argument(
        "--online-expiry",
        type=_days,
        default=timedelta(days=1),
        metavar="DAYS",
        help="timestamp, snapshot and bin-n lifetime (default: 1)",
    )
    p.set_defaults(func=_guarded(_cmd_init))

    p = sub.add_parser("add", help="add wheels and sdists; re-sign their bins, pages, snapshot, timestamp")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("files", metavar="FILE", nargs="+", help="a .whl, .tar.gz or .zip distribution")
    p.set_defaults(func=_guarded(_cmd_add))

    p = sub.add_parser(
        "remove",
        help="yank a file (default; PEP 592) or delete it (--delete)",
        description="Yank FILE: it stays a signed target and installable when pinned exactly (==), "
        "but resolvers skip it. With --delete it stops being a target and disappears from its page.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("file", metavar="FILE", help="the distribution's file name")
    p.add_argument("--delete", action="store_true", help="delete instead of yanking")
    p.add_argument("--reason", help="yank reason shown to users")
    p.set_defaults(func=_guarded(_cmd_remove))

    p = sub.add_parser(
        "refresh",
        help="re-sign timestamp, snapshot and bin-n before they expire (run from cron)",
        description="Re-sign every role past half its lifetime with the keys present. "
        "Prints 'nothing to do' when nothing is due.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--force", action="store_true", help="re-sign all online roles now")
    p.set_defaults(func=_guarded(_cmd_refresh))

    add_rebin_parser(sub, _cmd_rebin)

    p = sub.add_parser(
        "rotate-root",
        help="publish a new root signed by the old root's keys and its own",
        description="Publish root N+1. Clients holding root N accept it because a threshold of "
        "root N's keys signs it. Old root keys move to keys/retired/.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--new-keys", type=int, metavar="N", help="replace the root keys with N new ones")
    p.add_argument("--threshold", type=int, help="new root threshold")
    p.add_argument("--rotate-online", action="store_true", help="also replace the online key (timestamp, snapshot, bin-n)")
    p.set_defaults(func=_guarded(_cmd_rotate_root))

    p = sub.add_parser("status", help="versions and expiry of every role, target and project counts")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guarded(_cmd_status))
