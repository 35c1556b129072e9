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
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

from proxy.protocol.errors import EXIT_REFUSED, CommandError, RepositoryError, TrustError
from proxy.protocol.model import Mirror, TrustConfig, VerifiedTarget
from proxy.protocol.profiles import detect_profile
from proxy.transport.upstream import AiohttpFetcher, Fetcher
from proxy.trust.client import TrustedClient
from proxy.trust.fetch import Want, fetch_bytes
from proxy.util.atomic import atomic_write

# One explicit refresh per invocation; lookups after it must not refresh again.
_CONFIG = TrustConfig(refresh_interval=3600.0, persist_bins=True)


# The options every action takes: (flags, argparse keywords).  They go on ``client`` itself (the
# conformance protocol puts them before the action) and on each action (after it, as users write them).
_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, object]], ...] = (
    (("--metadata-dir",), {"type": Path, "metavar": "DIR", "help": "trusted metadata directory (required)"}),
    (("--metadata-url",), {"metavar": "URL", "help": "base URL of the repository's metadata"}),
    (("--target-name",), {"action": "append", "metavar": "PATH",
                          "help": "target path to download (repeatable, fetched in order)"}),
    (("--target-base-url",), {"metavar": "URL", "help": "base URL of the repository's targets"}),
    (("--target-dir",), {"type": Path, "metavar": "DIR", "help": "where downloaded targets are written"}),
    (("-v", "--verbose"), {"dest": "client_verbose", "action": "count", "help": "more log output (repeatable)"}),
)
# Prefix of the destinations of options given after the action.
_LATE = "late_"


def _add_options(parser: argparse.ArgumentParser, late: bool) -> None:
    for flags, keywords in _OPTIONS:
        keywords = dict(keywords)
        dest = str(keywords.pop("dest", flags[-1].lstrip("-").replace("-", "_")))
        keywords["dest"] = _LATE + dest if late else dest
        if late:  # unset options after the action must not overwrite the ones given before it
            keywords["default"] = argparse.SUPPRESS
        parser.add_argument(*flags, **keywords)  # type: ignore[arg-type]


def _merge_late_options(args: argparse.Namespace) -> None:
    """Options after the action win over the same before it; target names add up, in order."""
    for name, value in list(vars(args).items()):
        if name.startswith(_LATE):
            dest = name.removeprefix(_LATE)
            early = getattr(args, dest)
            if dest == "target_name":
                value = (early or []) + value
            elif dest == "client_verbose":
                value += early or 0
            setattr(args, dest, value)
            delattr(args, name)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``client`` subcommand."""
    p = subparsers.add_parser(
        "client",
        description=(
            "A TUF client over tufproxy's trust core. 'init' stores a trusted root in the "
            "metadata directory (no network); 'refresh' updates the top-level metadata; "
            "'download' refreshes, then fetches and verifies each --target-name into "
            "--target-dir (file name: the target path, URL-quoted). Trusted metadata is kept "
            "in the metadata directory as ROLE.json. Options go before or after the action. "
            "Exit status 0 on success, 1 on any failure."
        ),
    )
    _add_options(p, late=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser("init", help="trust TRUSTED_ROOT (a root.json); no network",
                              description="Trust TRUSTED_ROOT (a root.json) as the metadata directory's root.")
    init.add_argument("trusted_root", type=Path, metavar="TRUSTED_ROOT")
    refresh = actions.add_parser("refresh", help="update top-level metadata (needs --metadata-url)",
                                 description="Update the top-level metadata (needs --metadata-dir, --metadata-url).")
    download = actions.add_parser(
        "download", help="refresh, then download each --target-name (needs --metadata-url, --target-base-url, --target-dir)",
        description="Refresh, then download and verify each --target-name into --target-dir "
        "(needs --metadata-dir, --metadata-url, --target-base-url, --target-dir).")
    for action in (init, refresh, download):
        _add_options(action, late=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _merge_late_options(args)
    if args.metadata_dir is None:
        raise CommandError(f"{args.action} needs --metadata-dir")
    if args.client_verbose:
        logging.getLogger().setLevel(logging.WARNING - 10 * min(args.client_verbose, 2))
    if args.action == "init":
        try:
            TrustedClient.initialize(args.metadata_dir, args.trusted_root.read_bytes())
        except (OSError, TrustError) as e:
            raise CommandError(str(e), EXIT_REFUSED) from e
        return 0
    if not args.metadata_url:
        raise CommandError(f"{args.action} needs --metadata-url")
    if args.action == "download" and not (args.target_base_url and args.target_dir):
        raise CommandError("download needs --target-base-url and --target-dir")
    try:
        return asyncio.run(_online(args))
    except TrustError as e:
        raise CommandError(f"{e.reason}: {e}", EXIT_REFUSED) from e
    except OSError as e:
        raise CommandError(str(e), EXIT_REFUSED) from e


async def _online(args: argparse.Namespace) -> int:
    fetcher = AiohttpFetcher()
    mirror = Mirror(args.metadata_url, args.target_base_url or args.metadata_url)
    client = TrustedClient(args.metadata_dir, [mirror], fetcher, _CONFIG)
    try:
        await client.refresh(force=True)
        _use_layout(client)
        for name in args.target_name or []:
            await _download(client, fetcher, await client.get_target(name), args.target_dir)
        return 0
    finally:
        client.close()
        await fetcher.close()


def _use_layout(client: TrustedClient) -> None:
    """Name targets as the layout the verified metadata has does (a warehouse page is served under its own
    name); a repository of no known layout keeps TUF's consistent-snapshot names."""
    targets = client.verified_targets
    layouts = detect_profile(targets) if targets is not None else ()
    if layouts:
        logging.getLogger(__name__).info("layout %s (detected from the signed metadata)", layouts[0].name)
        client.config = replace(client.config, served_name=layouts[0].served_name)


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
