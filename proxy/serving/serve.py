"""A running proxy from resolved settings: :func:`start` wires the parts together.

This is the only place that knows how the parts fit together: the store,
the trust core and its fetcher, the audit log, the metrics and the HTTP
application.  The commands that run it (``tufproxy serve`` and ``demo``)
are in :mod:`proxy.cli.serve`; :mod:`proxy.serving.workers` runs it in N processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import ssl
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from proxy.protocol.access import Rules
from proxy.protocol.errors import CommandError, ExpiredMetadata, RepositoryError, StoreError, TrustError
from proxy.protocol.model import ExpiryOverride
from proxy.protocol.profiles import LayoutError, Profile, detect_profile
from proxy.serving.config import ServeConfig, cpu_count
from proxy.serving.edge import MissProtocol
from proxy.serving.guard import Guard
from proxy.serving.listener import Limits, Listener
from proxy.serving.passwords import AuthFileError, Passwords
from proxy.serving.provenance import EdgeProvenance
from proxy.serving.resolver import ProxySettings, Resolver
from proxy.serving.server import Proxy
from proxy.storage.audit import AuditLog
from proxy.storage.pagecache import IndexCache
from proxy.storage.store import BlobStore
from proxy.storage.tiered import SharedTier
from proxy.transport.bucket import Bucket, BucketConfigError, BucketDenied, BucketFetcher, BucketUnavailable
from proxy.transport.foreseen import Foreseen
from proxy.transport.local import LocalFetcher
from proxy.transport.tls import ServerTLS, TLSConfigError, client_context, server_tls
from proxy.transport.upstream import AiohttpFetcher, Fetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient
from proxy.trust.detect import candidate_paths, open_detected
from proxy.trust.fetch import Pace
from proxy.trust.metadir import MetadataDirLocked
from proxy.trust.provenance import SigstoreTrust
from proxy.trust.shared import SharedRoles
from proxy.trust.slots import catch_up
from proxy.util.locks import FetchLocks
from proxy.util.metrics import Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

# In-flight requests get this long to finish after SIGTERM (Kubernetes' default grace is 30 s).
DRAIN_SECONDS = 25.0
# Processes sharing one cache dir each hold one trusted-metadata directory of at most this many.
MAX_METADATA_SLOTS = 64
_SLOT_LOCK_WAIT = 30.0
BACKLOG = 1024
# While failing closed (no usable trusted state) the background refresher retries at least this often.
FAILING_CLOSED_BACKOFF = 4.0


@dataclass
class Running:
    """A started proxy: its runner (to stop it) and the port it got."""

    listener: Listener
    proxy: Proxy
    port: int
    refresher: asyncio.Task[None]
    metadata_fetcher: Fetcher
    tls_reload: asyncio.Task[None] | None = None
    layout: str = ""  # which layout, and how it was decided, for the start-up line

    async def stop(self) -> None:
        self.refresher.cancel()
        if self.tls_reload is not None:
            self.tls_reload.cancel()
        await self.listener.stop()
        await self.proxy.resolver.close()
        await self.proxy.resolver.fetcher.close()
        await self.metadata_fetcher.close()
        self.proxy.resolver.pages.close()
        self.proxy.resolver.audit.close()
        if self.proxy.resolver.provenance is not None:
            self.proxy.resolver.provenance.trust.close()


def bind(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` (OSError if it cannot be); listening unless told not to."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _fetchers(config: ServeConfig) -> tuple[Fetcher, Fetcher, list[str]]:
    """Fetchers for metadata and for files, apart (file downloads cannot starve a refresh), and the mirrors' bases."""
    if config.repository is not None:
        local = LocalFetcher(config.repository)
        return local, local, [local.base_url()]
    tls = _client_tls(config)
    metadata = AiohttpFetcher(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                              auth=config.upstream_auth, ssl_context=tls)
    # No total timeout for files: Pace abandons slow bodies, however big the file.
    files = AiohttpFetcher(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
                           total_timeout=None, per_host=config.mirror_downloads, auth=config.upstream_auth,
                           ssl_context=tls)
    return metadata, files, list(config.upstream)


def _client_tls(config: ServeConfig) -> ssl.SSLContext | None:
    """The context upstream HTTPS is verified with: a private CA, a client certificate; None: the default."""
    if config.ca_bundle is None and config.client_cert is None:
        return None
    try:
        return client_context(config.ca_bundle, config.client_cert, config.client_key)
    except TLSConfigError as e:
        raise CommandError(str(e)) from None


