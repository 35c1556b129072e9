"""Files the gateway has pinned but not fetched yet: streamed, checked, then kept.

A request for ``/packages/<p>/<file>`` (or its ``.metadata``) that is not
in the files directory yet (``DIR/public``, or ``--cache-dir``) starts one
fetch of it from the index through the one fetch-and-verify
(:func:`proxy.trust.fetch.fetch_verified`, with the index client as its
fetcher): each chunk is hashed against the pin's hashes and, where
known, its exact size, at the pace the edge demands of its upstreams
(:class:`~proxy.trust.fetch.Pace`), and written to a temp file.  Only
when the whole body matched is the temp file renamed into place; on a
mismatch the temp file is dropped, and the refusal is audited and counted
once.

The fetch is a :class:`~proxy.storage.downloads.Download`: the request that
started it and every request joining it in this process stream the
bytes as they arrive, each holding the final chunk back until the
download is verified (:mod:`proxy.serving.streaming`, as the edge does), so a
cold big wheel flows to pip at the index's pace, and no complete
unverified file ever leaves the gateway or lands in its tree.  A refusal
before any byte went out is answered by the app's one table (a 502 naming
the reason for a file the index lied about); after, the client's
connection is reset before its last byte.

A file already kept is checked against its pin (the signed hash) the
first time this process serves it; one that no longer matches (a rewritten
volume, a file kept before its pin was lost and rebuilt) is audited
(``kept-file-changed``: it matched when kept, so the fault is our
storage's), removed and fetched again.  A kept file is fsynced before its
rename all the same: the bucket copy (``--store``) uploads what is on
disk without checking it against pins.  Its readers do not wait for that
fsync: the last bytes go out once the body verified
(:meth:`~proxy.storage.downloads.Download.verified`) and a close reported
no failed write (a network filesystem reports them there), and the file is
taken for checked once renamed, since it holds the bytes just verified.  The descriptor is closed before
the rename, so a host sharing the directory over NFS (close-to-open) sees
the whole file once it sees the name.

A ``.metadata`` file the dependency prefetch reads from the index
(:mod:`proxy.gateway.prefetch`) is offered here as soon as that read
starts (:class:`ReadAhead`, in memory, bounded): the first request for it,
once the file is pinned, waits for that read if it is still under way (it
began before, so it ends sooner than a new one would), checks the bytes
against the pin, answers them from memory and keeps them on disk behind
the answer as if just fetched, so pip and uv wait neither a second round
trip to the index for what the gateway is reading or read a moment before
nor the write.  A read that fails or takes longer than
:data:`READ_AHEAD_WAIT`, or bytes that do not match the pin, are dropped
and the file is fetched as usual.

A ``.metadata`` request also starts the fetch of its file, unless it is
kept or under way already (within :class:`~proxy.storage.downloads.ReadAheads`'
bounds, as the edge does): a resolver asks for the metadata
of the version it picks and then for the file, so by the time pip or uv
downloads, the file is on its way or kept, not one more index round trip
away.  It is the same fetch as a request's, checked and kept the same way;
a request for the file meanwhile joins it.

A client that goes away mid-file does not stop the fetch: the file is
still checked and kept for the next request.  Worker processes do not
share a fetch in flight: two workers asked for one cold file at the same
moment each fetch it (each verified; the rename is atomic), so neither
client waits on a stream it cannot see.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from proxy.gateway.ledger import Ledger, Pin
from proxy.gateway.metrics import GatewayMetrics
from proxy.protocol.errors import TrustError
from proxy.protocol.hashing import ACCEPTED
from proxy.protocol.layout import core_metadata_target, file_target
from proxy.protocol.model import digest, file_digest
from proxy.serving.streaming import first_bytes, over_tls, send_download, send_file_over_tls
from proxy.storage.audit import AuditLog
from proxy.storage.downloads import Download, InFlight, ReadAheads, Tee
from proxy.storage.store import Blob
from proxy.transport.bucket import Bucket, BucketFetcher
from proxy.transport.indexhttp import IndexHTTP
from proxy.transport.upstream import Fetcher
from proxy.trust.fetch import FileSink, Pace, Want, fetch_verified
from proxy.util.atomic import atomic_write, discard
from proxy.util.journal import Journal

log = logging.getLogger(__name__)
MAX_CORE_METADATA = 16 * 2**20
# Kept files this process checked, by (path, inode, mtime, size); beyond this many the oldest are checked again.
MAX_CHECKED = 100_000
# Seconds a .metadata request waits for the prefetch's read of it before asking the index itself.
READ_AHEAD_WAIT = 10.0
# How long a stopping gateway waits to keep the files it answered (an fsync and a rename each).
CLOSE_WAIT = 30.0
_HEADERS = {"Content-Type": "application/octet-stream"}


def _write_and_stat(path: Path, data: bytes) -> os.stat_result:
    atomic_write(path, data)
    return os.stat(path)


def _pinned_digest(pin: Pin, core: bool) -> tuple[str, str] | None:
    """What a kept file (or its ``.metadata``) is checked against: the first of the pin's hashes we check
    (sha256 first); None when it names none."""
    hashes = (pin.core_metadata or {}) if core else pin.hashes
    algorithm = next((a for a in ACCEPTED if a in hashes), None)
    return (algorithm, hashes[algorithm]) if algorithm is not None else None


class ReadAhead:
    """``.metadata`` reads started ahead of any request, by target path: each the prefetch's read in flight, or
    its bytes once read.  At most ``limit`` bytes read and ``entries`` reads are held (oldest dropped first); a
    read that failed is dropped.  Never served until :class:`FileSource` matched the bytes to a pin."""

    def __init__(self, limit: int = 32 * 2**20, entries: int = 1024) -> None:
        self.limit, self.entries = limit, entries
        self._held: OrderedDict[str, asyncio.Future[bytes]] = OrderedDict()
        # Bytes counted against ``limit``, by target: a read is counted when its done-callback runs (which may
        # be a turn after it ended), and exactly that is given back when it goes.
        self._counted: dict[str, int] = {}
        self._size = 0

    def offer(self, target: str, read: asyncio.Future[bytes]) -> None:
        """Hold ``read`` (a task reading ``target``'s bytes) for the first request of ``target``."""
        if target in self._held:
            return
        self._held[target] = read
        read.add_done_callback(lambda done: self._read(target, done))
        while len(self._held) > self.entries:
            self._drop(next(iter(self._held)))

    def take(self, target: str) -> asyncio.Future[bytes] | None:
        """The read of ``target`` (done or not), no longer held; None if there is none."""
        read = self._held.get(target)
        if read is not None:
            self._drop(target)
        return read

    def _read(self, target: str, read: asyncio.Future[bytes]) -> None:
        failed = read.cancelled() or read.exception() is not None  # retrieved: a failed guess is no error
        if self._held.get(target) is not read:
            return  # taken (or dropped) before it ended
        if failed or len(read.result()) > self.limit:
            self._drop(target)
            return
        self._counted[target] = len(read.result())
        self._size += self._counted[target]
        while self._size > self.limit:
            self._drop(next(t for t in self._held if t in self._counted))

    def _drop(self, target: str) -> None:
        del self._held[target]
        self._size -= self._counted.pop(target, 0)


def _written(fd: int) -> None:
    """Raise what the writes to ``fd`` came to, as a close reports it (a network filesystem sends them at each
    close), closing a duplicate: ``fd`` stays open for its fsync."""
    os.close(os.dup(fd))


def _fsync_and_close(fd: int) -> None:
    """Make ``fd``'s file durable through the descriptor that wrote it, and close it whatever happens."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _in_own_thread(fn: Callable[[int], None], fd: int) -> asyncio.Future[None]:
    """``fn(fd)`` in a daemon thread of its own, as a future of the running loop.

    Not asyncio's default executor, which ``asyncio.run`` joins at exit with no time limit: an fsync that a
    failing disk never returns from would hold a stopping gateway past :meth:`FileSource.close`'s bound.  A
    daemon thread is left behind instead, and the temp file with it, as a crash would leave it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():  # the keep was cancelled meanwhile
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        try:
            fn(fd)
        except BaseException as e:  # noqa: BLE001 - handed to the loop, whose keep reports it
            error: BaseException | None = e
        else:
            error = None
        with contextlib.suppress(RuntimeError):  # the loop is closed: no one waits any more
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=run, name="keep-fsync", daemon=True).start()
    return done


