"""Dependency prefetch: publish what a new project needs before pip asks for it.

pip and uv resolve one project after another, so every dependency of a
cold install costs the client a whole miss (edge -> gateway -> index ->
signing -> edge refresh) in series.  When the gateway publishes a project
for a miss, it reads the newest release's Requires-Dist (its PEP 658/714
metadata file, or the wheel's own METADATA where the index serves none)
and publishes those dependencies too, through :meth:`Gateway.ensure` like
any request: the same policy, pins and checks, so a prefetch never
publishes what a request could not.  Markers are read broadly (a marker
true on any common platform and Python counts, :func:`requirements`):
prefetching one page too many costs a page, prefetching one too few costs
a round trip.  Extras are read broadly for
the project a client asked for (it may want any of them), and below it only
as the requirement that led there names them: ``markdown-it-py``'s
``testing`` extra is no one's dependency unless someone asks for
``markdown-it-py[testing]``, and following every dependency's every extra
would publish half the index's test and documentation tools.

The ``.metadata`` file read is the one the client asks for next: its read
is offered to the file source (``keep``) as it starts, so a request that
comes while it is under way waits for it rather than asking the index
again; the file source serves the bytes once the file is pinned and they
match the pin (:class:`proxy.gateway.files.ReadAhead`).

The pages of the last level (or published once the miss's budget is spent)
have their dependencies left unread, but their ``.metadata`` is read all the
same, for the same reason: one read per page published, as for the others.

Bounded: ``depth`` levels below the requested project, at most ``budget``
projects per miss (a hostile index whose metadata names 10,000 projects
costs at most that many pages and ``.metadata`` reads), metadata and wheels
of bounded size, a few at a time.  A prefetch never holds a client's batch
back; the pages of one wave arriving together are signed together while no
client waits, and a client asking for one makes it a client's page
(:class:`~proxy.gateway.publisher.Publisher`).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import re
import zipfile
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from email.parser import BytesHeaderParser

from packaging.markers import Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from proxy.protocol import index
from proxy.protocol.layout import core_metadata_target
from proxy.transport.upstream import DownloadError
from proxy.util import timing

log = logging.getLogger(__name__)

MAX_METADATA = 2 * 2**20  # a METADATA file larger than this is not read
MAX_WHEEL = 16 * 2**20  # the fallback reads a whole wheel: only small ones
CONCURRENCY = 16


ALL_EXTRAS = None  # the extras a client may want of the project it asked for: any
_MENTIONS_EXTRA = re.compile(r"\bextras?\b")
# Markers are read broadly: a requirement an extra may bring in is asked whether it applies on any of these
# (consistent) platforms and Pythons, with the extras asked for or none.  Others are not asked at all.
_PLACES = tuple(
    {"implementation_name": impl.lower(), "platform_python_implementation": impl, "implementation_version": full,
     "python_full_version": full, "python_version": full.rsplit(".", 1)[0], "os_name": os_name, "sys_platform": plat,
     "platform_system": system, "platform_machine": machine, "platform_release": "", "platform_version": ""}
    for impl, full, os_name, plat, system, machine in (
        ("CPython", "3.8.10", "posix", "linux", "Linux", "x86_64"),
        ("CPython", "3.11.9", "posix", "linux", "Linux", "x86_64"),
        ("CPython", "3.14.0", "posix", "linux", "Linux", "aarch64"),
        ("PyPy", "3.10.14", "posix", "linux", "Linux", "x86_64"),
        ("CPython", "3.11.9", "nt", "win32", "Windows", "AMD64"),
        ("CPython", "3.12.3", "posix", "darwin", "Darwin", "arm64"),
    ))


def _applies(marker: Marker | None, extras: frozenset[str] | None) -> bool:
    """Whether a requirement under ``marker`` may be wanted when ``extras`` are asked for (read broadly)."""
    if marker is None or extras is ALL_EXTRAS or not _MENTIONS_EXTRA.search(str(marker)):
        return True
    for extra in (*sorted(extras), ""):
        for place in _PLACES:
            try:
                if marker.evaluate({**place, "extra": extra}):
                    return True
            except (UndefinedComparison, UndefinedEnvironmentName, ValueError):
                return True  # a marker that cannot be evaluated here (a newer variable): read broadly
    return False


def requirements(metadata: bytes, limit: int, extras: frozenset[str] | None = ALL_EXTRAS) -> dict[str, frozenset[str]]:
    """The distinct projects a METADATA file requires, in order, at most ``limit``, each with the extras asked of it.

    A requirement counts unless its marker names an extra and is false on
    every platform and Python of :data:`_PLACES` with each extra of
    ``extras`` and with none (``ALL_EXTRAS``: every requirement counts).
    """
    found: dict[str, frozenset[str]] = {}
    message = BytesHeaderParser().parsebytes(metadata)
    for line in message.get_all("Requires-Dist") or ():
        try:
            req = Requirement(str(line))
        except InvalidRequirement:
            continue
        if not _applies(req.marker, extras):
            continue
        name = canonicalize_name(req.name)
        if name not in found and len(found) >= limit:
            break
        found[name] = found.get(name, frozenset()) | {canonicalize_name(e) for e in req.extras}
    return found


def newest_file(page: index.ProjectPage) -> index.DistFile | None:
    """The newest release's file to read dependencies from: a wheel with core metadata, else any wheel."""
    wheels: list[tuple[Version, bool, index.DistFile]] = []
    for dist in page.files:
        if not dist.filename.endswith(".whl") or dist.yanked:
            continue
        try:
            version = parse_wheel_filename(dist.filename)[1]
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if not version.is_prerelease:
            wheels.append((version, bool(dist.core_metadata), dist))
    if not wheels:
        return None
    return max(wheels, key=lambda w: (w[0], w[1]))[2]