def _access(config: ServeConfig) -> tuple[Guard | None, ServerTLS | None]:
    """The guard (None without --auth-file and read rules) and the listener's TLS (None: plain HTTP)."""
    try:
        tls = server_tls(config.tls_cert, config.tls_key)
        if config.auth_file is None and not config.read_rule:
            return None, tls
        passwords = Passwords(config.auth_file, config.auth_groups) if config.auth_file is not None else None
    except (AuthFileError, TLSConfigError) as e:
        raise CommandError(str(e)) from None
    read = Rules(config.read_rule, anonymous_private=config.allow_anonymous_private)
    return Guard(passwords, read), tls


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


def _seed_metadata_dir(metadata_dir: Path, config: ServeConfig, slots: list[Path]) -> None:
    """Pin the root in a new slot, then catch up with the newest state any slot trusts (re-verified)."""
    try:
        root_bytes = config.root_file.read_bytes()
    except OSError as e:
        raise CommandError(f"cannot read the pinned root {config.root_file}: {e.strerror}") from e
    if config.root is None:
        log.warning("trusting the root in the served tree itself (%s): pin one with --root", config.root_file)
    try:
        if not (metadata_dir / "root.json").exists():
            TrustedClient.initialize(metadata_dir, root_bytes)
        catch_up(metadata_dir, root_bytes, slots)
    except MetadataDirLocked:
        raise
    except TrustError as e:
        raise CommandError(f"{config.root_file} is not a valid self-signed root: {e}") from e


