"""Batched signing: many page changes, one snapshot and one timestamp.

Callers hand :meth:`Publisher.publish` the pages of some projects (None
removes one) and wait for the timestamp version that carries them.  One
task signs: while it signs, new requests queue, and the next batch signs
everything queued in one transaction of the signer
(:meth:`Repository.publish_pages`), so N projects arriving together cost
one snapshot and one timestamp signature, however many bins they touch.
The window adapts: a lone miss is signed at once; only while other pages
are still being fetched for a publish (:meth:`Publisher.preparing`) does a
batch wait for them, and no longer than the last batches that signed
pages took (``patience``, at most ``window`` seconds): waiting longer costs
every page already in hand more than the late page gains, which is then
signed in the next batch, at most one batch later than it would have been.
Which pages depends on who waits: a batch a client waits for waits only
for the pages other clients wait for, never for a guess (a dependency
prefetch no one asked for yet); a batch of guesses alone waits for every
page still being fetched, so that
a wave of prefetched pages arriving within milliseconds of each other is
signed in one batch rather than one behind the other, while no one waits.
A client asking for a guess (:meth:`Publisher.urge`) makes it a client's
page from then on.  The signer runs in a thread and keeps its
own write order (bin-n, snapshot, then timestamp, each atomic), so a
crash mid-publish leaves the previous timestamp in force.

Under ``gateway serve --workers N`` every worker has a publisher of its
own and they sign one at a time: each batch is one transaction of the
signer, which holds the repository's cross-process lock (``DIR/.lock``,
``flock``) and re-reads the current timestamp, snapshot, bins and pages
from disk under it.  So versions strictly increase whichever worker
signs, N projects arriving together still cost at most one signature per
worker's batch, and a worker killed mid-batch leaves the previous
timestamp in force and releases the lock with its death.  What other
workers signed reaches this one's view (``published``, the timestamp
version) through :meth:`Publisher.reload`.

When the online key cannot sign (its token removed, its KMS unreachable:
:class:`~proxy.repository.keysource.SigningError`), the batch's waiters hear
that error (the app answers 503), the last signed tree stays served, and the
key is not asked again until a back-off (1 s doubling to 30 s) has passed:
meanwhile new batches fail at once and a probe signature retries in the
background, so a token put back is used again without a restart.

The catalog of published projects (:class:`~proxy.repository.catalog.Catalog`)
is kept in ``run/catalog.json`` when the caller gives that file: written after
the first look if it read any bin, at most every ``CATALOG_SAVE_EVERY`` seconds
after a batch while bins change, and at a clean stop, always in a thread: a
restart then reads only the bins signed since, not every bin.

The highest timestamp version ever published is also kept in a small
high-water file outside the state an operator restores (``run/``).  A
directory whose timestamp is below it was restored from an older copy:
:func:`resign_after_restore` then re-signs every online role, every bin
included, at versions above anything published, so edges that trust a
bin signed after the backup never see the restored one as a rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.protocol import index, lease
from proxy.protocol.layout import metadata_filename
from proxy.repository import ChangeReport, Repository
from proxy.repository.catalog import Catalog
from proxy.repository.keys import ONLINE
from proxy.repository.keysource import KeyUnavailable
from proxy.util.atomic import atomic_write, file_stamp

log = logging.getLogger(__name__)

Pages = dict[str, index.ProjectPage | None]
Targets = dict[str, tuple[bytes, dict[str, Any]]]  # target path -> (bytes, its custom field)
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
# Writing the catalog costs O(projects) (20 ms at 100,000): seldom enough to be nothing, often enough that a
# crash costs a restart only the bins signed in the last few minutes.
CATALOG_SAVE_EVERY = 300.0
FORESIGHTS = 1024  # projects whose latest signing is remembered for a publish answer
MAX_BODY = 1 << 20  # a file a publish answer carries (a snapshot of 16,384 bins is 534 KB)
# What a batch is taken to cost before one was measured: a lone page's, beside a client's install on 2 cores.
FIRST_PATIENCE = 0.025
PATIENCE_WEIGHT = 0.3  # of the newest batch in the running estimate: a few batches move it


def _small(path: Path) -> bytes | None:
    """``path``'s bytes, if it exists and is at most MAX_BODY long."""
    try:
        with path.open("rb") as f:
            body = f.read(MAX_BODY + 1)
    except FileNotFoundError:
        return None
    return body if len(body) <= MAX_BODY else None


