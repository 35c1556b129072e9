"""``tufproxy serve`` and ``tufproxy demo``: wire settings into a running proxy.

This is the only place that knows how the parts fit together: the store,
the trust core and its fetcher, the audit log, the metrics and the HTTP
application.  ``demo`` adds a signed repository of its own, served as an
untrusted mirror on loopback, so one command shows the whole chain.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from proxy import logs
from proxy.audit import AuditLog
from proxy.cli import CommandError
from proxy.config import ConfigError, ServeConfig, add_arguments, parse_listen, resolve
from proxy.local import LocalFetcher
from proxy.metrics import Metrics
from proxy.resolver import ProxySettings, Resolver
from proxy.server import Proxy
from proxy.trust.fetch import Pace
from proxy.pagecache import IndexCache
from proxy.store import BlobStore, StoreError
from proxy.trust import Mirror, TrustConfig, TrustedClient
from proxy.trust.errors import ExpiredMetadata, TrustError
from proxy.trust.metadir import MetadataDirLocked
from proxy.trust.model import ExpiryOverride
from proxy.upstream import AiohttpFetcher, Fetcher

log = logging.getLogger(__name__)

# In-flight requests get this long to finish after SIGTERM (Kubernetes' default grace is 30 s).
DRAIN_SECONDS = 25.0
# Processes sharing one cache dir each hold one trusted-metadata directory of at most this many.
MAX_METADATA_SLOTS = 64
_SLOT_LOCK_WAIT = 30.0


@dataclass
class Running:
    """A started proxy: its runner (to stop it) and the port it got."""

    runner: web.AppRunner
    proxy: Proxy
    port: int
    refresher: asyncio.Task[None]
    metadata_fetcher: Fetcher

    async def stop(self) -> None:
        self.refresher.cancel()
        await self.runner.cleanup()
        await self.proxy.resolver.fetcher.close()
        await self.metadata_fetcher.close()
        self.proxy.resolver.pages.close()
        self.proxy.resolver.audit.close()


def _fetchers_and_mirrors(config: ServeConfig) -> tuple[Fetcher, Fetcher, list[Mirror]]:
    """Fetchers for metadata and for files, apart: file downloads cannot starve a refresh."""
    if config.repository is not None:
        local = LocalFetcher(config.repository)
        base = local.base_url()
        return local, local, [Mirror(config.metadata_url(base), base)]
    metadata = AiohttpFetcher(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout)
    # No total timeout for files: Pace abandons slow bodies, however big the file.
    files = AiohttpFetcher(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                           total_timeout=None, per_host=config.mirror_downloads)
    return metadata, files, [Mirror(config.metadata_url(u), u) for u in config.upstream]


def _expiry_override(until: datetime | None, audit: AuditLog) -> ExpiryOverride | None:
    """The operator's expired-metadata override, announced now and on every lookup it changes."""
    if until is None:
        return None
    if until <= datetime.now(UTC):
        log.warning("allow_expired_until %s has passed: metadata expiry is enforced", until.isoformat())
    else:
        log.warning("OPERATOR OVERRIDE: expired TUF metadata is accepted until %s (allow_expired_until); "
                    "signatures, versions and hashes are still checked, freeze attacks are NOT detected",
                    until.isoformat())

    def report(target: str, expired: ExpiredMetadata) -> None:
        log.warning("expired-metadata override used for %s: %s (override until %s)", target, expired, until.isoformat())
        # Never silent: every use is an audit record too (a failed write fails the request).
        audit.override(target=target, role=expired.role, expired=str(expired.expected or expired),
                       until=until.isoformat(), message=str(expired))

    return ExpiryOverride(until, report)


def _seed_metadata_dir(metadata_dir: Path, config: ServeConfig) -> None:
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


async def _trusted_client(config: ServeConfig, fetcher: Fetcher, mirrors: list[Mirror], trust_config: TrustConfig) -> TrustedClient:
    """A trusted-metadata directory of this process's own, seeded from the pinned root if new.

    Slot 0 is ``cache/metadata``, what a single process always used; other
    processes sharing the cache (workers, replicas on a shared volume) take
    the first free ``cache/metadata/worker-K``.  Each slot keeps its own
    rollback protection under its own lock, so no metadata file ever has
    two writers.  Slots are chosen under ``.slots.lock``, so a root is only
    ever written into a slot that has none, never over a newer one.
    """
    base = config.cache_dir / "metadata"
    try:
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base / ".slots.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise CommandError(f"cache dir {config.cache_dir} is not usable: {e}") from e
    try:
        deadline = time.monotonic() + _SLOT_LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CommandError(f"{base / '.slots.lock'} stayed locked for {_SLOT_LOCK_WAIT:.0f}s") from None
                await asyncio.sleep(0.01)
        for k in range(MAX_METADATA_SLOTS):
            metadata_dir = base if k == 0 else base / f"worker-{k}"
            try:
                if not (metadata_dir / "root.json").exists():
                    _seed_metadata_dir(metadata_dir, config)
                return TrustedClient(metadata_dir, mirrors, fetcher, trust_config)
            except MetadataDirLocked:
                continue
        raise CommandError(f"more than {MAX_METADATA_SLOTS} processes share the cache dir {config.cache_dir}")
    finally:
        os.close(fd)


async def start(config: ServeConfig, sock: socket.socket | None = None) -> Running:
    """Open the cache, load trusted metadata, listen (on ``sock`` if given, else ``config.listen``).

    Errors are :class:`CommandError`.
    """
    try:
        store = BlobStore(config.cache_dir, max_bytes=config.cache_size)
        pages = IndexCache(config.cache_dir)
    except (StoreError, OSError) as e:
        raise CommandError(f"cache dir {config.cache_dir} is not usable: {e}") from e
    try:
        audit = AuditLog(config.audit_log, log_accepted=config.audit_accepted)
    except OSError as e:
        raise CommandError(f"cannot open the audit log {config.audit_log}: {e.strerror}") from e
    fetcher, file_fetcher, mirrors = _fetchers_and_mirrors(config)
    layout = config.layout
    trust = await _trusted_client(config, fetcher, mirrors,
                                  TrustConfig(refresh_interval=config.refresh_interval, served_name=layout.served_name,
                                              expiry_override=_expiry_override(config.allow_expired_until, audit)))
    try:
        await trust.refresh()
    except TrustError as e:
        # Keep starting: requests will retry the refresh and fail closed until it works.
        log.warning("initial metadata refresh failed: %s", e)
    settings = ProxySettings(max_file_size=config.max_file_size,
                             upstream_freshness=max(3 * config.refresh_interval, 30.0),
                             verify_before_send=config.verify_before_send,
                             max_connections=config.max_connections,
                             client_idle_timeout=config.client_timeout,
                             pace=Pace(stall=config.read_timeout, min_rate=config.min_rate))
    proxy = Proxy(Resolver(trust, file_fetcher, store, pages, audit, Metrics(), settings, layout,
                           tuple(config.files_url), page_fetcher=fetcher))
    runner = proxy.runner(access_log=None, handle_signals=False, shutdown_timeout=DRAIN_SECONDS)
    await runner.setup()
    host, port = config.listen
    site = web.TCPSite(runner, host, port) if sock is None else web.SockSite(runner, sock)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise CommandError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    actual = runner.addresses[0][1]
    refresher = asyncio.create_task(_keep_fresh(trust, config.refresh_interval))
    return Running(runner, proxy, actual, refresher, fetcher)


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
    if config.workers > 1:
        from proxy import workers

        return workers.run(config)

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
