"""``tufproxy client``: a command-line TUF client over the trust core.

It speaks the protocol standard TUF client test suites drive::

    tufproxy client --metadata-dir DIR init TRUSTED_ROOT
    tufproxy client --metadata-dir DIR --metadata-url URL refresh
    tufproxy client --metadata-dir DIR --metadata-url URL \\
        --target-name PATH [--target-name PATH ...] \\
        --target-base-url URL --target-dir DIR download

Exit status 0 only when everything succeeded; otherwise one line on stderr
and status 1.  It uses the same :class:`~proxy.trust.TrustedClient` as the
proxy, with every role persisted under its non-versioned name.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from urllib.parse import quote

from proxy.atomic import atomic_write
from proxy.cli import CommandError
from proxy.trust.client import TrustedClient
from proxy.trust.errors import RepositoryError, TrustError
from proxy.trust.fetch import Want, fetch_bytes
from proxy.trust.model import Mirror, TrustConfig, VerifiedTarget
from proxy.upstream import AiohttpFetcher, Fetcher

# One explicit refresh per invocation; lookups after it must not refresh again.
_CONFIG = TrustConfig(refresh_interval=3600.0, persist_bins=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``client`` subcommand."""
    p = subparsers.add_parser(
        "client",
        help="a command-line TUF client (init, refresh, download) over the proxy's trust core",
        description=(
            "A TUF client over tufproxy's trust core. 'init' stores a trusted root in the "
            "metadata directory (no network); 'refresh' updates the top-level metadata; "
            "'download' refreshes, then fetches and verifies each --target-name into "
            "--target-dir (file name: the target path, URL-quoted). Trusted metadata is kept "
            "in the metadata directory as ROLE.json. Exit status 0 on success, 1 on any failure."
        ),
    )
    p.add_argument("--metadata-dir", type=Path, required=True, help="trusted metadata directory")
    p.add_argument("--metadata-url", help="base URL of the repository's metadata")
    p.add_argument("--target-name", action="append", default=[], metavar="PATH",
                   help="target path to download (repeatable, fetched in order)")
    p.add_argument("--target-base-url", help="base URL of the repository's targets")
    p.add_argument("--target-dir", type=Path, help="where downloaded targets are written")
    p.add_argument("-v", "--verbose", dest="client_verbose", action="count", default=0,
                   help="more log output (repeatable)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="trust TRUSTED_ROOT (a root.json); no network")
    init.add_argument("trusted_root", type=Path, metavar="TRUSTED_ROOT")
    actions.add_parser("refresh", help="update top-level metadata (needs --metadata-url)")
    actions.add_parser("download", help="refresh, then download each --target-name "
                       "(needs --metadata-url, --target-base-url, --target-dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.client_verbose:
        logging.getLogger().setLevel(logging.WARNING - 10 * min(args.client_verbose, 2))
    if args.action == "init":
        try:
            TrustedClient.initialize(args.metadata_dir, args.trusted_root.read_bytes())
        except (OSError, TrustError) as e:
            raise CommandError(str(e)) from e
        return 0
    if not args.metadata_url:
        raise CommandError(f"{args.action} needs --metadata-url")
    if args.action == "download" and not (args.target_base_url and args.target_dir):
        raise CommandError("download needs --target-base-url and --target-dir")
    try:
        return asyncio.run(_online(args))
    except TrustError as e:
        raise CommandError(f"{e.reason}: {e}") from e
    except OSError as e:
        raise CommandError(str(e)) from e


async def _online(args: argparse.Namespace) -> int:
    fetcher = AiohttpFetcher()
    mirror = Mirror(args.metadata_url, args.target_base_url or args.metadata_url)
    client = TrustedClient(args.metadata_dir, [mirror], fetcher, _CONFIG)
    try:
        await client.refresh(force=True)
        for name in args.target_name:
            await _download(client, fetcher, await client.get_target(name), args.target_dir)
        return 0
    finally:
        client.close()
        await fetcher.close()


async def _download(client: TrustedClient, fetcher: Fetcher, target: VerifiedTarget, target_dir: Path) -> None:
    """Write ``target`` to ``target_dir`` unless a verified copy is already there."""
    dest = target_dir / quote(target.path, safe="")
    try:
        target.verify(dest.read_bytes())
        return
    except (OSError, RepositoryError):
        pass
    data = await fetch_bytes(fetcher, Want.of(target), client.target_urls(target))
    target_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, data)
