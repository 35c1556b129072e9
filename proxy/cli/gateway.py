"""``tufproxy gateway``: init, serve, ledger, revoke, policy.

``DIR`` is a repository of the signer (:mod:`proxy.repository`) in the
``gateway`` layout, plus ``DIR/gateway/`` (the ledger, and the effective
policy ``serve`` last started with) beside its ``keys/`` and ``public/``.
Edges pin ``DIR/public/metadata/1.root.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fcntl
import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from proxy.cli import advisories
from proxy.cli import ceremony as ceremony_cli
from proxy.cli.repo import (
    BINS_HELP,
    KEY_URI_HELP,
    _days,
    _guarded,
    add_bins_arguments,
    add_key_arguments,
    add_rebin_parser,
    describe_keys,
    init_repository,
    rebin_repository,
)
from proxy.cli.up import add_up
from proxy.gateway import provenance
from proxy.gateway.advisories import AdvisoryWatch, store_path
from proxy.gateway.app import GatewayApp, gateway_resource
from proxy.gateway.feeds import Feeds
from proxy.gateway.files import FileSource, ReadAhead
from proxy.gateway.forward import Forwarder
from proxy.gateway.freshness import keep_fresh
from proxy.gateway.ledger import Ledger
from proxy.gateway.listing import IndexClient
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.policy import POLICY_KEYS, Policy, add_policy_arguments, resolve_policy
from proxy.gateway.publisher import Publisher, resign_after_restore, timestamp_version
from proxy.gateway.service import Gateway, rebuild_pins
from proxy.gateway.shared import SharedState
from proxy.gateway.startcheck import files_origin_problem
from proxy.protocol import index
from proxy.protocol.access import AUTHENTICATED, Rules
from proxy.protocol.errors import CommandError
from proxy.protocol.options import ConfigError, Option, parse_listen, parse_size, resolve_values
from proxy.protocol.options import non_negative_int as _non_negative_int
from proxy.protocol.options import positive_float as _positive_float
from proxy.protocol.options import url_list as _url_list
from proxy.protocol.provenance import parse_spec, parse_trusted_publishers
from proxy.repository import Repository, RepositoryError
from proxy.repository.catalog import Catalog
from proxy.repository.keys import ONLINE
from proxy.repository.keysource import KeyUnavailable
from proxy.repository.signer import JOURNAL
from proxy.serving import listener
from proxy.serving.access import AccessMiddleware, refusals_counter
from proxy.serving.config import _rules, _store_url, access_options, add_arguments, cpu_count, read_config
from proxy.serving.guard import Guard
from proxy.serving.passwords import AuthFileError, Passwords
from proxy.serving.serve import stop_on_signals
from proxy.serving.workers import Started, Supervisor
from proxy.storage.audit import AuditLog
from proxy.storage.leader import Fence, LeaderLease
from proxy.storage.treepush import TreePush
from proxy.transport.bucket import Bucket, BucketConfigError, BucketUnavailable
from proxy.transport.credentials import OriginAuth, strip_credentials
from proxy.transport.indexhttp import IndexHTTP
from proxy.transport.tls import ServerTLS, TLSConfigError, server_tls
from proxy.trust.fetch import Pace
from proxy.trust.provenance import SigstoreTrust
from proxy.util import logs
from proxy.util.atomic import atomic_write
from proxy.util.journal import Journal
from proxy.util.locks import FetchLocks, Leadership

log = logging.getLogger(__name__)
# PEP 458's rule (proxy.protocol.bins) for a gateway of 1,100 to 4,400 projects: the snapshot every edge verifies at
# every publish lists every bin, while a bin-n is read once per bin and change (docs: "512 bins").
DEFAULT_BINS = 512
ADVISORY_CHECK = 1.0  # seconds between looks at the advisory store (a stat): an import takes effect within this


def _file_urls(value: str | list[str]) -> list[str]:
    """http(s) URLs of files (a feed's zip): as given, with no slash added; text split on commas and spaces."""
    items = value if isinstance(value, list) else [value]
    urls = [u for item in items for u in re.split(r"[\s,]+", str(item).strip()) if u]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ConfigError(f"not an http(s) URL: {bad[0]!r}")
    return urls


def ledger_dir(directory: Path) -> Path:
    return Path(directory) / "gateway"


def policy_file(directory: Path) -> Path:
    """Where ``serve`` records its effective policy for ``tufproxy gateway policy``."""
    return ledger_dir(directory) / "policy.json"


OPTIONS: tuple[Option, ...] = (
    Option("index_url", "a plain PEP 503/691 index to take projects from (e.g. https://index.example/simple/); repeat: "
           "the first index that lists a project wins, never merged", [], _url_list, repeat=True, metavar="URL"),
    Option("files_origin", "another origin the index's pages may link files to; repeatable (file links anywhere else "
           "refuse the page)", [], _url_list, repeat=True, metavar="URL"),
    Option("listen", "address to listen on", "127.0.0.1:8081", parse_listen, metavar="HOST:PORT"),
    Option("page_ttl", "seconds before a published project's page is fetched again", 600.0, _positive_float, metavar="SECONDS"),
    Option("refresh_rate", "at most this many page refreshes a second", 5.0, _positive_float, metavar="N"),
    Option("batch_window", "at most this many seconds a batch waits for pages still being fetched, to sign them with it "
           "(a lone miss is signed at once; a batch waits no longer than the last batches took to sign)", 0.2,
           _positive_float, metavar="SECONDS"),
    Option("prefetch_depth", "when a miss publishes a project, also publish its dependencies this many levels "
           "deep (read from the newest release's metadata; 0: off)", 2, int, metavar="N"),
    Option("prefetch_max", "at most this many dependencies prefetched per miss", 40, int, metavar="N"),
    Option("read_ahead", "files fetched from the index at once ahead of their request, when a client asks for "
           "their .metadata (none over 64 MiB; 0: none)", 8, _non_negative_int, metavar="N"),
    Option("gc_grace", "seconds an unreferenced metadata or page file is kept", 3600.0, _positive_float, metavar="SECONDS"),
    Option("ca_bundle", "CA certificates to verify the index's TLS with", None, Path, metavar="FILE", shown="the system's"),
    Option("connect_timeout", "seconds to connect to an index", 10.0, _positive_float, metavar="SECONDS"),
    Option("read_timeout", "seconds an index may stay silent mid-response", 30.0, _positive_float, metavar="SECONDS"),
    Option("max_page_size", "largest index page accepted", "64M", parse_size, metavar="SIZE"),
    Option("max_file_size", "largest file accepted when the page gives no size", "4G", parse_size, metavar="SIZE"),
    Option("workers", "worker processes sharing DIR (one signs at a time; about one per CPU)", 1, int, metavar="N"),
    Option("cache_dir", "keep files fetched on demand (and worker locks and metrics) here instead of in DIR/public "
           "and DIR/gateway/run: what can be lost and fetched again", None, Path, metavar="DIR2",
           shown="DIR/public and DIR/gateway/run"),
    Option("store", "also publish the signed repository (metadata, pages, files in DIR/public or --cache-dir) "
           "to a bucket, s3://BUCKET/PREFIX, after every signing batch, timestamp last; edges and CDNs may read "
           "it from there",
           None, _store_url, metavar="URL"),
    Option("leader_lease", "with --store: run as one replica of a group sharing the bucket; the replica holding "
           "a lease object in the bucket (renewed every third of SECONDS, taken over when not renewed for SECONDS) "
           "is the only one that publishes, and its timestamp writes are conditional so a stale leader cannot "
           "overwrite its successor's", None, _positive_float, metavar="SECONDS", shown="no lease: this gateway "
           "is the only publisher"),
    Option("replica_url", "with --leader-lease: the URL the other replicas forward publish requests to while "
           "this replica leads", None, metavar="URL", shown="http(s)://HOST:PORT of --listen (this host's name for "
           "0.0.0.0)"),
    Option("s3_endpoint_url", "the S3 API endpoint of an S3-compatible store", None, metavar="URL", shown="AWS's"),
    Option("advisories_url", "an OSV feed the gateway fetches itself: a record, or a zip laid out like OSV's "
           "all.zip (e.g. an internal copy of the PyPI one); repeatable", [], _file_urls, repeat=True, metavar="URL"),
    Option("advisories_refresh", "seconds between conditional GETs of each --advisories-url", 3600.0, _positive_float,
           metavar="SECONDS"),
    Option("advisories_max_size", "largest --advisories-url body accepted", "1G", parse_size, metavar="SIZE"),
    Option("log_level", "debug, info, warning or error", "info", metavar="LEVEL"),
    Option("log_format", "text or json, on stderr", "text", metavar="FORMAT"),
    Option("audit_log", "append audit records (JSON lines) to this file", None, Path, metavar="FILE", shown="stdout"),
    *access_options("authenticated"),
    Option("publish_rule", "PATTERN=WHO: who may ask the gateway to publish (POST /_tufproxy/publish/<project>) "
           "projects matching PATTERN; repeatable; unmatched projects: authenticated", [], _rules, repeat=True,
           metavar="PATTERN=WHO"),
    Option("tls_client_ca", "ask every client (edges) for a certificate signed by this CA (mTLS); needs --tls-cert",
           None, Path, metavar="FILE"),
    *provenance.OPTIONS,
    *listener.OPTIONS,
)

SERVE_HELP = """\
The miss protocol: an edge (tufproxy serve) that finds no
signed page for a project POSTs /_tufproxy/publish/<project>; the gateway
fetches the page from the first index that lists it, checks it, pins its
files in DIR/gateway/ledger.jsonl, signs it (with the other clients' pages
still being fetched, waiting for them about as long as a batch takes to
sign, at most --batch-window) and answers
{"timestamp_version": N} once that timestamp is written, or 404 when no
index lists the project. Edges run:
  tufproxy serve --upstream http://GATEWAY:8081/ \\
      --root DIR/public/metadata/1.root.json

--workers N runs N processes on one port sharing DIR: each batches its own
publishes and they sign one at a time under DIR/.lock, re-reading the
signed state from disk; a project's page is fetched by one of them.

What lives where (back up the first three; the rest is fetched again):
  DIR/keys/               signing keys: root-*.pem, targets.pem, bins.pem
                          (keep offline) and online.pem (the running gateway's);
                          uris.json for keys in a token or KMS (no private key)
  DIR/public/metadata/,   signed metadata and signed pages (what edges verify;
  DIR/public/simple/      a restore from an older backup keeps versions rising)
  DIR/gateway/            ledger.jsonl (pins and revocations, append-only: the
                          memory of what was served) and ledger.sqlite (its
                          index, rebuilt when missing), policy.json and
                          advisories.json (imported OSV advisories)
  DIR/public/packages/    files fetched on demand, checked against the ledger;
                          with --cache-dir DIR2: DIR2/packages/ instead
  DIR/gateway/run/        worker locks, metrics and what a restart takes up
                          (fetch times, the catalog of bins, pages pending
                          collection); DIR2/run/ with --cache-dir; never
                          restored from a backup
"""


def _cmd_init(args: argparse.Namespace) -> int:
    repo = init_repository(args, layout="gateway", clock_versions=True)
    ledger_dir(repo.path).mkdir(mode=0o750, exist_ok=True)
    print(f"initialised gateway {repo.path}: {repo.settings.bins} bins, " + describe_keys(repo, args), end="")
    print("the running gateway needs only the online key")
    print(f"edges pin {repo.metadata_dir / '1.root.json'}")
    return 0


def _open(directory: Path) -> Repository:
    if not (Path(directory) / "repository.json").exists():
        raise CommandError(f"{directory} is not a repository (no repository.json): create one with "
                           f"'tufproxy gateway init {directory}'")
    try:
        repo = Repository.open(directory)
    except RepositoryError as e:
        raise CommandError(str(e)) from e
    if repo.profile.name != "gateway":
        raise CommandError(f"{directory} is a {repo.profile.name} repository; create one with 'tufproxy gateway init'")
    return repo


async def _pusher(values: dict, directory: Path, repo: Repository, ledger: Ledger,
                  metrics: GatewayMetrics) -> tuple[TreePush | None, LeaderLease | None, SharedState | None]:
    """With ``--store``: the bucket the signed tree (and files kept under ``--cache-dir``) is pushed to,
    brought up to date before serving; with ``--leader-lease``, the lease that decides who pushes."""
    journal = Journal(repo.path / JOURNAL)
    if values["store"] is None:
        journal.path.unlink(missing_ok=True)  # nobody copies the tree: nobody writes down what changed
        repo.journal = None
        return None, None, None
    journal.path.touch()
    repo.journal = journal
    cache = values["cache_dir"]
    try:
        bucket = Bucket(values["store"], metrics.bucket, endpoint_url=values["s3_endpoint_url"])
        lease = fence = shared = None
        if values["leader_lease"] is not None:
            async def elected() -> None:
                # Versions continue from the bucket's, never from this replica's disk; so do the ledger and
                # advisories (with what followers offered).
                assert fence is not None and shared is not None
                await asyncio.to_thread(_check_restore, directory, cache, await fence.load())
                await shared.elected()

            pushes: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)

            def changed(leader: bool, generation: int) -> None:
                metrics.lease_changed(leader, generation)
                if leader:  # publish at once what this replica holds, above the bucket's versions
                    task = asyncio.get_running_loop().create_task(pusher.push_logged())
                    pushes.add(task)
                    task.add_done_callback(pushes.discard)

            lease = LeaderLease(bucket, values["leader_lease"], elected=elected, changed=changed,
                                lost=metrics.lease_lost.inc, url=replica_url(values))
            fence = Fence(bucket, lease)
            shared = SharedState(bucket, lease, ledger, store_path(ledger_dir(directory)), repo, replica_url(values))
        pusher = TreePush(bucket, repo.public_dir, ledger_dir(directory) / "push.lock",
                          {"packages": Path(cache) / "packages"} if cache is not None else None, fence=fence,
                          state=shared.sync if shared is not None else None, journal=journal)
        # The bucket remembers what was published: a directory older than that was restored (before it is pushed).
        published = await bucket.read("metadata/timestamp.json")
        if published is not None:
            await asyncio.to_thread(_check_restore, directory, cache, timestamp_version(published))
        if lease is not None:
            metrics.lease_changed(False, 0)
            await lease.step()
        await pusher.push()
    except (BucketConfigError, BucketUnavailable) as e:
        raise CommandError(str(e)) from e
    return pusher, lease, shared