@dataclass(frozen=True)
class Foresight:
    """The immutable files a batch signed for one project's page: ``roles`` (role -> version, the snapshot
    and the page's bin-n) and ``targets`` (its page target -> the digest it is served under).  A publish answer
    names them so the edge fetches them side by side (:mod:`proxy.transport.foreseen`); it trusts none the
    sooner for it."""

    roles: dict[str, int]
    targets: dict[str, str]
    version: int | None = None  # the timestamp version of the batch that signed them (None: not known)


@dataclass(frozen=True)
class Carried:
    """What a publish answer carries (:meth:`Publisher.carried`): the timestamp version it names (None: the
    one the publish reported), the roles the edge's next cycle and lookup read (role -> version), and the bodies
    of those files and of the timestamp, by their path in the tree (None: the tree has no such file)."""

    version: int | None
    roles: dict[str, int]
    bodies: dict[str, bytes | None]


def _named_by(stamp: bytes, roles: dict[str, int], read: Callable[[str], bytes | None]) -> tuple[int | None, dict[str, int]]:
    """The timestamp ``stamp``'s version, and ``roles`` (the snapshot and delegated roles a batch signed) at the
    versions it names: its snapshot, and in that snapshot each delegated role (``read``: a file of the metadata
    directory).  Read with plain JSON, unverified: the edge verifies what it is handed.  Anything unexpected
    (a role no longer listed, a file gone or too large) leaves ``roles`` as they were, and the edge fetches what
    it then lacks."""
    try:
        signed = json.loads(stamp)["signed"]
        version, snapshot = int(signed["version"]), int(signed["meta"]["snapshot.json"]["version"])
        if snapshot == roles.get("snapshot"):
            return version, roles
        body = read(metadata_filename("snapshot", snapshot))
        if body is None:
            return version, roles
        listed = json.loads(body)["signed"]["meta"]
        return version, {role: snapshot if role == "snapshot" else int(listed[f"{role}.json"]["version"])
                         for role in roles}
    except (ValueError, KeyError, TypeError):
        return None, roles


@dataclass(frozen=True)
class Signed:
    """A batch's answer to each publish in it: the timestamp version that carries it, and where the time went
    (seconds): waiting for the batch to start, signing (pages rendered and roles signed, the repository's lock
    included), and writing (the files, their fsyncs, the bucket push)."""

    version: int
    waited: float = 0.0
    signing: float = 0.0
    writing: float = 0.0


