"""``tufproxy serve`` and ``tufproxy demo``: wire settings into a running proxy.

This is the only place that knows how the parts fit together: the store,
the trust core and its fetcher, the audit log, the metrics and the HTTP
application.  ``demo`` adds a signed repository of its own, served as an
untrusted mirror on loopback, so one command shows the whole chain.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from proxy import logs
from proxy.audit import AuditLog
from proxy.cli import CommandError
from proxy.config import ConfigError, ServeConfig, add_arguments, parse_listen, resolve
from proxy.local import LocalFetcher
from proxy.metrics import Metrics
from proxy.server import Proxy, ProxySettings
from proxy.store import BlobStore, IndexCache, StoreError
from proxy.trust import Mirror, TrustConfig, TrustedClient
from proxy.trust.errors import TrustError
from proxy.upstream import AiohttpFetcher, Fetcher

log = logging.getLogger(__name__)


@dataclass
class Running:
    """A started proxy: its runner (to stop it) and the port it got."""

    runner: web.AppRunner
    proxy: Proxy
    port: int
    refresher: asyncio.Task[None]

    async def stop(self) -> None:
        self.refresher.cancel()
        await self.runner.cleanup()
        await self.proxy.fetcher.close()
        self.proxy.pages.close()
        self.proxy.audit.close()


def _fetcher_and_mirrors(config: ServeConfig) -> tuple[Fetcher, list[Mirror]]:
    if config.repository is not None:
        local = LocalFetcher(config.repository)
        base = local.base_url()
        return local, [Mirror(config.metadata_url(base), base)]
    fetcher = AiohttpFetcher(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout)
    return fetcher, [Mirror(config.metadata_url(u), u) for u in config.upstream]


async def start(config: ServeConfig) -> Running:
    """Open the cache, load trusted metadata, listen.  Errors are :class:`CommandError`."""
    try:
        store = BlobStore(config.cache_dir, max_bytes=config.cache_size)
        pages = IndexCache(config.cache_dir)
    except (StoreError, OSError) as e:
        raise CommandError(f"cache dir {config.cache_dir} is not usable: {e}") from e
    metadata_dir = config.cache_dir / "metadata"
    if not (metadata_dir / "root.json").exists():
        try:
            root_bytes = config.root_file.read_bytes()
        except OSError as e:
            raise CommandError(f"cannot read the pinned root {config.root_file}: {e.strerror}") from e
        if config.root is None:
            log.warning("trusting the root in the served tree itself (%s): pin one with --root", config.root_file)
        try:
            TrustedClient.initialize(metadata_dir, root_bytes)
        except TrustError as e:
            raise CommandError(f"{config.root_file} is not a valid self-signed root: {e}") from e
    fetcher, mirrors = _fetcher_and_mirrors(config)
    layout = config.layout
    trust = TrustedClient(metadata_dir, mirrors, fetcher,
                          TrustConfig(refresh_interval=config.refresh_interval, served_name=layout.served_name))
    try:
        await trust.refresh()
    except TrustError as e:
        # Keep starting: requests will retry the refresh and fail closed until it works.
        log.warning("initial metadata refresh failed: %s", e)
    proxy = Proxy(trust, fetcher, store, pages, AuditLog(config.audit_log, log_accepted=config.audit_accepted), Metrics(),
                  ProxySettings(max_file_size=config.max_file_size,
                                upstream_freshness=max(3 * config.refresh_interval, 30.0)),
                  profile=layout, file_origins=tuple(config.files_url))
    runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False)
    await runner.setup()
    host, port = config.listen
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise CommandError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    actual = runner.addresses[0][1]
    refresher = asyncio.create_task(_keep_fresh(trust, config.refresh_interval))
    return Running(runner, proxy, actual, refresher)


async def _keep_fresh(trust: TrustedClient, interval: float) -> None:
    """Refresh in the background, so requests find fresh metadata instead of waiting for it."""
    while True:
        await asyncio.sleep(interval)
        try:
            await trust.refresh()
        except TrustError as e:
            log.warning("background refresh failed (%s): %s", e.reason, e)


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = resolve(args)
    except ConfigError as e:
        raise CommandError(str(e)) from e
    logs.configure(config.log_level, config.log_format)

    async def main() -> None:
        running = await start(config)
        print(f"tufproxy serving on http://{config.listen[0]}:{running.port}/simple/", flush=True)
        try:
            await _until_signalled()
        finally:
            await running.stop()

    asyncio.run(main())
    return 0


DEMO_DISTS = (
    # (name, version, requires): a dependency chain pip must resolve through the proxy.
    ("demo-app", "1.0", ["demo-lib>=1.0"]),
    ("demo-lib", "1.0", ["demo-base"]),
    ("demo-lib", "1.1", ["demo-base"]),
    ("demo-base", "2.0", []),
)


def _demo_repository(directory: Path, dists: Path | None) -> Path:
    """Create (or reuse and refresh) the demo's signed repository."""
    from proxy.repository import Repository, RepositoryError
    from proxy.repository.sample import build_sdist, build_wheel

    repo_dir = directory / "repo"
    try:
        if (repo_dir / "repository.json").exists():
            repo = Repository.open(repo_dir)
            repo.refresh()
            print(f"reusing signed repository {repo_dir}")
        else:
            repo = Repository.init(repo_dir, bins=1024)
            print(f"created signed repository {repo_dir} (1024 bins)")
        if dists is not None:
            files = sorted(p for p in dists.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip")))
            if not files:
                raise CommandError(f"no wheels or sdists in {dists}")
        else:
            made = directory / "dists"
            files = [build_wheel(made, n, v, requires=r) for n, v, r in DEMO_DISTS]
            files.append(build_sdist(made, "demo-base", "2.0"))
        report = repo.add(files)
    except RepositoryError as e:
        raise CommandError(str(e)) from e
    print(f"signed {len(report.added)} new file(s), {len(report.unchanged)} already there")
    return repo_dir


def _cmd_demo(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    repo_dir = _demo_repository(directory, Path(args.dists) if args.dists else None)
    try:
        listen = parse_listen(args.listen)
    except ConfigError as e:
        raise CommandError(str(e)) from e

    async def main() -> None:
        mirror = web.Application()
        mirror.router.add_static("/", repo_dir / "public", show_index=False)
        mirror_runner = web.AppRunner(mirror, access_log=None, handle_signals=False)
        await mirror_runner.setup()
        await web.TCPSite(mirror_runner, "127.0.0.1", 0).start()
        mirror_url = f"http://127.0.0.1:{mirror_runner.addresses[0][1]}/"
        config = ServeConfig(
            upstream=[mirror_url], root=repo_dir / "public/metadata/1.root.json",
            cache_dir=directory / "cache", listen=listen, refresh_interval=60.0, audit_log=directory / "audit.log",
        )
        running = await start(config)
        index_url = f"http://{listen[0]}:{running.port}/simple/"
        first = DEMO_DISTS[0][0] if args.dists is None else "<project>"
        print(f"untrusted mirror: {mirror_url} (the signed tree in {repo_dir / 'public'})")
        print(f"tufproxy:         {index_url} (cache {directory / 'cache'}, audit log {directory / 'audit.log'})")
        print("try, in another shell:")
        print(f"  pip install --index-url {index_url} {first}")
        print(f"  uv pip install --index-url {index_url} {first}")
        print("Ctrl-C stops both.", flush=True)
        try:
            await _until_signalled()
        finally:
            await running.stop()
            await mirror_runner.cleanup()

    asyncio.run(main())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy serve`` and ``tufproxy demo``."""
    p = subparsers.add_parser(
        "serve",
        help="run the verifying proxy in front of untrusted mirrors (or a local signed tree)",
        description="Serve the Simple API (PEP 503/691) to pip and uv. Every page and file is "
        "verified against TUF metadata rooted in the pinned --root before it is cached or served. "
        "Settings come from flags, then TUFPROXY_* environment variables, then --config FILE (TOML).",
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_serve)

    p = subparsers.add_parser(
        "demo",
        help="one command, no services: a signed repository, a mirror of it and the proxy, on 127.0.0.1",
        description="Build (or reuse) a signed repository of real distributions in DIR, serve it as an "
        "untrusted mirror on a loopback port, start tufproxy in front of it, and print the pip line to try.",
    )
    p.add_argument("--dir", default="tufproxy-demo", help="where the repository, cache and audit log go (default: ./tufproxy-demo)")
    p.add_argument("--dists", metavar="DIR", help="sign these wheels/sdists instead of the built-in sample set")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="proxy address (default: 127.0.0.1:8080; port 0 picks one)")
    p.set_defaults(func=_cmd_demo)