async def _trusted_client(config: ServeConfig, fetcher: Fetcher, mirrors: list[Mirror],
                          trust_config: TrustConfig) -> TrustedClient:
    """A trusted-metadata directory of this process's own, seeded from the pinned root if new.

    Slot 0 is ``cache/metadata``, what a single process always used; other
    processes sharing the cache (workers, replicas on a shared volume) take
    the first free ``cache/metadata/worker-K``.  Each slot keeps its own
    rollback protection under its own lock, so no metadata file ever has
    two writers; a slot taken starts from the newest state any slot trusts,
    re-verified from the pinned root (:func:`proxy.trust.slots.catch_up`).
    Slots are chosen under ``.slots.lock``, so a root is only ever written
    into a slot that has none, never over a newer one.
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
        slots = [base if k == 0 else base / f"worker-{k}" for k in range(MAX_METADATA_SLOTS)]
        for metadata_dir in slots:
            try:
                _seed_metadata_dir(metadata_dir, config, slots)
                return TrustedClient(metadata_dir, mirrors, fetcher, trust_config, SharedRoles(base / "shared"))
            except MetadataDirLocked:
                continue
        raise CommandError(f"more than {MAX_METADATA_SLOTS} processes share the cache dir {config.cache_dir}")
    finally:
        os.close(fd)


async def start(config: ServeConfig, sock: socket.socket | None = None) -> Running:
    """Bind ``config.listen`` (unless given ``sock``), open the cache, load trusted metadata, listen.

    Errors are :class:`CommandError`, with everything opened so far closed again.
    """
    async with contextlib.AsyncExitStack() as opened:
        running = await _start(config, sock, opened)
        opened.pop_all()  # from here on, Running.stop closes them
        return running


async def _start(config: ServeConfig, sock: socket.socket | None, opened: contextlib.AsyncExitStack) -> Running:
    guard, tls = _access(config)  # a bad htpasswd, rule or certificate is the one error line, at once
    host, port = config.listen
    if sock is None:
        # Bound first, so a busy port is the one error line at once, not after an initial refresh that
        # may warn; listening only once ready (asyncio's server calls listen()).
        try:
            sock = bind(host, port, listen=False)
        except OSError as e:
            raise CommandError(f"cannot listen on {host}:{port}: {e.strerror}") from e
        opened.callback(sock.close)
    try:
        store = BlobStore(config.cache_dir, max_bytes=config.cache_size)
        pages = IndexCache(config.cache_dir)
    except (StoreError, OSError) as e:
        raise CommandError(f"cache dir {config.cache_dir} is not usable: {e}") from e
    opened.callback(pages.close)
    try:
        audit = AuditLog(config.audit_log, log_accepted=config.audit_accepted)
    except OSError as e:
        raise CommandError(f"cannot open the audit log {config.audit_log}: {e.strerror}") from e
    opened.callback(audit.close)
    metrics = Metrics()
    bucket = await _open_bucket(config, metrics)
    plain, file_fetcher, bases = _fetchers(config)
    if file_fetcher is not plain:
        opened.push_async_callback(file_fetcher.close)
    # Metadata and pages: fetched ahead where a gateway's publish answer names them (proxy.transport.foreseen).
    fetcher = Foreseen(plain, counted=lambda outcome: metrics.foreseen.labels(outcome).inc())
    opened.push_async_callback(fetcher.close)
    trust_config = TrustConfig(refresh_interval=config.refresh_interval, miss_wait=config.miss_wait,
                               expiry_override=_expiry_override(config.allow_expired_until, audit))

    async def open_at(path: str, profile: Profile) -> TrustedClient:
        mirrors = [Mirror(config.metadata_url(base, path), base) for base in bases]
        return await _trusted_client(config, fetcher, mirrors, replace(trust_config, served_name=profile.served_name))

    try:
        detected = await open_detected(open_at, candidate_paths(config.metadata_path, config.layout), config.layout,
                                       "--profile" if config.repository is None else "--profile (or the sync's record)")
    except LayoutError as e:
        raise CommandError(str(e)) from None
    trust, layout = detected.client, detected.profile
    opened.callback(trust.close)
    if detected.error is not None:
        # Keep starting: requests will retry the refresh and fail closed until it works.
        log.warning("initial metadata refresh failed: %s", detected.error)
    log.info("%s", detected.describe())
    if config.gateway_url and not layout.miss_protocol:
        raise CommandError(f"--gateway-url is for a gateway's edge, and this upstream has the {layout.name} layout")
    gateways = config.gateway_url or config.upstream
    miss = (
        MissProtocol(gateways, trust, FetchLocks(store.root / "locks"), auth=config.upstream_auth,
                     ssl_context=_client_tls(config))
        if layout.miss_protocol and gateways
        else None
    )
    if miss is not None:
        opened.push_async_callback(miss.close)
    settings = ProxySettings(
        max_file_size=config.max_file_size,
        upstream_freshness=max(3 * config.refresh_interval, 30.0),
        verify_before_send=config.verify_before_send,
        read_ahead=config.read_ahead,
        pace=Pace(stall=config.read_timeout, min_rate=config.min_rate),
    )
    shared, file_fetcher, page_fetcher = _bucket_tier(config, bucket, file_fetcher, fetcher)
    proxy = Proxy(
        Resolver(
            trust,
            file_fetcher,
            store,
            pages,
            audit,
            metrics,
            settings,
            layout,
            tuple(config.files_url),
            on_miss=miss.on_miss if miss is not None else None,
            ask_ahead=miss.ask_ahead if miss is not None else None,
            missing=miss.missing if miss is not None else None,
            page_fetcher=page_fetcher,
            shared=shared,
            provenance=_edge_provenance(config),
        ),
        guard,
        config.allow_anonymous_private,
        why=miss.why if miss is not None else None,
    )
    trust.on_refused = proxy.resolver.refusals.refresh_refused
    if isinstance(detected.error, RepositoryError):  # refused while the layout was read: audited like any other
        trust.on_refused(detected.error)
    served = proxy.listener(Limits.of(config), shutdown_timeout=DRAIN_SECONDS)
    try:
        actual = await served.start(sock=sock, ssl_context=tls.context if tls is not None else None)
    except OSError as e:
        raise CommandError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    opened.push_async_callback(served.stop)
    proxy.resolver.metrics.hot_path.set(1 if served.hot_path else 0)
    if served.hot_path:
        log.info("hot path installed: warm pages are answered below aiohttp's web layer")
    else:
        log.warning("hot path not installed: this aiohttp lacks what it needs; every request takes aiohttp's path")
    log.info("%s", served.describe())
    watch = [] if detected.verified or config.layout is not None else [_confirm_layout(trust, layout, proxy)]
    refresher = asyncio.create_task(_gather(_keep_fresh(trust, config.refresh_interval, proxy.resolver.metrics), *watch))
    tls_task = asyncio.create_task(tls.keep_loaded()) if tls is not None else None
    return Running(served, proxy, actual, refresher, fetcher, tls_task, detected.describe())


async def _open_bucket(config: ServeConfig, metrics: Metrics) -> Bucket | None:
    """The ``--store`` bucket, asked once: credentials it refuses end start-up with one line; a bucket
    that does not answer yet does not (requests get 503s and /readyz says why until it does)."""
    if config.store is None:
        return None
    try:
        bucket = Bucket(config.store, metrics.bucket, endpoint_url=config.s3_endpoint_url, timeout=config.s3_timeout)
        await bucket.probe()
    except (BucketConfigError, BucketDenied) as e:
        raise CommandError(str(e)) from None
    except BucketUnavailable as e:
        log.warning("%s (starting anyway)", e)
    log.info("shared store: %s (local tier %s in front; credentials: %s)", bucket.url, config.cache_dir, bucket.aws.source)
    return bucket


def _edge_provenance(config: ServeConfig) -> EdgeProvenance | None:
    """``--verify-provenance``: the edge's own Sigstore trust root (prepared under the cache dir) and pins."""
    if not config.verify_provenance:
        return None
    trust = SigstoreTrust(config.sigstore_trust_root, config.sigstore_offline,
                          processes=max(1, cpu_count() // config.workers))
    try:
        trust.prepare(config.cache_dir / "sigstore")
        return EdgeProvenance(trust, config.cache_dir / "provenance-pins.jsonl")
    except OSError as e:
        raise CommandError(f"cannot prepare PEP 740 verification in {config.cache_dir}: {e}") from e


def _bucket_tier(
    config: ServeConfig, bucket: Bucket | None, file_fetcher: Fetcher, page_fetcher: Fetcher
) -> tuple[SharedTier | None, Fetcher, Fetcher]:
    """With ``--store s3://...``: the bucket behind the local store and page cache, read as the first mirror
    of files and pages (the fetchers returned read its URLs from it)."""
    if bucket is None:
        return None, file_fetcher, page_fetcher
    return (
        SharedTier(bucket, config.s3_lease_seconds, config.s3_wait),
        BucketFetcher(bucket, file_fetcher),
        BucketFetcher(bucket, page_fetcher),
    )


async def _gather(*jobs: Coroutine[Any, Any, None]) -> None:
    await asyncio.gather(*jobs)


async def _confirm_layout(trust: TrustedClient, assumed: Profile, proxy: Proxy, every: float = 1.0) -> None:
    """With the layout assumed at start-up (nothing verified yet), check it once metadata verifies: a wrong guess
    is logged and reported by /readyz until a restart detects the right one."""
    while True:  # the trust core has no event for "verified": polled, once a second, until it has
        targets = trust.verified_targets
        if targets is not None:
            break
        await asyncio.sleep(every)
    found = detect_profile(targets)
    if found and assumed not in found:
        proxy.layout_problem = (f"the signed metadata has the {found[0].name} layout, not the {assumed.name} layout "
                                f"assumed at start-up (the upstream did not answer then): restart tufproxy serve, "
                                f"or give --profile {found[0].name}")
        log.error("%s", proxy.layout_problem)
    else:
        log.info("layout %s confirmed by the signed metadata", assumed.name)


async def _keep_fresh(trust: TrustedClient, interval: float, metrics: Metrics) -> None:
    """Refresh in the background, so requests find fresh metadata instead of waiting for it.

    Nothing a refresh raises ends this loop: a failure is logged and counted, and
    retried after 1 s, doubling up to ``interval`` (up to ``FAILING_CLOSED_BACKOFF``
    while there is no usable trusted state), until a refresh succeeds.
    """
    failures = 0
    while True:
        cap = min(interval, FAILING_CLOSED_BACKOFF) if trust.failing_closed else interval
        await asyncio.sleep(interval if failures == 0 else min(cap, 2.0 ** (failures - 1)))
        try:
            await trust.refresh(force=failures > 0)
            failures = 0
            continue
        except TrustError as e:
            reason = e.reason
            log.warning("background refresh failed (%s): %s", e.reason, e)
        except Exception:
            reason = "internal-error"
            log.exception("background refresh failed unexpectedly")
        metrics.refresh_failures.labels(reason).inc()
        failures += 1


def run_loop(main: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    """Run ``main`` to completion on uvloop (if ``use_uvloop`` and it is installed), else on
    asyncio's own loop.  uvloop cuts the cost of a warm page hit, but has no sendfile: files
    are then copied through the loop, so it is opt-in (``--uvloop yes``)."""
    factory = None
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            log.info("uvloop is not installed: running on asyncio's own event loop")
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set; install it before saying how to stop us."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