class Publisher:
    """The one signer task of a gateway process."""

    def __init__(self, repo: Repository, window: float = 0.2,
                 observe: Callable[[int, float], None] | None = None,
                 after: Callable[[], Awaitable[object]] | None = None,
                 key_failed: Callable[[KeyUnavailable], None] | None = None,
                 private: Callable[[str], bool] | None = None, high_water: Path | None = None,
                 catalog: Path | None = None, flush_also: tuple[Path, ...] = (), *,
                 patience: float | None = None) -> None:
        self.repo = repo
        self.flush_also = flush_also  # files made durable with each batch, before its commit point (the ledger)
        self.private = private  # which projects to mark private in the signed metadata
        self.high_water = high_water  # where the highest timestamp version published is kept
        self._resign_all = False  # the next re-sign covers every online role (after a restore)
        self._key_failed = key_failed  # each time the online key failed to sign (metric, audit)
        # Why the online key cannot sign now (None: it can), and when it is next tried.
        self.signing_error: KeyUnavailable | None = None
        self._backoff, self._retry_at = 0.0, 0.0
        self._probe: asyncio.Task[None] | None = None
        # Run after each signed batch, before its waiters hear (the bucket push: proxy.storage.treepush).
        self._after = after
        self.window = window
        # How long a batch waits for pages still being fetched, below ``window``: what the last batches that signed
        # pages took (None given: measured as they go; a figure: fixed, for tests of who waits for whom).
        self._measured = patience is None
        self.patience = FIRST_PATIENCE if patience is None else patience
        self._observe = observe  # (pages the batch changed, seconds it took)
        self._pending: Pages = {}
        self._targets: Targets = {}  # other signed targets (provenance objects), signed with the next batch
        self._resign = False
        self._waiters: list[tuple[asyncio.Future[Signed], float]] = []  # and when each was queued (monotonic)
        self._wake = asyncio.Event()
        # Pages being fetched that a publish will follow (one fetch per project at a time: the gateway's single
        # flight), and whether a client waits for each; whether a client waits for the pages queued now.
        self._fetching: dict[str, bool] = {}
        self._urgent = False
        self._task: asyncio.Task[None] | None = None
        self._view = threading.Lock()  # _sign (in a thread) and reload (on the loop) both update the view
        self._seen: object = None
        self.catalog = Catalog(repo, catalog)  # remembered in ``catalog`` across restarts, if given
        self._catalog_saved = time.monotonic()
        # Every published project: the catalog's own set, current after each batch and reload().
        self.published: set[str] = self.catalog.projects
        # Project -> the timestamp version that last carried a new signature of its page (signed here).
        self.resigned_at: dict[str, int] = {}
        self.timestamp_version, self.timestamp_expires = 0, 0.0
        self._foresights: OrderedDict[str, Foresight] = OrderedDict()  # by project, the newest last
        self.reload()

    def take_touched(self) -> set[str]:
        """Projects whose bins moved since the last call (for the collector), taken under the view's lock: a
        batch being signed in its thread adds to the set it would otherwise still be iterated as."""
        with self._view:
            return self.catalog.take_touched()

    def reload(self) -> None:
        """Take up what other processes signed (other workers, ``tufproxy gateway revoke``); cheap when nothing did
        (the bins another process re-signed are read, not every project)."""
        seen = file_stamp(self.repo.metadata_dir / "timestamp.json")
        if seen == self._seen:
            return
        version, expires = self._read_timestamp()
        with self._view:
            self.catalog.update()
            self._seen = seen
            if version > self.timestamp_version:
                self.timestamp_version, self.timestamp_expires = version, expires
            restored = version < self.timestamp_version and not self._resign_all
        if restored:  # the directory was replaced under us by an older copy
            log.warning("%s was restored from an older copy while serving (timestamp v%d, below v%d published "
                        "before): re-signing every online role, every bin included, above anything published",
                        self.repo.metadata_dir, version, self.timestamp_version)
            self._resign_all = True
            task = asyncio.get_running_loop().create_task(self.resign())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure is logged by _run

    def _read_timestamp(self) -> tuple[int, float]:
        md = self.repo.load_metadata("timestamp")
        return md.signed.version, md.signed.expires.timestamp()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._probe):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._save_catalog()

    async def _save_catalog(self) -> None:
        """Persist the catalog if it learnt bins since it was written (in a thread: O(projects))."""
        if not self.catalog.unsaved:
            return
        self._catalog_saved = time.monotonic()
        try:
            await asyncio.to_thread(self.catalog.save)
        except OSError as e:
            log.warning("cannot keep the catalog in %s (%s): the next start reads the bins it lacks",
                        self.catalog.persisted, e.strerror)

    def _key_down(self, error: KeyUnavailable) -> None:
        self.signing_error = error
        if self._key_failed is not None:
            self._key_failed(error)
        if not error.retry:
            # A wrong PIN tried again counts towards locking the token: the operator fixes it and restarts.
            self._retry_at = float("inf")
            log.error("the online key cannot sign, not retried (fix the PIN and restart): %s", error)
            return
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_FIRST, self._backoff * 2))
        self._retry_at = time.monotonic() + self._backoff
        log.error("the online key cannot sign (retrying in %.0f s): %s", self._backoff, error)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._retry())

    async def _retry(self) -> None:
        """Probe the key after each back-off until it signs again."""
        while self.signing_error is not None:
            await asyncio.sleep(max(0.0, self._retry_at - time.monotonic()))
            try:
                await asyncio.to_thread(self.repo.check_key, ONLINE)
            except KeyUnavailable as e:
                self._key_down(e)
                if not e.retry:
                    return
                continue
            log.info("the online key signs again")
            self.signing_error, self._backoff = None, 0.0

    @contextlib.contextmanager
    def preparing(self, project: str, urgent: bool = True) -> Iterator[None]:
        """While this is held, ``project``'s page is being fetched for a publish: a batch about to be signed may
        wait for it (at most ``patience``; see the module docstring).  ``urgent``: a client waits for it."""
        self._fetching[project] = urgent
        try:
            yield
        finally:
            self._fetching.pop(project, None)
            self._wake.set()  # a batch waiting for it looks again

    def urge(self, project: str) -> None:
        """A client now waits for ``project``, a guess being fetched or queued: no batch waits for guesses on its
        account any more, and one waits for its page as for any client's."""
        if project in self._fetching:
            self._fetching[project] = True
        elif project in self._pending:
            self._urgent = True
        self._wake.set()

    def _holding(self) -> bool:
        """Whether the batch about to be signed waits for pages still being fetched (the module docstring)."""
        return any(self._fetching.values()) or (bool(self._fetching) and not self._urgent)

    async def publish(self, pages: Pages, urgent: bool = True) -> Signed:
        """Queue ``pages``; the timestamp version that first carries them all, and the batch's times.
        ``urgent=False``: a guess no client waits for yet (a prefetch)."""
        self._pending.update(pages)
        return await self._enqueue(urgent)

    def add_targets(self, targets: Targets) -> None:
        """Sign ``targets`` with the next batch that signs (queued before the page that refers to them, never after)."""
        self._targets.update(targets)

    async def resign(self) -> int:
        """Re-sign online roles past half their lifetime (the timestamp before it expires)."""
        self._resign = True
        return (await self._enqueue()).version

    async def _enqueue(self, urgent: bool = True) -> Signed:
        self._urgent |= urgent
        future: asyncio.Future[Signed] = asyncio.get_running_loop().create_future()
        self._waiters.append((future, time.monotonic()))
        self._wake.set()
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        await self._save_catalog()  # what the first look read (after the listener opened), for the next start
        while True:
            await self._wake.wait()
            # The batch window: only pages still being fetched for a publish are waited for, about as long as a
            # batch takes (the module docstring).
            deadline = loop.time() + min(self.window, self.patience)
            while self._holding() and (left := deadline - loop.time()) > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            self._wake.clear()
            if not self._waiters:
                continue  # woken by a fetch that ended without a publish
            pages, self._pending, self._urgent = self._pending, {}, False
            resign, self._resign = self._resign, False
            waiters, self._waiters = self._waiters, []
            start = time.monotonic()
            if self.signing_error is not None and start < self._retry_at:
                for w, _ in waiters:  # backing off: the key is not asked again yet
                    if not w.done():
                        w.set_exception(KeyUnavailable(str(self.signing_error)))
                continue
            try:
                targets, self._targets = self._targets, {}
                signed, writing = await asyncio.to_thread(self._sign, pages, resign, targets)
                self.signing_error, self._backoff = None, 0.0
            except Exception as e:  # noqa: BLE001 - the signer refused or the disk failed: every waiter hears why
                self._targets = {**targets, **self._targets}  # signed with a later batch
                # tuf's Metadata.sign wraps the signer's error (UnsignedMetadataError): the key's failure is its cause.
                key = e if isinstance(e, KeyUnavailable) else e.__cause__
                if isinstance(key, KeyUnavailable):
                    self._key_down(key)
                    e = key
                log.error("publish of %d project(s) failed: %s", len(pages), e)
                for w, _ in waiters:
                    if not w.done():
                        w.set_exception(e)
                continue
            signing = time.monotonic() - start - writing
            if self._observe is not None and signed:
                self._observe(signed, time.monotonic() - start)
            if self._after is not None:
                pushed = time.monotonic()
                try:
                    await self._after()
                except Exception as e:  # noqa: BLE001 - signed locally; the next push catches the bucket up
                    log.error("after publishing: %s", e)
                writing += time.monotonic() - pushed
            if self._measured and signed and not resign:
                # Only batches that signed pages: a refresh that changed nothing or a re-sign of every role is not
                # what a late page would cost; one stalled write moves the estimate no further than the window.
                self.patience += PATIENCE_WEIGHT * (min(signing + writing, self.window) - self.patience)
            for w, queued in waiters:
                if not w.done():
                    w.set_result(Signed(self.timestamp_version, start - queued, signing, writing))
            if time.monotonic() - self._catalog_saved >= CATALOG_SAVE_EVERY:
                await self._save_catalog()

    def foresight(self, project: str) -> Foresight | None:
        """What an edge's next lookup of ``project`` reads, if a recent batch of this process signed its page."""
        with self._view:
            return self._foresights.get(project)

    def carried(self, foresight: Foresight, root_version: int | None) -> Carried:
        """What a publish answer carries for ``foresight``'s page: the bytes of the files the edge's next cycle and
        lookup read, by their path in the tree, so that it reads them without a round trip.  With the root
        version the edge trusts, the next root too, or None where the tree has none (the probe every cycle
        makes first).  A file gone since (collected) or larger than :data:`MAX_BODY` is left out: the edge
        fetches it.

        The timestamp only where edges read this directory: one pushed to a bucket (a replica group) is
        served there once pushed, and one a follower signed alone never is; an edge that trusted it first
        would take the group's older one for a rollback.  That timestamp is the tree's current one, and the
        snapshot and bin-n carried are the ones it names (:func:`_named_by`), not the batch's that signed the
        page: a batch signed since moved both, and an edge handed the older ones fetched the current ones
        before it could answer.  Without a timestamp, the batch's own files (immutable) are carried."""
        repo = self.repo
        meta = repo.profile.metadata_path
        read: dict[str, bytes | None] = {}

        def small(name: str) -> bytes | None:  # a file of the tree, read once (the snapshot: by _named_by, then here)
            if name not in read:
                read[name] = _small(repo.public_dir / name)
            return read[name]

        roles, version = foresight.roles, None
        found: dict[str, bytes | None] = {}
        if self._after is None:
            stamp = small(f"{meta}{metadata_filename('timestamp', None)}")
            if stamp is not None:
                found[f"{meta}{metadata_filename('timestamp', None)}"] = stamp
                version, roles = _named_by(stamp, foresight.roles, lambda name: small(f"{meta}{name}"))
        names = [*(f"{meta}{metadata_filename(role, role_version)}" for role, role_version in roles.items()),
                 *(repo.profile.served_name(path, digest) for path, digest in foresight.targets.items())]
        for name in names:
            if (body := small(name)) is not None:
                found[name] = body
        if root_version is not None:
            probe = f"{meta}{metadata_filename('root', root_version + 1)}"
            found[probe] = _small(repo.public_dir / probe)
        return Carried(version, roles, found)

    def _foresee(self, pages: Pages, report: ChangeReport) -> None:
        """Remember, for each page this batch signed anew, its snapshot, its bin-n and its page target.

        Only the first signed format's target (JSON): what pip and uv ask
        for, and what an edge reads a file's entry from.  An edge asked for
        another format fetches it when asked; fetching both each time cost
        the gateway and the edge a request, a hash and a write per page."""
        profile = self.repo.profile
        for project, page in pages.items():
            self._foresights.pop(project, None)
            found = {path: report.targets[path] for fmt in profile.signed_formats[:1]
                     if (path := profile.page_target(project, fmt)) in report.targets}
            if page is None or not found or "snapshot" not in report.signed:
                continue
            roles = {"snapshot": report.signed["snapshot"],
                     **{role: report.signed[role] for _, role in found.values() if role in report.signed}}
            self._foresights[project] = Foresight(roles, {path: digest for path, (digest, _) in found.items()},
                                                  report.signed.get("timestamp"))
            while len(self._foresights) > FORESIGHTS:
                self._foresights.popitem(last=False)

    def _sign(self, pages: Pages, resign: bool, targets: Targets | None = None) -> tuple[int, float]:
        """Sign; how many project pages changed (0 when nothing was signed for pages), and the seconds the
        pages' files and metadata took to write."""
        changed, resigned, writing = 0, [], 0.0
        if pages or targets:
            report = self.repo.publish_pages(pages, private=self.private, targets=targets, flush_also=self.flush_also)
            resigned = [*report.added, *report.removed]
            changed, writing = len(resigned), report.writing
            with self._view:
                self._foresee(pages, report)
        if resign:
            self.repo.refresh(force=self._resign_all)
            self._resign_all = False
        version, expires = self._read_timestamp()
        with self._view:
            self.catalog.update()
            for project in pages:
                self.resigned_at.pop(project, None)
            self.resigned_at.update(dict.fromkeys(resigned, version))
            if version > self.timestamp_version:
                self.timestamp_version, self.timestamp_expires = version, expires
        if self.high_water is not None:
            written = time.monotonic()
            record_high_water(self.high_water, version)
            writing += time.monotonic() - written
        return changed, writing


