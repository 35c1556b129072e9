"""``tufproxy mirror sync`` and ``tufproxy mirror verify`` on the command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from proxy.mirror.lockfiles import read_lock
from proxy.mirror.progress import Progress
from proxy.mirror.resolve import resolve
from proxy.mirror.select import (
    FileFilter,
    SelectionError,
    Wanted,
    merge,
    parse_requirement,
    read_requirements,
)
from proxy.mirror.sync import MirrorError, SyncOptions, sync
from proxy.mirror.verify import verify_tree
from proxy.protocol.errors import CommandError, TrustError
from proxy.protocol.options import ConfigError, parse_datetime, parse_size, parsed
from proxy.protocol.profiles import get_profile
from proxy.serving.config import add_arguments as add_serve_arguments
from proxy.serving.config import cpu_count
from proxy.serving.config import resolve as serve_config
from proxy.serving.serve import start as start_edge
from proxy.storage.audit import redact_url
from proxy.transport.credentials import OriginAuth
from proxy.trust.provenance import SigstoreTrust, parse_trust_root

# The layouts a mirror can be synced from (the warehouse draft signs no root list and no JSON page).
_PROFILES = ("tufproxy", "gateway")


def _upstream(value: str) -> str:
    """An http(s) URL with a host, or a directory that exists (a signed tree on disk)."""
    url = urlsplit(value)
    if (url.scheme in ("http", "https") and url.hostname) or (not url.scheme and Path(value).is_dir()):
        return value
    raise CommandError(f"--upstream must be an http(s) URL or an existing directory, not {redact_url(value)!r}")


def _options(args: argparse.Namespace) -> SyncOptions:
    auth = OriginAuth()
    upstreams = [_upstream(u) for u in args.upstream]
    if len(upstreams) > 1 and not all(urlsplit(u).scheme in ("http", "https") for u in upstreams):
        raise CommandError("--upstream repeats only with URLs (the gateways or mirrors of one repository): "
                           "a directory is the whole upstream")
    # user:password@ or netrc: sent to that origin only, never printed
    upstreams = [auth.add(u) if urlsplit(u).scheme in ("http", "https") else u for u in upstreams]
    try:
        wanted = [parse_requirement(p) for p in args.project or ()]
        for req_file in args.requirements or ():
            wanted += read_requirements(Path(req_file))
        for lock in args.from_lock or ():
            wanted += read_lock(Path(lock))
        file_filter = FileFilter.of(
            spec=args.version_spec, platforms=args.platform or (), abis=args.abi or (),
            python_versions=args.python_version or (), sdists=not args.no_sdist, yanked=not args.exclude_yanked,
        )
        max_file_size = parsed("--max-file-size", parse_size, args.max_file_size)
    except OSError as e:
        raise CommandError(f"cannot read requirements file {e.filename}: {e.strerror or e}") from e
    except (SelectionError, ConfigError) as e:
        raise CommandError(str(e)) from e
    return SyncOptions(
        upstream=tuple(upstreams), root=Path(args.root), dest=Path(args.dest), projects=tuple(merge(wanted)),
        all_projects=args.all, filter=file_filter, jobs=args.jobs, keep_going=args.keep_going,
        resign_with=Path(args.resign_with) if args.resign_with else None,
        audit_log=Path(args.audit_log) if args.audit_log else None, max_file_size=max_file_size,
        metadata_path=args.metadata_path, profile=get_profile(args.profile) if args.profile else None, auth=auth,
        ca_bundle=Path(args.ca_bundle) if args.ca_bundle else None, full=args.full,
    )


def _resolving(args: argparse.Namespace, options: SyncOptions) -> list[str]:
    """The requirement lines ``--resolve`` hands to pip: --requirements' by default, --project's too if asked."""
    if args.resolve == "no":
        return []
    named = set() if args.resolve == "yes" else {line for p in args.project or () for line in
                                                 parse_requirement(p).requirements}
    return [line for w in options.projects for line in w.requirements if line not in named]


async def _closure(args: argparse.Namespace, requirements: list[str]) -> list[Wanted]:
    """``requirements``' dependency closure, resolved by pip through a temporary edge on 127.0.0.1 that verifies
    what it serves against --root (so pip reads only verified pages and metadata)."""
    with tempfile.TemporaryDirectory(prefix="tufproxy-resolve-edge-") as cache:
        argv = ["--root", args.root, "--cache-dir", cache, "--listen", "127.0.0.1:0", "--workers", "1"]
        if Path(args.upstream[0]).is_dir():
            argv += ["--repository", args.upstream[0]]
        else:
            argv += [*(w for u in args.upstream for w in ("--upstream", u)), "--metadata-path", args.metadata_path]
            argv += ["--ca-bundle", args.ca_bundle] if args.ca_bundle else []
        argv += ["--profile", args.profile] if args.profile else []
        parser = argparse.ArgumentParser(allow_abbrev=False)
        add_serve_arguments(parser)
        try:
            config = serve_config(parser.parse_args(argv), environ={})
            running = await start_edge(config)
        except (ConfigError, OSError, TrustError) as e:
            raise CommandError(f"--resolve: cannot start the edge pip resolves through: {e}") from None
        try:
            return await asyncio.to_thread(
                resolve, f"http://127.0.0.1:{running.port}/simple/", requirements, args.python_version or (),
                args.platform or (), args.abi or ())
        except SelectionError as e:
            raise CommandError(f"--resolve: {e}") from None
        finally:
            await running.stop()


def _cmd_sync(args: argparse.Namespace) -> int:
    options = _options(args)
    progress = Progress(sys.stderr, quiet=args.quiet)
    requirements = _resolving(args, options)
    if requirements:
        closure = asyncio.run(_closure(args, requirements))
        added = {w.project for w in closure} - {w.project for w in options.projects}
        options = dataclasses.replace(options, projects=tuple(merge([*options.projects, *closure])))
        progress.note(f"resolved {len(requirements)} requirement(s) with pip: {len(added)} more project(s) "
                      f"their dependencies need" + (f" ({', '.join(sorted(added)[:10])}"
                                                    f"{', ...' if len(added) > 10 else ''})" if added else ""))
    try:
        result = asyncio.run(sync(options, progress))
    except MirrorError as e:
        raise CommandError(str(e)) from e
    print(result.layout)
    print(progress.summary())
    if result.published_snapshot is None:
        print(f"nothing published: {options.dest} still serves its previous state (rerun to resume)")
    else:
        print(f"published upstream snapshot v{result.published_snapshot} in {options.dest}")
    if result.resigned is not None:
        r = result.resigned
        print(f"re-signed into {options.resign_with}: {len(r.added)} added, {len(r.unchanged)} unchanged, "
              f"{len(r.yanked)} yanked")
    if progress.counts.refused:
        print(f"refusals are recorded in {options.audit_log or options.dest / '.mirror' / 'audit.log'}")
    return result.exit_code(options.keep_going)


def _cmd_verify(args: argparse.Namespace) -> int:
    try:
        until = parsed("--allow-expired-until", parse_datetime, args.allow_expired_until) if args.allow_expired_until else None
        with tempfile.TemporaryDirectory(prefix="tufproxy-sigstore-") as home:
            sigstore = None
            if args.provenance == "yes":
                # Offline always: a tree across an air gap is checked with the root that came with it, or FILE.
                sigstore = SigstoreTrust(parsed("--sigstore-trust-root", parse_trust_root, args.sigstore_trust_root),
                                         offline=True, processes=min(args.jobs, cpu_count()))
                sigstore.prepare(Path(home))
            try:
                report = asyncio.run(verify_tree(Path(args.dir), Path(args.root) if args.root else None, jobs=args.jobs,
                                                 allow_expired_until=until,
                                                 profile=get_profile(args.profile) if args.profile else None,
                                                 sigstore=sigstore))
            finally:
                if sigstore is not None:
                    sigstore.close()
    except (OSError, ValueError) as e:
        raise CommandError(str(e)) from e
    sound = report.sound(strict=args.strict)
    if args.json:
        print(json.dumps({"sound": sound, "targets": report.targets, "checked": report.checked,
                          "metadata_error": report.metadata_error,
                          "missing": report.missing, "corrupt": [{"name": n, "why": w} for n, w in report.corrupt],
                          "extra": report.extra, "expired_metadata_used_for": report.expired,
                          "blocked": [b.audit_fields() for b in report.blocked],
                          "provenance_verified": report.attested,
                          "provenance_refused": [{"name": n, "why": w} for n, w in report.provenance]}, indent=2))
        return 0 if sound else 1
    if report.metadata_error:
        print(f"metadata refused: {report.metadata_error}")
    for name in report.missing:
        print(f"missing {name}")
    for name, why in report.corrupt:
        print(f"corrupt {name}: {why}")
    for name in report.extra:
        print(f"extra {name}")
    for name, why in report.provenance:
        print(f"provenance refused {name}: {why}")
    for b in report.blocked:
        print(f"BLOCKED by advisory {b.id} ({b.rule}, severity {b.severity or '-'}): {b.project} {b.version or '?'} {b.filename}")
    if report.expired:
        print(f"WARNING: {len(report.expired)} target(s) verified only under --allow-expired-until: their metadata has expired")
    print(f"{'sound' if sound else 'NOT SOUND'}: {report.targets} target(s) checked ({report.checked} file(s) on "
          f"disk), {len(report.missing)} missing, "
          f"{len(report.corrupt)} corrupt, {len(report.extra)} extra"
          + (f"; {report.attested} provenance object(s) verified with Sigstore, {len(report.provenance)} refused"
             if report.attested or report.provenance else ""))
    return 0 if sound else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy mirror`` with ``sync`` and ``verify``."""
    mirror = subparsers.add_parser(
        "mirror", description="Copy a selection of a TUF-signed index into a tree that stays verifiable offline, "
        "and check such a tree after carrying it across.",
    )
    sub = mirror.add_subparsers(dest="mirror_command", metavar="ACTION", required=True)

    p = sub.add_parser(
        "sync", help="fetch, verify and write a selection of an upstream's pages and files",
        description="Every page, distribution and .metadata file is checked against the upstream's signed "
        "TUF metadata (rooted in --root) before it is written under DEST; a refused one is not written, is "
        "audited and makes the exit status 1 (unless --keep-going). Reruns fetch only what changed and resume "
        "an interrupted sync. DEST keeps the upstream's metadata ('tufproxy serve --repository DEST' serves it); "
        "--resign-with also publishes the files in a 'tufproxy repo' repository under the site's own keys. "
        "Through a 'tufproxy gateway', selected projects it has not published yet are "
        "published first, and each file is verified against its signed page's hashes.",
    )
    p.add_argument(
        "--upstream", required=True, action="append", metavar="URL|DIR", help="base URL of the signed index (or a "
        "directory holding a synced tree); user:password@ in it (or netrc) authenticates to that origin only; "
        "repeat for every gateway of a replica group or mirror of the repository, tried in order (one that is down "
        "or failing is passed over)"
    )
    p.add_argument("--ca-bundle", metavar="FILE", help="CA certificates to verify the upstream's TLS with (a private CA)")
    p.add_argument("--root", required=True, metavar="FILE", help="the upstream's root.json to pin")
    p.add_argument("--dest", required=True, metavar="DIR", help="the mirror tree to write (created if absent)")
    p.add_argument(
        "--metadata-path",
        default="metadata/",
        metavar="PATH",
        help="where TUF metadata lives, relative to the upstream (default: metadata/)",
    )
    p.add_argument(
        "--profile",
        choices=_PROFILES,
        help="the upstream's layout, only to insist: it is read from the signed metadata. 'gateway' for a "
        "'tufproxy gateway' (a selected project it has not published yet is published first, by the "
        "edge's miss protocol; files are verified against their signed page's hashes) (default: detected)",
    )
    sel = p.add_argument_group("selection")
    sel.add_argument(
        "--project",
        action="append",
        metavar="NAME[SPEC]",
        help="a project to mirror, optionally with versions ('lib>=1.0'); repeatable",
    )
    sel.add_argument(
        "--requirements",
        action="append",
        metavar="FILE",
        help="mirror the projects of a requirements file and the files it includes with -r (version specifiers "
        "honoured; a line with --hash takes only the files with those hashes, and fails if none has one)",
    )
    sel.add_argument(
        "--from", dest="from_lock", action="append", metavar="FILE",
        help="mirror exactly the files a lock file locks, checked against its hashes and the signed metadata: "
        "pylock.toml (PEP 751), uv.lock, or a requirements file with == and --hash on every line; repeatable",
    )
    sel.add_argument("--all", action="store_true", help="mirror every project of the upstream's root list")
    sel.add_argument(
        "--resolve", choices=("auto", "yes", "no"), default="auto",
        help="add the dependency closure of the requirements, extras included, at the versions pip's resolver "
        "chooses (pip install --dry-run --report, through a temporary edge verifying the upstream), once for each "
        "--python-version x --platform given (none: this Python; with either, wheels only): 'auto' resolves "
        "--requirements lines, 'yes' --project ones too (default: auto)",
    )
    flt = p.add_argument_group("filters")
    flt.add_argument("--version-spec", metavar="SPEC", help="only versions matching this PEP 440 specifier, e.g. '>=2.0'")
    flt.add_argument(
        "--platform", action="append", metavar="TAG", help="only wheels for this platform tag (and 'any'); repeatable"
    )
    flt.add_argument(
        "--abi", action="append", metavar="TAG", help="only wheels for this ABI tag (and 'none', 'abi3'); repeatable"
    )
    flt.add_argument(
        "--python-version",
        action="append",
        metavar="X.Y",
        help="only wheels (and Requires-Python) that fit this Python; repeatable",
    )
    flt.add_argument("--no-sdist", action="store_true", help="skip source distributions")
    flt.add_argument("--exclude-yanked", action="store_true", help="skip yanked files (PEP 592)")
    run = p.add_argument_group("run")
    run.add_argument("--jobs", type=int, default=8, metavar="N", help="parallel downloads (default: 8)")
    run.add_argument(
        "--keep-going",
        action="store_true",
        help="continue past refused files and unknown projects; exit 0 if only those went wrong",
    )
    run.add_argument(
        "--resign-with",
        metavar="REPO_DIR",
        help="also publish the files in this 'tufproxy repo' repository, signed with its keys",
    )
    run.add_argument("--full", action="store_true",
                     help="re-check every selected project (default: only those whose signing bins moved since "
                     "the last sync)")
    run.add_argument("--audit-log", metavar="FILE", help="where refusals are recorded (default: DEST/.mirror/audit.log)")
    run.add_argument("--quiet", action="store_true",
                     help="no progress (bar, per-file lines); refusals, failures and the summary still print")
    run.add_argument("--max-file-size", default="4G", metavar="SIZE", help="largest file taken (default: 4G)")
    p.set_defaults(func=_cmd_sync)

    p = sub.add_parser(
        "verify",
        help="re-verify a whole tree against its metadata: missing, corrupt and extra files",
        description="Load DIR's metadata as a TUF client pinned to --root would, then re-hash every file. "
        "Exit status 0 only if the tree is sound. Run it after carrying media across an air gap.",
    )
    p.add_argument("dir", metavar="DIR", help="a tree written by 'mirror sync', or a 'tufproxy repo' public/ directory")
    p.add_argument(
        "--root",
        metavar="FILE",
        help="the root.json to pin (default: the oldest N.root.json in DIR/metadata, which proves integrity only)",
    )
    p.add_argument("--strict", action="store_true", help="extra files make the tree unsound too")
    p.add_argument("--jobs", type=int, default=8, metavar="N", help="files hashed in parallel (default: 8)")
    p.add_argument(
        "--allow-expired-until",
        metavar="DATE",
        help="operator override: check a tree whose metadata "
        "expired in transit (everything but expiry is verified; each use is reported)",
    )
    p.add_argument(
        "--profile", choices=_PROFILES, help="the tree's layout (default: the one its last sync recorded, else tufproxy)"
    )
    p.add_argument("--provenance", choices=("yes", "no"), default="yes",
                   help="verify each carried PEP 740 provenance object again with Sigstore, offline (default: yes)")
    p.add_argument("--sigstore-trust-root", default="production", metavar="ROOT",
                   help="the Sigstore trust root for that: production or staging (the ones shipped with "
                   "sigstore-python) or a trusted_root.json FILE (default: production)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(func=_cmd_verify)