def _sha256_ok(data: bytes, hashes: object) -> bool:
    expected = hashes.get("sha256") if isinstance(hashes, dict) else None
    return expected is None or hashlib.sha256(data).hexdigest() == expected


@dataclass
class Budget:
    """What one miss may still prefetch."""

    left: int
    seen: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Wave:
    """Where a prefetch stands: levels left below it, the miss's budget, and the extras asked of the project
    (``ALL_EXTRAS`` for the one a client asked for)."""

    depth: int
    budget: Budget
    extras: frozenset[str] | None = ALL_EXTRAS


Fetch = Callable[[str, int], Awaitable[bytes]]  # url, max length -> body
Ensure = Callable[[str, Wave], Awaitable[None]]  # project, where its prefetch stands
Keep = Callable[[str, asyncio.Future[bytes]], None]  # target path, the read of its .metadata (its bytes unchecked)


class Prefetcher:
    """Reads a published page's dependencies and asks ``ensure`` for each; see the module docstring."""

    def __init__(self, fetch: Fetch, ensure: Ensure, depth: int, budget: int,
                 count: Callable[[str], None] = lambda outcome: None, keep: Keep | None = None) -> None:
        self.fetch, self.ensure, self.keep = fetch, ensure, keep
        self.depth, self.budget = depth, budget
        self._count = count
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()

    def first_wave(self) -> Wave:
        """Where the prefetch below a client's miss starts: every level, a new budget, any extra."""
        return Wave(self.depth, Budget(self.budget))

    def schedule(self, page: index.ProjectPage, wave: Wave) -> None:
        """Prefetch ``page``'s dependencies in the background (``wave.depth`` levels more); at the last level,
        or once the miss's budget is spent, only read its newest release's ``.metadata``, which the client asks
        for next."""
        if wave.depth > 0 and wave.budget.left > 0:
            job: Coroutine[object, None, None] = self._run(page, wave)
        elif self.depth > 0 and self.keep is not None:
            job = self._read_ahead(page)
        else:
            return
        task = asyncio.create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, page: index.ProjectPage, wave: Wave) -> None:
        timing.detach()  # started by a client's publish, whose answer does not wait for this
        budget = wave.budget
        try:
            async with self._slots:
                found = await self.dependencies(page, budget.left, wave.extras)
            wanted = [n for n in found if n not in budget.seen and n != page.name][: budget.left]
            budget.seen.update(wanted)
            budget.left -= len(wanted)
            await asyncio.gather(*(self.ensure(name, Wave(wave.depth - 1, budget, found[name])) for name in wanted))
        except Exception as e:  # noqa: BLE001 - a prefetch is a guess: it never fails a request or the gateway
            self._count("failed")
            log.debug("prefetch for %s: %s", page.name, e)

    async def _read_ahead(self, page: index.ProjectPage) -> None:
        timing.detach()  # as _run
        try:
            dist = newest_file(page)
            if dist is None or not dist.core_metadata:
                return
            async with self._slots:
                await self._metadata(page, dist)
        except DownloadError as e:
            self._count("unreachable")
            log.debug("prefetch: %s", e)
        except Exception as e:  # noqa: BLE001 - a guess: the client's own request fetches it
            self._count("failed")
            log.debug("prefetch for %s: %s", page.name, e)

    def _metadata(self, page: index.ProjectPage, dist: index.DistFile) -> asyncio.Future[bytes]:
        """The read of ``dist``'s ``.metadata``, offered to the file source: the client asks for this very file
        next, and need not wait for a second trip to the index."""
        read = asyncio.ensure_future(self.fetch(dist.url + ".metadata", MAX_METADATA))
        if self.keep is not None:
            self.keep(core_metadata_target(page.name, dist.filename), read)
        return read

    async def dependencies(self, page: index.ProjectPage, limit: int,
                           extras: frozenset[str] | None = ALL_EXTRAS) -> dict[str, frozenset[str]]:
        """What the newest release of ``page`` requires, with ``extras`` (empty when there is nothing to read)."""
        dist = newest_file(page)
        if dist is None:
            return {}
        try:
            if dist.core_metadata:
                data = await self._metadata(page, dist)
                if not _sha256_ok(data, dist.core_metadata):
                    self._count("bad-metadata")
                    return {}
            elif dist.size is None or dist.size <= MAX_WHEEL:
                found = _wheel_metadata(await self.fetch(dist.url, MAX_WHEEL), dist)
                if found is None:
                    return {}
                data = found
            else:
                return {}
        except DownloadError as e:
            self._count("unreachable")
            log.debug("prefetch: %s", e)
            return {}
        return requirements(data, limit, extras)

    async def drain(self) -> None:
        """Wait for the prefetches in flight (for tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _wheel_metadata(data: bytes, dist: index.DistFile) -> bytes | None:
    """A wheel's own METADATA, once its bytes match the page's sha256."""
    if not _sha256_ok(data, dist.hashes):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names: Iterable[str] = (n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            info = z.getinfo(next(iter(names)))
            if info.file_size > MAX_METADATA:
                return None
            return z.read(info)
    except (zipfile.BadZipFile, StopIteration, KeyError, OSError):
        return None