def read_high_water(path: Path) -> int:
    """The highest timestamp version recorded at ``path`` (0: none)."""
    try:
        return int(json.loads(path.read_bytes())["timestamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def record_high_water(path: Path, version: int) -> None:
    """Raise the high-water mark at ``path`` to ``version`` (never lowers it)."""
    if version > read_high_water(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"timestamp": version}).encode() + b"\n", durable=False)


def resign_after_restore(repo: Repository, high_water: Path, remembered: int = 0) -> tuple[int, int] | None:
    """If ``repo``'s timestamp is below the high-water mark, or ``remembered`` (a version published
    elsewhere, as the bucket's copy), the directory was restored from an older copy: re-sign every online
    role, every bin included, above anything published; (restored version, high-water) if it did."""
    record_high_water(high_water, remembered)
    current = repo.load_metadata("timestamp").signed.version
    mark = read_high_water(high_water)
    if current >= mark:
        record_high_water(high_water, current)
        return None
    report = repo.refresh(force=True)
    record_high_water(high_water, report.signed.get("timestamp", current))
    return current, mark


def timestamp_version(data: bytes) -> int:
    """The version a ``timestamp.json`` claims (0 if unreadable); only ever a reason to re-sign higher."""
    return lease.timestamp_version(data) or 0


def signed_page(public_dir: Path, project: str) -> index.ProjectPage | None:
    """``project``'s signed page as published (its plain ``index.json``), or None."""
    try:
        return index.parse_project_json((public_dir / "simple" / project / "index.json").read_bytes(), project)
    except (OSError, index.IndexParseError):
        return None