def replica_url(values: dict) -> str:
    """Where the other replicas reach this one: ``--replica-url``, or the ``--listen`` address."""
    if values["replica_url"]:
        return str(values["replica_url"])
    host, port = values["listen"]
    if host in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    return f"{'https' if values['tls_cert'] else 'http'}://{host}:{port}/"


def state_dir(directory: Path, cache_dir: Path | None) -> Path:
    """Where a running gateway keeps what it can lose: files fetched on demand go under ``packages/``
    of the cache dir, worker locks and metrics under ``run/``."""
    return Path(cache_dir) if cache_dir is not None else ledger_dir(directory)


@dataclass
class GatewayWorkers:
    """``gateway serve`` as a :class:`~proxy.serving.workers.WorkerApp`: the same gateway in every worker, sharing DIR."""

    directory: Path
    values: dict
    policy: Policy
    name: str = "tufproxy gateway serving"

    @property
    def listen(self) -> tuple[str, int]:
        return self.values["listen"]

    @property
    def scheme(self) -> str:
        return "https" if self.values["tls_cert"] else "http"

    @property
    def state_dir(self) -> Path:
        return state_dir(self.directory, self.values["cache_dir"]) / "run"

    async def start(self, sock: socket.socket) -> Started:
        started, _ = await _start(self.directory, self.values, self.policy, sock, self.state_dir)
        return started