def _discard_unless_kept(tmp: Path, keeping: asyncio.Future[None]) -> None:
    """A keep that failed, or was cancelled even before it ran, leaves no temp file behind."""
    if keeping.cancelled() or keeping.exception() is not None:
        discard(tmp)


class FileSource:
    """Streams pinned files into ``files_dir``; see the module docstring."""

    def __init__(self, files_dir: Path, ledger: Ledger, http: IndexHTTP, audit: AuditLog, metrics: GatewayMetrics,
                 max_file_size: int, pace: Pace = Pace(),
                 pins_elsewhere: Callable[[], Awaitable[None]] | None = None,
                 shared_copy: Callable[[], Bucket | None] | None = None, journal: Journal | None = None,
                 read_ahead: ReadAhead | None = None, files_ahead: int = 8) -> None:
        self.files_dir = files_dir
        self.read_ahead = read_ahead
        self.journal = journal  # told of each file stored (the bucket copy: proxy.storage.treepush)
        self.ledger = ledger
        # A replica follower's: take in the group's ledger now (a pin the leader wrote a moment ago).
        self.pins_elsewhere = pins_elsewhere
        # A replica follower's: the group's bucket, whose copy (the leader pushed it) is asked before the index.
        self.shared_copy = shared_copy
        self.http = http
        self.audit = audit
        self.metrics = metrics
        self.max_file_size = max_file_size
        self.pace = pace
        self._inflight = InFlight()
        self._checked: dict[tuple[str, int, int, int], None] = {}
        self._reading_ahead = ReadAheads(files_ahead)  # files started by their .metadata's request (0: none)
        # Read-ahead .metadata bytes answered already and being written (see _early), and those writes.
        self._keeping: dict[str, bytes] = {}
        self._checking: dict[str, asyncio.Future[bytes | None]] = {}  # read-ahead reads being waited for, checked
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, request: web.Request, project: str, filename: str, core: bool) -> web.StreamResponse:
        target = core_metadata_target(project, filename) if core else file_target(project, filename)
        path = self.files_dir / target
        self.ledger.reload()  # a revocation from 'tufproxy gateway revoke' applies at once
        pin = self.ledger.pins.get((project, filename))
        if pin is None and self.pins_elsewhere is not None:
            await self.pins_elsewhere()
            pin = self.ledger.pins.get((project, filename))
        if pin is None or self.ledger.is_revoked(project, filename):
            raise web.HTTPNotFound(reason="not published by this gateway")
        if core:
            self._read_ahead(project, filename, pin)
            if (early := await self._early(path, target, pin)) is not None:
                return web.Response(body=early, headers=_HEADERS)
        download = self._inflight.get(target, resume="Range" in request.headers)
        joined = download is not None
        if download is None:
            if await self._kept(path, target, pin, core):
                if over_tls(request) and request.method == "GET" and "Range" not in request.headers:
                    return await send_file_over_tls(request, path, path.stat().st_size, _HEADERS)
                return web.FileResponse(path)
            if not pin.url:
                raise web.HTTPServiceUnavailable(reason="pin rebuilt from the signed page; its index URL is learnt at "
                                                 "the project's next refresh", headers={"Retry-After": "5"})
            download, _ = self._start(pin, target, path, core, request.remote, request.path)
        refusal = await first_bytes(download, joined)
        if refusal is not None:
            raise refusal  # the app's one table answers it, before any byte went out
        sent = await send_download(request, download, _HEADERS, download.want.length if download.want.exact else None)
        if isinstance(sent, BaseException):
            raise sent  # nothing went out yet: the app's one table answers it
        return sent[0]

    async def _kept(self, path: Path, target: str, pin: Pin, core: bool) -> bool:
        """True if ``path`` holds the file, checked against the pin once per process; a mismatch is removed."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        key = (str(path), st.st_ino, st.st_mtime_ns, st.st_size)
        if key in self._checked:
            return True
        pinned = _pinned_digest(pin, core)
        size = None if core else pin.size
        expected: dict[str, object] = {"size": size}
        actual: dict[str, object] = {"size": st.st_size}
        changed = size is not None and size != st.st_size
        if not changed and pinned is not None:  # a size that differs says enough
            expected[pinned[0]] = pinned[1]
            actual[pinned[0]] = await asyncio.to_thread(file_digest, pinned[0], path)
            changed = actual[pinned[0]] != pinned[1]
        if changed:
            log.warning("kept file %s does not match its pin (%s): removed, fetching it again", path, expected)
            fault = self.metrics.refused("kept-file-changed")
            self.audit.refused(reason="kept-file-changed", fault=fault.value, target=target,
                               detail="kept file differs from its pin", expected=expected, actual=actual)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return False
        self._mark_checked(key)
        return True

    def _mark_checked(self, key: tuple[str, int, int, int]) -> None:
        self._checked[key] = None
        if len(self._checked) > MAX_CHECKED:
            del self._checked[next(iter(self._checked))]

    async def _early(self, path: Path, target: str, pin: Pin) -> bytes | None:
        """Read-ahead ``.metadata`` bytes of ``target`` that match the pin (the read waited for, if under way):
        answered from memory, and kept on disk behind the answer (the client waits for no write); None when
        there are none."""
        data = self._keeping.get(target)
        if data is not None:
            return data  # a second request while the first one's bytes are being written
        check = self._checking.get(target)
        if check is None:
            if self.read_ahead is None or (read := self.read_ahead.take(target)) is None:
                return None
            check = self._checking[target] = asyncio.ensure_future(self._check_early(path, target, pin, read))
            check.add_done_callback(lambda _: self._checking.pop(target, None))
        # Shielded: a client that goes away does not stop the check others wait on.
        return await asyncio.shield(check)

    async def _check_early(self, path: Path, target: str, pin: Pin, read: asyncio.Future[bytes]) -> bytes | None:
        if not read.done():
            self.metrics.read_ahead_waits.inc()
            await asyncio.wait((read,), timeout=READ_AHEAD_WAIT)
        if not read.done() or read.cancelled() or read.exception() is not None:
            return None  # the prefetch's read failed or is stuck: fetched from the index as usual
        data = read.result()
        pinned = _pinned_digest(pin, core=True)
        if pinned is None or digest(pinned[0], data) != pinned[1]:
            return None  # not what was signed: fetched from the index as usual
        self._keeping[target] = data
        self.metrics.files.labels("read-ahead").inc()
        task = asyncio.ensure_future(self._keep(path, target, data))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return data

    async def _keep(self, path: Path, target: str, data: bytes) -> None:
        """Write checked read-ahead bytes as if fetched now (durably, atomically), known checked from then on."""
        try:
            st = await asyncio.to_thread(_write_and_stat, path, data)
            self._mark_checked((str(path), st.st_ino, st.st_mtime_ns, st.st_size))
            if self.journal is not None:
                self.journal.wrote([target])
        except Exception as e:  # noqa: BLE001 - served already; the next request fetches it again
            log.warning("could not keep %s read ahead: %s", target, e)
        finally:
            self._keeping.pop(target, None)

    async def close(self) -> None:
        """Finish keeping what was answered already: read-ahead bytes, verified fetches (an fsync and a rename each),
        those that began while it waited too; at most ``CLOSE_WAIT`` seconds (a disk that hangs cannot hold a stop)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT):
                while self._tasks:
                    await asyncio.gather(*self._tasks, return_exceptions=True)

    def _read_ahead(self, project: str, filename: str, pin: Pin) -> None:
        """Start fetching the file whose ``.metadata`` was just asked for, within the bounds (module docstring)."""
        target = file_target(project, filename)
        path = self.files_dir / target
        if (self._inflight.get(target) is not None or not self._reading_ahead.admits(target, pin.size) or not pin.url
                or path.exists()):
            return
        _, task = self._start(pin, target, path, False, None, f"(read ahead of {core_metadata_target(project, filename)})")
        self._reading_ahead.started(target, task)  # its slot held until kept, fsync included, not just answered
        self.metrics.files_read_ahead.inc()

    def _start(self, pin: Pin, target: str, path: Path, core: bool, client: str | None,
               request_path: str) -> tuple[Download, asyncio.Task[Blob]]:
        if core:
            if not pin.core_metadata:
                raise web.HTTPNotFound(reason="no core metadata published for this file")
            want, url = (
                Want(target, pin.core_metadata, MAX_CORE_METADATA, False, f"gateway pin from {pin.index}"),
                pin.url + ".metadata",
            )
        else:
            length = pin.size if pin.size is not None else self.max_file_size
            want, url = Want(target, pin.hashes, length, pin.size is not None, f"gateway pin from {pin.index}"), pin.url
        download = Download(target, want)
        bucket = self.shared_copy() if self.shared_copy is not None else None
        # The bucket's copy first, checked against the same pin; the index if it has none (or it does not match).
        fetcher, urls = (BucketFetcher(bucket, self.http), [bucket.key_url(target), url]) if bucket is not None \
            else (self.http, [url])
        task = asyncio.ensure_future(self._fetch(download, fetcher, urls, path, client, request_path))
        self._inflight.add(download, task)
        return download, task

    async def _fetch(self, download: Download, fetcher: Fetcher, urls: list[str], path: Path, client: str | None,
                     request_path: str) -> Blob:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A temp file of its own: a keep still running behind an answer (or another host's fetch into a shared
        # directory) never shares it with a fetch started since.
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(name)
        try:
            os.fchmod(fd, 0o644)
            download.writing(tmp)
            try:
                digests = await fetch_verified(
                    fetcher, download.want, urls, Tee(FileSink(fd), download), pace=self.pace, also=("sha256",)
                )
            except TrustError as e:  # the index lied, or could not be reached: one audit record, one count
                log.warning("refused %s: %s", download.key, e)
                self.metrics.files.labels("refused").inc()
                fault = self.metrics.refused(e.reason, e.fault)
                self.audit.refused(
                    reason=e.reason,
                    fault=fault.value,
                    target=download.key,
                    upstream_url=urls[-1],
                    client=client,
                    request_path=request_path,
                    expected=e.expected,
                    actual=e.actual,
                    detail=str(e),
                )
                raise
            # What the writes came to, before anyone is answered: a network filesystem sends a file's writes at each
            # close and reports there those that failed, whose pages it may drop (a reader would then get the
            # server's bytes, not those verified).  Off the loop: on NFS that close is the whole upload.
            await asyncio.to_thread(_written, fd)
            blob = Blob(digests["sha256"], path, download.available)
            # Verified: its readers send the last bytes now, not after the fsync of a whole file (seconds for a
            # big one on a busy disk); joiners meanwhile read the temp file's inode, later ones the kept file.
            download.verified(blob)
            self.metrics.files.labels("ok").inc()
            self.metrics.file_bytes.inc(download.available)
            # Kept in a task of its own, which close() waits for: a gateway stopping after the answer still keeps it.
            # The writing descriptor goes to a thread that fsyncs it and always closes it (before the rename: a host
            # sharing the directory over NFS sees the whole file once it sees the name).
            handed, fd = fd, -1
            flushed = _in_own_thread(_fsync_and_close, handed)
            flushed.add_done_callback(lambda f: f.cancelled() or f.exception())  # heard by the keep, or by no one
            keeping = asyncio.ensure_future(self._keep_fetched(flushed, download, tmp, path))
            self._tasks.add(keeping)
            keeping.add_done_callback(self._tasks.discard)
            keeping.add_done_callback(functools.partial(_discard_unless_kept, tmp))
            await asyncio.shield(keeping)
        finally:
            if fd >= 0:
                os.close(fd)
                discard(tmp)
        return blob

    async def _keep_fetched(self, flushed: asyncio.Future[None], download: Download, tmp: Path, path: Path) -> None:
        """Name a verified fetch's temp file ``path`` once ``flushed`` (its fsync) is done; taken for checked then."""
        try:
            await flushed
            os.replace(tmp, path)
            st = os.stat(path)
        except OSError as e:  # answered already: only the kept copy is lost; the next request fetches again
            log.warning("could not keep %s: %s", download.key, e)
            raise
        fd = download.open()
        try:
            mine = fd is not None and os.path.samestat(os.fstat(fd), st)
        finally:
            if fd is not None:
                os.close(fd)
        if not mine:  # another host sharing the directory renamed its own file there meanwhile: checked when served
            return
        self._mark_checked((str(path), st.st_ino, st.st_mtime_ns, st.st_size))  # it holds what was just verified
        if self.journal is not None:
            self.journal.wrote([download.key])