# A token another worker is logging in to answers a generic error for a moment (SoftHSM2 does):
# asked again within this many tries, a busy token is told from a broken one.
_KEY_TRIES = 5


async def _online_key_signs(repo: Repository) -> None:
    """The online key signs before anything is served: a missing token, wrong PIN or missing key stops here."""
    for attempt in range(_KEY_TRIES):
        try:
            await asyncio.to_thread(repo.check_key, ONLINE)
            return
        except KeyUnavailable as e:
            if not e.transient or attempt == _KEY_TRIES - 1:
                raise
            log.info("the online key: %s (asking again)", e)
            await asyncio.sleep(0.1 * 2 ** attempt)


async def _start(directory: Path, values: dict, policy: Policy, sock: socket.socket | None,
                 shared: Path | None) -> tuple[Started, int]:
    """Start one gateway process (on ``sock`` if given); with ``shared``, one of several workers sharing DIR."""
    repo = _open(directory)
    try:
        audit = AuditLog(values["audit_log"])
    except OSError as e:
        raise CommandError(f"cannot open the audit log {values['audit_log']}: {e.strerror}") from e
    metrics = GatewayMetrics()
    files_origins = tuple(values["files_origin"])
    http = IndexHTTP(values["index_url"], files_origins=files_origins, ca_bundle=values["ca_bundle"],
                     connect_timeout=values["connect_timeout"], read_timeout=values["read_timeout"])
    client = IndexClient(http, files_origins, max_page_size=values["max_page_size"])
    ledger = Ledger(ledger_dir(directory), quiet_start=True)  # serve's start-up check reported its junk
    try:
        await _online_key_signs(repo)
    except KeyUnavailable as e:
        audit.close()
        raise CommandError(f"the online key: {e}") from None
    pusher, lease, state = await _pusher(values, directory, repo, ledger, metrics)
    private_indexes = set(_private_indexes(values))

    def private(project: str) -> bool:
        """Private: claimed by --private-project, or taken from an index that needs credentials."""
        return (policy.claimed_private(project) is not None
                or ledger.index_of(project) in private_indexes)

    def key_failed(error: KeyUnavailable) -> None:
        metrics.signing_errors.inc()
        audit.refused(reason="signing-unavailable", target="metadata/timestamp.json", detail=str(error)[:500])

    publisher = Publisher(repo, window=values["batch_window"], observe=metrics.batch,
                          after=pusher.push if pusher is not None else None, key_failed=key_failed, private=private,
                          high_water=high_water_file(directory, values["cache_dir"]),
                          catalog=state_dir(directory, values["cache_dir"]) / "run" / "catalog.json")
    try:
        locks = FetchLocks(shared / "locks") if shared is not None else None
        files_dir = values["cache_dir"] or repo.public_dir
        Path(files_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommandError(f"cache dir {values['cache_dir']} is not usable: {e.strerror}") from e
    trust = SigstoreTrust(values["sigstore_trust_root"], values["sigstore_offline"],
                          processes=max(1, cpu_count() // values["workers"]))
    try:
        trust.prepare(ledger_dir(directory) / "sigstore")
    except OSError as e:
        raise CommandError(f"cannot prepare the Sigstore trust root: {e}") from e
    gate = provenance.ProvenanceGate(http, ledger, audit, metrics, provenance.policy_of(values), trust,
                                     publisher.add_targets, repo=publisher.repo, published=publisher.published)
    read_ahead = ReadAhead()
    gateway = Gateway(client, ledger, publisher, audit, metrics, policy, locks=locks, read_ahead=read_ahead.offer,
                      prefetch_depth=values["prefetch_depth"], prefetch_max=values["prefetch_max"],
                      advisories=AdvisoryWatch(store_path(ledger_dir(directory))), provenance=gate,
                      fetch_times=state_dir(directory, values["cache_dir"]) / "run" / "fetched.jsonl")
    files = FileSource(Path(files_dir), ledger, http, audit, metrics, values["max_file_size"],
                       Pace(stall=values["read_timeout"]), pins_elsewhere=state.refresh if state is not None else None,
                       shared_copy=lease.following if lease is not None else None, journal=repo.journal,
                       read_ahead=read_ahead, files_ahead=values["read_ahead"])
    access, tls = _access(values, gateway, audit, metrics, private)
    app = GatewayApp(gateway, files, repo.public_dir, access=access)
    app.files_origin_problem = values.get("files_origin_problem")
    served = listener.Listener(app.app(), listener.Limits.of(values), registry=metrics.registry)
    app.connections = served.connections
    if lease is not None:
        app.forwarder = Forwarder(lease, values["read_timeout"] + values["batch_window"] + 30)
    host, port = values["listen"]
    try:
        actual = await served.start(sock=sock, host=host, port=port, ssl_context=tls.context if tls is not None else None)
    except OSError as e:
        raise CommandError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    log.info("%s", served.describe())
    publisher.start()
    pushing = asyncio.create_task(pusher.keep_pushing(5.0)) if pusher is not None else None
    leasing = asyncio.create_task(lease.run()) if lease is not None else None
    # With workers, one of them at a time (whichever holds the lock) refreshes pages and re-signs.
    leader = Leadership(shared / "fresh.lock") if shared is not None else None
    reload_tls = asyncio.create_task(tls.keep_loaded()) if tls is not None else None
    fresh = asyncio.create_task(keep_fresh(gateway, repo, page_ttl=values["page_ttl"], rate=values["refresh_rate"],
                                           tick=min(5.0, values["page_ttl"] / 4), grace=values["gc_grace"], leader=leader,
                                           gc_state=state_dir(directory, values["cache_dir"]) / "run" / "gc-pending.json"))
    watching = asyncio.create_task(gateway.watch_advisories(ADVISORY_CHECK, leader))
    feeds = None
    if values["advisories_url"]:
        feed_http = IndexHTTP(values["advisories_url"], ca_bundle=values["ca_bundle"],
                              connect_timeout=values["connect_timeout"], read_timeout=values["read_timeout"])
        metrics.advisory_feeds_answered.set_to_current_time()  # a feed failing from the start ages from here
        feeds = (feed_http, asyncio.create_task(
            Feeds(feed_http.index_urls, feed_http, store_path(ledger_dir(directory)), repo,
                  max_size=values["advisories_max_size"], answered=metrics.advisory_feeds_answered.set_to_current_time)
            .run(values["advisories_refresh"], leader)))

    async def stop() -> None:
        fresh.cancel()
        watching.cancel()
        if feeds is not None:
            feeds[1].cancel()
            await feeds[0].close()
        if reload_tls is not None:
            reload_tls.cancel()
        if pushing is not None:
            pushing.cancel()
        if leasing is not None and lease is not None:
            leasing.cancel()
            await lease.release()
        if app.forwarder is not None:
            await app.forwarder.close()
        await gateway.prefetcher.cancel()
        await publisher.stop()
        await served.stop()
        await files.close()
        await http.close()
        trust.close()
        audit.close()
        if leader is not None:
            leader.close()

    return Started(app.update_gauges, stop), actual


async def _serve(directory: Path, values: dict, policy: Policy) -> None:
    started, port = await _start(directory, values, policy, None, None)
    stop = stop_on_signals()
    scheme = "https" if values["tls_cert"] else "http"
    print(f"tufproxy gateway serving {directory / 'public'} on {scheme}://{values['listen'][0]}:{port}/ "
          f"(indexes: {', '.join(strip_credentials(u)[0] for u in values['index_url'])})", flush=True)
    try:
        await stop.wait()
    finally:
        await started.stop()


def serve_lock(directory: Path) -> Path:
    return ledger_dir(directory) / "serve.lock"


def _claim(directory: Path, listen: tuple[str, int]) -> None:
    """Refuse a second gateway on DIR in one line: it would sign beside this one and re-publish at once.

    A POSIX record lock on DIR/gateway/serve.lock, held while this process lives: the OS drops it when the
    process dies (even by SIGKILL), and --workers children never hold it (record locks are not inherited).
    """
    path = serve_lock(directory)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise CommandError(f"cannot open {path}: {e.strerror}") from e
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise CommandError(f"{directory} is already served by another gateway ({holder}): stop that one first, "
                           "or give it more --workers") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {listen[0]}:{listen[1]}".encode(), 0)
    # The descriptor stays open (and the lock held) until the process exits.


def resolve_serve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> tuple[dict[str, Any], Policy]:
    """``gateway serve``'s settings and policy: one read of ``--config`` for both tables, all parsed up front."""
    file_values = read_config(args.config, [*(o.name for o in OPTIONS), *POLICY_KEYS])
    return (resolve_values(args, OPTIONS, environ, file_values, str(args.config)),
            resolve_policy(args, environ, file_values, str(args.config)))


def _cmd_rebin(args: argparse.Namespace) -> int:
    return rebin_repository(_open(Path(args.dir)), args)


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        values, policy = resolve_serve(args)
    except ConfigError as e:
        raise CommandError(str(e)) from e
    if not values["index_url"]:
        raise CommandError("give --index-url URL (the index to take projects from; there is no default)")
    if values["workers"] < 1:
        raise CommandError("--workers: give 1 or more")
    if values["leader_lease"] is not None and (values["store"] is None or values["workers"] > 1):
        raise CommandError("--leader-lease needs --store s3://... and --workers 1 (one process per replica)")
    _fail_closed(values)
    directory = Path(args.dir)
    try:
        _open(directory).check()  # a damaged metadata file is named now, not met mid-publish
    except RepositoryError as e:
        raise CommandError(str(e)) from e
    _claim(directory, values["listen"])
    logs.configure(values["log_level"], values["log_format"])
    try:
        atomic_write(policy_file(directory), json.dumps(policy.to_json(), indent=2).encode() + b"\n")
    except OSError as e:
        raise CommandError(f"cannot record the policy in {policy_file(directory)}: {e.strerror}") from e
    print("policy, applied before signing:\n  " + policy.describe(datetime.now(UTC)).replace("\n", "\n  "), flush=True)
    print(f"  PEP 740 {provenance.policy_of(values).describe()}; Sigstore trust root {values['sigstore_trust_root']}"
          f"{' (offline)' if values['sigstore_offline'] else ''}", flush=True)
    _check_restore(directory, values["cache_dir"])
    _check_ledger(directory)
    # Checked once, before the workers start; /readyz repeats it for tufproxy doctor.
    values["files_origin_problem"] = problem = asyncio.run(_files_origin_problem(values))
    if problem is not None:
        log.warning("foreign-origin: %s", problem)
    if values["workers"] > 1:
        return Supervisor(GatewayWorkers(directory, values, policy), values["workers"]).run()
    asyncio.run(_serve(directory, values, policy))
    return 0


def high_water_file(directory: Path, cache_dir: Path | None) -> Path:
    """The highest timestamp version published, kept with what is never restored from a backup."""
    return state_dir(directory, cache_dir) / "run" / "high-water.json"


def _check_restore(directory: Path, cache_dir: Path | None, remembered: int = 0) -> None:
    """A directory older than what this gateway published (a restore): re-sign every online role above it.
    ``remembered``: a timestamp version published elsewhere (the bucket's copy)."""
    repo = _open(directory)
    try:
        restored = resign_after_restore(repo, high_water_file(directory, cache_dir), remembered)
    except KeyUnavailable as e:
        raise CommandError(f"{repo.metadata_dir} was restored from an older copy and must be re-signed, but the "
                           f"online key cannot sign: {e}") from None
    if restored is not None:
        log.warning("%s was restored from an older copy (timestamp v%d, below v%d published before): re-signed "
                    "every online role, all %d bins included, above anything published", repo.metadata_dir,
                    restored[0], restored[1], repo.settings.bins)


def _check_ledger(directory: Path) -> None:
    """Cross-check the ledger with the signed pages before serving: rebuild the pins it lacks, and say so.
    Only when its index was built afresh: one that has followed the same file all along holds every pin,
    since a pin is appended before its page is signed, so a start reads no page and no bin."""
    ledger = Ledger(ledger_dir(directory))
    try:
        if not ledger.reindexed:
            return
        existed = ledger.path.exists()
        try:
            published = sorted(Catalog(_open(directory)).update().projects)
        except RepositoryError as e:
            raise CommandError(str(e)) from e
        try:
            rebuilt, projects = rebuild_pins(ledger, Path(directory) / "public", published)
        except OSError as e:
            raise CommandError(f"cannot write the ledger {ledger.path}: {e.strerror}") from e
    finally:
        ledger.close()
    if not existed:
        log.warning("ledger %s is missing: rebuilt %d pin(s) of %d project(s) from the signed pages", ledger.path,
                    rebuilt, projects) if published else log.debug("ledger %s: none yet (nothing published)", ledger.path)
    elif rebuilt:
        log.warning("ledger %s lacks %d pin(s) of %d project(s) that the signed pages list (truncated, replaced or "
                    "restored from an older copy?): rebuilt them from the signed pages", ledger.path, rebuilt, projects)


async def _files_origin_problem(values: dict) -> str | None:
    http = IndexHTTP(values["index_url"], files_origins=values["files_origin"], ca_bundle=values["ca_bundle"],
                     connect_timeout=values["connect_timeout"], read_timeout=values["read_timeout"])
    try:
        return await files_origin_problem(IndexClient(http, tuple(values["files_origin"]), values["max_page_size"]))
    finally:
        await http.close()


def _private_indexes(values: dict[str, Any]) -> tuple[str, ...]:
    """The --index-url entries that need credentials (in the URL or netrc), without them: their projects are private."""
    auth = OriginAuth()
    return tuple(clean for clean in auth.add_all(values["index_url"]) if auth.has(clean))


def _fail_closed(values: dict[str, Any]) -> None:
    """Refuse to turn a password-protected index into a public one (one line naming the index and the fix)."""
    guarded = values["auth_file"] is not None or values["tls_client_ca"] is not None
    private = _private_indexes(values)
    if private and not guarded and not values["allow_anonymous_private"]:
        raise CommandError(f"index {private[0]} needs credentials, so its projects are private, and this gateway "
                           "would serve them to anyone: give --auth-file FILE (readers must authenticate) or "
                           "--tls-client-ca FILE, or --allow-anonymous-private yes to accept that")


def _access(values: dict[str, Any], gateway: Gateway, audit: AuditLog, metrics: GatewayMetrics,
            private: Callable[[str], bool]) -> tuple[AccessMiddleware | None, ServerTLS | None]:
    """The guard's middleware (None without --auth-file and rules) and the listener's TLS."""
    try:
        tls = server_tls(values["tls_cert"], values["tls_key"], values["tls_client_ca"])
        if values["auth_file"] is None and not values["read_rule"] and not values["publish_rule"]:
            return None, tls
        passwords = Passwords(values["auth_file"], values["auth_groups"]) if values["auth_file"] else None
    except (AuthFileError, TLSConfigError) as e:
        raise CommandError(str(e)) from None
    authenticated = frozenset({AUTHENTICATED})
    guard = Guard(passwords, Rules(values["read_rule"], authenticated, values["allow_anonymous_private"]),
                  Rules(values["publish_rule"], authenticated))
    any_private = bool(gateway.policy.private_project) or bool(_private_indexes(values))
    return AccessMiddleware(guard, gateway_resource(private, any_private), audit,
                            refusals_counter(metrics.registry)), tls


def _cmd_ledger(args: argparse.Namespace) -> int:
    _open(Path(args.dir))
    entries = Ledger(ledger_dir(Path(args.dir))).entries()
    if args.json:
        print(json.dumps(list(entries), indent=2))
        return 0
    for e in entries:
        if e["kind"] == "project":
            print(f"project {e['project']} from {e['index']}")
        elif e["kind"] == "seen":
            print(f"seen {e['project']} {e['filename']} cooldown from {e['counts_from'] or 'its upload-time'}")
        elif e["kind"] == "pin":
            size = "?" if e["size"] is None else e["size"]
            print(f"pin {e['project']} {e['filename']} sha256={e['hashes'].get('sha256', '?')} size={size} ({e['time']})")
        else:
            print(f"revoked {e['project']} {e['filename'] or '(whole project)'}")
    return 0


def _cmd_policy(args: argparse.Namespace) -> int:
    _open(Path(args.dir))
    path = policy_file(Path(args.dir))
    try:
        recorded = json.loads(path.read_text())
        policy = resolve_policy(None, {}, recorded, str(path))
    except FileNotFoundError:
        raise CommandError(f"{path}: no policy recorded; 'tufproxy gateway serve' records its effective policy "
                           "there when it starts") from None
    except (OSError, ValueError) as e:  # PolicyError is a ValueError
        raise CommandError(f"cannot read {path}: {e}") from None
    print(json.dumps(policy.to_json(), indent=2) if args.json else policy.describe(datetime.now(UTC)))
    return 0


def _gateway_running(directory: Path) -> bool:
    """Whether a ``gateway serve`` holds DIR (its :func:`_claim` on ``serve.lock``): ``gateway revoke`` asks."""
    try:
        fd = os.open(serve_lock(directory), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (closing drops this process's probe lock, if it got one)
    return False


def _lists(page: index.ProjectPage | None, filename: str | None) -> bool:
    return page is not None and (filename is None or any(f.filename == filename for f in page.files))


def _cmd_revoke(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    repo = _open(directory)
    project = canonicalize_name(args.project)
    what = f"{project} {args.filename or '(whole project)'}"
    ledger = Ledger(ledger_dir(directory))
    before = repo.load_metadata("timestamp").signed.version
    running = _gateway_running(directory)
    ledger.append([{"kind": "revoke", "project": project, "filename": args.filename, "reason": args.reason}])
    audit = AuditLog(args.audit_log)
    try:
        audit.refused(reason="revoked", target=f"packages/{project}/{args.filename}" if args.filename else f"simple/{project}/",
                      detail=args.reason or "revoked by the operator")
    finally:
        audit.close()
    start = time.monotonic()
    page = repo.current_page(project)
    if not _lists(page, args.filename):
        print(f"revoked {what}: was not published; kept out from now on")
        return 0
    if not running:
        if page is not None and args.filename is not None:
            page = dataclasses.replace(page, files=tuple(f for f in page.files if f.filename != args.filename))
        report = repo.publish_pages({project: None if args.filename is None else page})
        versions = ", ".join(f"{r} v{v}" for r, v in report.signed.items() if r in ("snapshot", "timestamp"))
        print(f"revoked {what}: published {versions} in {time.monotonic() - start:.2f}s (no gateway is running)")
        return 0
    # The running gateway signs it: confirmed only by a timestamp of its own that no longer lists the file.
    while time.monotonic() - start < args.wait:
        time.sleep(0.2)
        version = repo.load_metadata("timestamp").signed.version
        if version > before and not _lists(repo.current_page(project), args.filename):
            print(f"revoked {what}: published by the running gateway in timestamp v{version}, {time.monotonic() - start:.2f}s")
            return 0
    raise CommandError(f"recorded the revocation of {what} in {ledger.path}, but the running gateway did not publish "
                       f"a timestamp without it within {args.wait:g}s: it has not applied it; see its log")


def _cmd_provenance(args: argparse.Namespace) -> int:
    if not ledger_dir(Path(args.dir)).is_dir():
        raise CommandError(f"{args.dir}: no gateway here (no {ledger_dir(Path(args.dir))}); 'tufproxy gateway init' makes one")
    ledger = Ledger(ledger_dir(Path(args.dir)))
    if args.accept:
        try:
            project, spec = next(iter(parse_trusted_publishers(args.accept).items()))
        except ValueError as e:
            raise CommandError(f"--accept: {e}") from e
        if not args.reason:
            raise CommandError("--accept needs --reason TEXT (kept in the ledger and the audit record)")
        before = (ledger.publisher(project) or {}).get("spec")
        ledger.append([{"kind": "publisher", "project": project, "spec": str(spec), "filename": None,
                        "accepted": True, "reason": args.reason}])
        audit = AuditLog(args.audit_log)
        try:
            audit.refused(reason="publisher-accepted", target=f"simple/{project}/", project=project,
                          expected=before, seen=str(spec), detail=args.reason)
        finally:
            audit.close()
        print(f"{project}: publisher {before or '(none)'} -> {spec} accepted")
        return 0
    pins = [{"project": p, "spec": r["spec"], **parse_spec(r["spec"]).to_json(), "time": r.get("time"),
             "filename": r.get("filename"), "accepted": bool(r.get("accepted")), "reason": r.get("reason")}
            for p, r in ((r["project"], r) for r in ledger.publishers())]
    if args.json:
        print(json.dumps(pins, indent=2))
        return 0
    for pin in pins:
        source = f"accepted: {pin['reason']}" if pin["accepted"] else f"first verified file {pin['filename']}"
        print(f"{pin['project']}  {pin['spec']}  pinned {pin['time']}  ({source})")
    if not pins:
        print("no publisher pinned yet")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy gateway`` and its subcommands."""
    gw = subparsers.add_parser(
        "gateway",
        description="Fetch projects from a plain PEP 503/691 index on demand, check every file against the "
        "index's hashes, pin them, and publish them as a TUF repository signed with the organisation's keys, "
        "which edges (tufproxy serve) and mirrors verify from its root.",
    )
    sub = gw.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)

    p = sub.add_parser("init", help="create keys and an empty signed repository (gateway layout) in DIR",
                       epilog=KEY_URI_HELP + "\n" + BINS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", metavar="DIR")
    add_bins_arguments(p, DEFAULT_BINS)
    add_key_arguments(p)
    p.add_argument("--root-expiry", type=_days, default=timedelta(days=365), metavar="DAYS", help="root lifetime (default: 365)")
    p.add_argument(
        "--offline-expiry",
        type=_days,
        default=timedelta(days=365),
        metavar="DAYS",
        help="targets and bins lifetime (default: 365)",
    )
    p.add_argument(
        "--online-expiry",
        type=_days,
        default=timedelta(days=1),
        metavar="DAYS",
        help="timestamp, snapshot and bin-n lifetime (default: 1; re-signed every eighth of it)",
    )
    p.set_defaults(func=_guarded(_cmd_init))

    add_rebin_parser(sub, _cmd_rebin)

    p = sub.add_parser(
        "serve",
        help="serve DIR/public and fill it from the index on demand",
        description="Serve the signed tree in DIR/public over HTTP and publish projects into it on "
        "demand. Every setting is a flag, a TUFPROXY_<NAME> variable or a key of --config FILE.",
        epilog=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR")
    add_arguments(p, OPTIONS)
    add_policy_arguments(p)
    p.set_defaults(func=_guarded(_cmd_serve))

    add_up(sub)

    p = sub.add_parser(
        "policy",
        help="show the policy the gateway in DIR last started with",
        description="The effective policy (cooldown, project rules, private names) that "
        "'tufproxy gateway serve DIR' recorded when it last started.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="machine-readable output (the TOML keys and values)")
    p.set_defaults(func=_guarded(_cmd_policy))

    advisories.register(sub, ledger_dir, policy_file)

    p = sub.add_parser("ledger", help="show the pinned files, their index and the revocations")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guarded(_cmd_ledger))

    p = sub.add_parser(
        "revoke",
        help="remove a project or one file from the signed tree now, and keep it out",
        description="Record the revocation of PROJECT (or only FILENAME) in the ledger so later refreshes keep it "
        "out, write an audit record, and unpublish it in one publish: by the running gateway if one runs (confirmed "
        "once a timestamp it signed no longer lists it), else here.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("project", metavar="PROJECT")
    p.add_argument("filename", metavar="FILENAME", nargs="?")
    p.add_argument("--reason", help="why (kept in the ledger and the audit record)")
    p.add_argument("--audit-log", type=Path, metavar="FILE", help="append the audit record here (default: stdout)")
    p.add_argument("--wait", type=_positive_float, default=30.0, metavar="SECONDS",
                   help="with a gateway running, how long to wait for it to publish a timestamp without the file "
                   "(default: 30); exit 2 if it does not")
    p.set_defaults(func=_guarded(_cmd_revoke))

    p = sub.add_parser(
        "provenance",
        help="list each project's pinned PEP 740 publisher, or accept a change",
        description="Each project's trusted publisher as pinned in DIR's ledger (kind, repository or e-mail, "
        "workflow, when, from which file). --accept records a publisher change the operator vouches for, "
        "in the ledger and the audit log; works beside a running gateway.",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--accept", metavar="PROJECT=SPEC", help="pin this publisher for PROJECT from now on")
    p.add_argument("--reason", help="why the publisher changed (required with --accept)")
    p.add_argument("--audit-log", type=Path, metavar="FILE", help="append the audit record here (default: stdout)")
    p.set_defaults(func=_guarded(_cmd_provenance))

    ceremony_cli.register(sub, _open, _guarded)
