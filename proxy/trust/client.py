"""The async face of the trust core: fetching, persistence, refresh policy.

:class:`TrustedClient` is what the proxy server holds for months.  It
downloads metadata through a :class:`~proxy.transport.upstream.Fetcher`, hands the
bytes to the pure core (:mod:`proxy.protocol.tufset` for top-level roles,
:mod:`proxy.protocol.verify` for delegated ones) and keeps the result:

* Each refresh cycle builds a fresh trusted set in the background; only a
  cycle that verified completely is swapped in, in one assignment, so a
  lookup sees one consistent snapshot from start to end, and a refused
  update leaves the live state as it was.
* The timestamp is checked at most every ``refresh_interval`` seconds, one
  cycle in flight however many requests wait on it (single-flight).  A
  cycle that failed, because no mirror answered or because every mirror's
  answer was refused (a replayed timestamp, a bad signature, garbage), is
  an aborted update (spec 5.3-5.6): the previous state keeps serving until
  it expires, and the refusal goes to ``on_refused`` (audit, metric).  A
  lookup that finds no target while the last cycle was refused answers
  with that refusal, not "not found".
* Failing closed (no usable state, or the target a lookup needs missing
  after a refused cycle): a lookup starts a re-check itself, at most one
  cycle in flight and at most one new cycle a second, and waits for it at
  most ``miss_wait``, so the first request after the mirrors turn honest
  is answered from fresh metadata.
* Every lookup checks the earliest expiry of every role it used against
  the wall clock (fail closed: a long-lived set never notices expiry).
  A found target is remembered, with that expiry, for as long as the
  state that vouched for it is live: the walk is done once per state, the
  expiry check at every lookup.
* Delegated roles are loaded on demand into a bounded LRU, reused across
  cycles while the snapshot lists the same version and the delegator is
  byte-for-byte the one that verified them.  Hash bins fetched are left
  for the other processes of the same cache (:mod:`proxy.trust.shared`),
  and taken from there, verified, before a mirror is asked.
* Each top-level role is persisted (atomically, non-versioned names) the
  moment it verifies, as the spec's client workflow says, so a restart
  keeps rollback protection even when a later step of that cycle failed;
  a refused role is never written.  Every trusted root is also kept by
  version (``roots/N.root.json``).  Delegated roles are written when verified.
* A cycle still loads the previous timestamp, snapshot and targets first
  (rollback protection, as the spec says), but bytes this process verified
  before, under the same root, are taken back without being parsed and
  signature-checked again (:class:`~proxy.protocol.tufset.Verified`); the
  set's version, rollback and expiry checks run on them every cycle.
* Mirrors are tried in order (:func:`proxy.transport.failover.failover`):
  transport failures move on; verification failures are logged and move
  on too, and are never accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, overload
from urllib.parse import quote

from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp
from tuf.api.serialization import DeserializationError

from proxy.protocol import errors
from proxy.protocol.model import (
    Mirror,
    TrustConfig,
    VerifiedTarget,
    consistent_target_urls,
)
from proxy.protocol.tufset import TopLevelSet, Verified
from proxy.protocol.verify import Found, RoleRequest, VerifiedRole, verify_delegated, walk
from proxy.transport.failover import Attempt, Exhausted, Outcome, failover
from proxy.transport.foreseen import Foreseen
from proxy.transport.upstream import DownloadLengthError, Fetcher
from proxy.trust.metadir import MetadataStore
from proxy.trust.shared import SharedRoles
from proxy.util.atomic import InOrder

logger = logging.getLogger(__name__)

T = TypeVar("T")
_TOP_LEVEL = ("timestamp", "snapshot", "targets")
# Metadata this small verifies on the event loop (a 1,024-bin snapshot, 30 KB: ~5 ms); anything larger
# (a 16,384-bin snapshot takes hundreds of ms) in a worker thread.  Not every role off the loop: a
# thread hop for a bin of a few KB cost more than its check, and a thread busy with canonical JSON
# holds the GIL against the loop, each of whose sends, reads and opens then waits for it (up to the
# interpreter's switch interval) while the page a client waits for is being verified.
_ON_LOOP_MAX = 64 * 1024
# Fetched under one name whatever their version (a root's next version is asked for, not foreseen).
_UNVERSIONED = ("root", "timestamp")
# A listing (TrustedClient.listed) fetches this many roles at once, and walks this many before the next.
_LISTING_FETCHES, _LISTING_CHUNK = 16, 64
# After a failed cycle with nothing usable to serve, retry at most this often.
_RETRY_FLOOR = 1.0
# refresh_until's pause between cycles that came back short: doubles from the first to the last.
_UNTIL_BACKOFF = (0.05, 1.0)
# Retry-After (seconds) of MetadataPending: the refresh it waits for is already running.
_PENDING_RETRY_AFTER = 1


# What the expiry clock reads while an ExpiryOverride holds: no metadata expires before it.
_BEFORE_ANY_EXPIRY = datetime(1970, 1, 1, tzinfo=UTC)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, eq=False)
class _State:
    """One verified, consistent set of top-level metadata."""

    root: Root
    timestamp: Timestamp
    snapshot: Snapshot
    targets: VerifiedRole
    earliest: tuple[datetime, str] = field(init=False)

    def __post_init__(self) -> None:
        expiries = [
            (self.root.expires, "root"),
            (self.timestamp.expires, "timestamp"),
            (self.snapshot.expires, "snapshot"),
            (self.targets.expires, "targets"),
        ]
        object.__setattr__(self, "earliest", min(expiries))

    def deadline(self, used: tuple[VerifiedRole, ...] = ()) -> tuple[datetime, str]:
        """The first expiry, and its role, of this state and the delegated roles ``used``."""
        return min([self.earliest, *((r.expires, r.name) for r in used)])

    def check_expiry(self, now: datetime, used: tuple[VerifiedRole, ...] = ()) -> None:
        """Raise ExpiredMetadata naming the first role (of these) to expire."""
        _check_deadline(self.deadline(used), now)


def _check_deadline(deadline: tuple[datetime, str], now: datetime) -> None:
    expires, role = deadline
    if expires <= now:
        raise errors.ExpiredMetadata(role, expires)


_RoleKey = tuple[str, str, int, int | None, tuple[tuple[str, str], ...]]


class TrustedClient:
    """Verified target lookups for a long-running process; see module docstring."""

    def __init__(
        self,
        metadata_dir: Path,
        mirrors: list[Mirror],
        fetcher: Fetcher,
        config: TrustConfig = TrustConfig(),
        shared: SharedRoles | None = None,
    ) -> None:
        """``shared``: where the processes of one cache leave each other the hash-bin roles they fetched
        (:mod:`proxy.trust.shared`); only when those are not persisted (``config.persist_bins`` off)."""
        if not mirrors:
            raise ValueError("at least one mirror is needed")
        self.mirrors = list(mirrors)
        self.config = config
        self._fetcher = fetcher
        self._store = MetadataStore(Path(metadata_dir))
        self._shared = None if config.persist_bins else shared
        self._store.lock()
        root = self._store.read("root")
        if root is None:
            self._store.unlock()
            raise errors.NotInitialized(f"no trusted root in {metadata_dir}: initialize it first")
        TopLevelSet(root, _utcnow())  # the trusted root must at least verify itself
        self._root_bytes = root
        # What python-tuf verified in this process: a cycle takes its own persisted bytes back unchecked.
        self._verified = Verified()
        # What the directory holds: previous cycles' trusted bytes.
        self._local: dict[str, bytes] = {
            role: data for role in _TOP_LEVEL if (data := self._store.read(role)) is not None
        }
        self._state: _State | None = self._offline_state()
        self._roles: OrderedDict[_RoleKey, VerifiedRole] = OrderedDict()
        self._loading: dict[_RoleKey, asyncio.Task[VerifiedRole]] = {}
        # What _lookup found in _found_state: path -> (target, deadline of every role the walk used).
        # Dropped whenever another state goes live; the deadline is still checked at every hit.
        self._found: dict[str, tuple[VerifiedTarget, tuple[datetime, str]]] = {}
        self._found_state: _State | None = None
        # What each role contributed to the last listing (see listed), by the bytes it was read from.
        self._shares: dict[tuple[object, ...], _Share] = {}
        self._refresh_task: asyncio.Task[None] | None = None
        self._last_attempt: float | None = None  # monotonic
        self._last_success: float | None = None  # wall clock
        self._last_error: errors.TrustError | None = None
        # A timestamp a publish answer carried, with the version the gateway named (see expect): the next cycle
        # takes it instead of asking for one, if that version is above the one it trusts.
        self._given_timestamp: tuple[int, bytes] | None = None
        # Told of every refused cycle (an aborted update): the server audits and counts it.
        self.on_refused: Callable[[errors.RepositoryError], None] | None = None

    # -- setup ---------------------------------------------------------
    @staticmethod
    def initialize(metadata_dir: Path, root_bytes: bytes) -> None:
        """Trust ``root_bytes`` (it must verify itself) as ``metadata_dir``'s root."""
        top = TopLevelSet(root_bytes, _utcnow())
        store = MetadataStore(Path(metadata_dir))
        try:
            store.write("root", root_bytes)
            store.keep_root(top.root.version, root_bytes)
        finally:
            store.unlock()

    def close(self) -> None:
        """Release the metadata directory (the fetcher belongs to the caller)."""
        self._store.unlock()

    def _offline_state(self) -> _State | None:
        """The persisted metadata as a state, if it is complete and still valid."""
        if set(self._local) != set(_TOP_LEVEL):
            return None
        top = TopLevelSet(self._root_bytes, self._expiry_clock(), self._verified)
        if not (
            top.load_local_timestamp(self._local["timestamp"])
            and top.load_local_snapshot(self._local["snapshot"])
            and top.load_local_targets(self._local["targets"])
        ):
            return None
        return _state_of(top, self._local["targets"])

    def _expiry_clock(self) -> datetime:
        """The time expiry is judged at: now, or under an operator's override a time before any expiry."""
        now = _utcnow()
        override = self.config.expiry_override
        return _BEFORE_ANY_EXPIRY if override is not None and now < override.until else now

    # -- refresh -------------------------------------------------------
    def _due(self) -> bool:
        if self._last_attempt is None:
            return True
        elapsed = time.monotonic() - self._last_attempt
        if elapsed >= self.config.refresh_interval:
            return True
        # Unusable state (none, or expired): retried sooner.  The clock is read only when that matters.
        return elapsed >= min(self.config.refresh_interval, _RETRY_FLOOR) and (
            self._state is None or self._state.earliest[0] <= self._expiry_clock())

    async def refresh(self, force: bool = False) -> None:
        """Run a refresh cycle if due (always with ``force``); join one in flight."""
        task = self._refresh_task
        if (task is None or task.done()) and not force and not self._due():
            return
        # Shielded: a cancelled request must not cancel everyone's refresh.
        await asyncio.shield(self._start_refresh())

    @property
    def first_mirror(self) -> str:
        """The base URL of the mirror each refresh reads first."""
        return self.mirrors[0].targets_url

    @property
    def foresees(self) -> bool:
        """Whether :meth:`expect` can use what a publish answer names or carries (its fetcher foresees)."""
        return isinstance(self._fetcher, Foreseen)

    @property
    def root_version(self) -> int | None:
        """Version of the root lookups are answered under (None before the first verified state)."""
        return None if self._state is None else self._state.root.version

    @property
    def timestamp_version(self) -> int | None:
        """Version of the timestamp lookups are answered from (None before the first verified state)."""
        return None if self._state is None else self._state.timestamp.version

    def snapshot_versions(self) -> dict[str, int]:
        """Every role the trusted snapshot lists, by name, with its version ({} before the first verified state)."""
        if self._state is None:
            return {}
        return {name.removesuffix(".json"): meta.version for name, meta in self._state.snapshot.meta.items()}

    @property
    def verified_targets(self) -> Targets | None:
        """The top-level targets lookups are answered from (its delegations tell the layout); None before any."""
        return None if self._state is None else self._state.targets.signed

    def _start_refresh(self) -> asyncio.Task[None]:
        """The cycle in flight, or a new one."""
        task = self._refresh_task
        if task is None or task.done():
            task = self._refresh_task = asyncio.create_task(self._refresh())
            # Its outcome lands in _last_error/_state; read the exception here in case nobody awaits it.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def refresh_until(self, version: int, timeout: float) -> None:
        """Return once lookups are answered from a timestamp of at least ``version``.

        Joins the cycle in flight (it may predate the publication the caller
        knows about), then starts new ones while the version is still short,
        pausing a bounded, growing backoff between them.  A cycle refused for
        verification is re-raised; an unreachable upstream is retried.
        Raises :class:`~proxy.protocol.errors.MetadataPending` once ``timeout``
        seconds have passed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = _UNTIL_BACKOFF[0]
        joined_older = self._refresh_task is not None and not self._refresh_task.done()
        while (self.timestamp_version or 0) < version:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise errors.MetadataPending(f"timestamp version {version}", _PENDING_RETRY_AFTER)
            try:
                # Shielded: a caller giving up must not cancel everyone's refresh.
                await asyncio.wait_for(asyncio.shield(self._start_refresh()), remaining)
            except TimeoutError:
                continue  # the deadline check above raises
            except (errors.UpstreamUnreachable, errors.RefreshFailed):
                pass
            if joined_older:
                joined_older = False  # that cycle began before the call: start the next one at once
                continue
            if (self.timestamp_version or 0) < version:
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
                pause = min(2 * pause, _UNTIL_BACKOFF[1])

    async def _refresh(self) -> None:
        self._last_attempt = time.monotonic()
        try:
            state = await self._cycle()
        except errors.TrustError as e:
            self._last_error = e
            logger.warning("refresh refused (%s): %s", e.reason, e)
            if isinstance(e, errors.RepositoryError) and self.on_refused is not None:
                self.on_refused(e)
            raise
        except Exception as e:
            # Not the repository's doing (writing the metadata dir failed, a bug): typed, so it
            # neither kills a refresher nor reaches a client as a crash; the live state stays.
            logger.exception("refresh failed unexpectedly")
            self._last_error = errors.RefreshFailed(f"refresh failed: {type(e).__name__}: {e}")
            raise self._last_error from e
        self._state = state
        self._last_success = time.time()
        self._last_error = None

    async def _trust(self, role: str, data: bytes, top: TopLevelSet, order: InOrder | None = None) -> None:
        """Persist a role the moment it verified (spec 5.3.8, 5.4.5, 5.5.7, 5.6.6).

        A later step of the same cycle failing does not undo it: a new root or
        timestamp keeps protecting against rollback after a restart.  The live
        state is still swapped only when the whole cycle verified.  The write
        runs off the loop: a large snapshot's fsync on a busy disk stalled
        every request for over 100 ms.  With ``order`` (the cycle's timestamp,
        snapshot and targets), its fsync runs while the cycle goes on, and the
        rename follows it and the role persisted before (:class:`InOrder`); the
        cycle waits for them all before it ends (:meth:`_cycle`).  A role is
        taken for the next cycle's local copy only once renamed.
        """
        if order is not None:
            renamed = await self._store.replace(role, data, order)
            renamed.add_done_callback(lambda t: t.cancelled() or t.exception() or self._local.update({role: data}))
            return
        await asyncio.to_thread(self._store.write, role, data)
        if role == "root":
            await asyncio.to_thread(self._store.keep_root, top.root.version, data)
            self._root_bytes = data
        else:
            self._local[role] = data

    async def _cycle(self, recheck_root: bool = True) -> _State:
        """Spec 5.3-5.6 on a fresh set, persisting each role as it verifies.  Every role persisted is renamed into
        place, and the renames made durable, before it returns (a state is served only once what it rests on is
        on disk) or raises (a refusal of a later role leaves the earlier ones persisted)."""
        order = InOrder()
        try:
            state = await self._cycle_in(order, recheck_root)
        except BaseException:
            with contextlib.suppress(OSError):  # the refusal is the news; a disk failing fails the next cycle too
                await order.settle()
            raise
        await order.settle()
        return state

    async def _cycle_in(self, order: InOrder, recheck_root: bool) -> _State:
        top = TopLevelSet(self._root_bytes, self._expiry_clock(), self._verified)
        rotated = await self._update_root(top)
        if rotated and self._state is not None and _keys_rotated(self._state.root, top.root):
            # Spec 5.3.11: the live state was verified under keys the new root no longer trusts (a leaked
            # online key rotated away); it must not keep serving if the rest of this update is refused.
            logger.warning("root v%d rotated the keys the live metadata was verified with: it serves no more",
                           top.root.version)
            self._state = None

        local_ts = self._local.get("timestamp")
        if local_ts is not None:
            top.load_local_timestamp(local_ts)
        try:
            found = self._given_timestamp_verified(top)
            data, new_ts = found if found is not None else await self._fetch_verified(
                "timestamp", "timestamp.json", self.config.timestamp_max_length, top.update_timestamp
            )
        except errors.RepositoryError:
            # A root probe answered ahead (Foreseen: a 404 kept from a publish answer) may predate a root
            # published since, whose new keys signed this timestamp.  Look once more, now, before calling the
            # timestamp a lie; a new root starts the cycle over (python-tuf takes no root after a timestamp).
            if recheck_root and isinstance(self._fetcher, Foreseen) and await self._root_moved(top):
                return await self._cycle(recheck_root=False)
            raise
        if new_ts is not None:
            await self._trust("timestamp", data, top, order)
        elif not rotated and self._state is not None and self._state.timestamp.version == top.timestamp.version:
            # Nothing changed upstream: the live snapshot stays, if still valid.
            self._state.check_expiry(self._expiry_clock())
            return self._state

        local_snapshot = self._local.get("snapshot")
        if local_snapshot is None or not await asyncio.to_thread(top.load_local_snapshot, local_snapshot):
            meta = top.timestamp.snapshot_meta
            data, _ = await self._fetch_verified(
                "snapshot",
                self._metadata_name(top.root, "snapshot", meta.version),
                meta.length or self.config.snapshot_max_length,
                top.update_snapshot,
            )
            await self._trust("snapshot", data, top, order)

        targets_bytes = self._local.get("targets")
        if targets_bytes is None or not await asyncio.to_thread(top.load_local_targets, targets_bytes):
            meta = top.snapshot_meta("targets")
            targets_bytes, _ = await self._fetch_verified(
                "targets",
                self._metadata_name(top.root, "targets", meta.version),
                meta.length or self.config.targets_max_length,
                top.update_targets,
            )
            await self._trust("targets", targets_bytes, top, order)
        return _state_of(top, targets_bytes)

    def _given_timestamp_verified(self, top: TopLevelSet) -> tuple[bytes, Timestamp | None] | None:
        """The timestamp a publish answer carried, taken once and verified into ``top``; None to fetch one.

        Taken only if the version its gateway named is above the one ``top``
        trusts: an honest gateway's bytes are then at least that version, so a
        cycle that already moved past it (another answer's, a live fetch) is
        never handed an older one to call a rollback.  One that does not
        verify (a root rotated between the gateway's reads, a forgery) is
        dropped with a warning and the timestamp fetched, as if none had come:
        the answer was a hint, and ``top`` is unchanged by a refused update.
        """
        given, self._given_timestamp = self._given_timestamp, None
        if given is None or given[0] <= top.timestamp_version:
            return None
        try:
            # python-tuf takes an expired timestamp into the set before it says so: one kept a while is left out
            # before it is offered, so that a refusal leaves ``top`` as it was.
            offered = Metadata[Timestamp].from_bytes(given[1]).signed
            if offered.is_expired(top.now):
                raise errors.ExpiredMetadata("timestamp", offered.expires)
            return given[1], top.update_timestamp(given[1])
        except (errors.RepositoryError, DeserializationError) as e:
            logger.warning("a publish answer's timestamp (version %d named) did not verify (%s): fetching it",
                           given[0], e)
            return None

    async def _update_root(self, top: TopLevelSet) -> bool:
        """Spec 5.3: follow the root chain, at most ``max_root_rotations`` steps; True if it moved."""
        first = top.root.version + 1
        for version in range(first, first + self.config.max_root_rotations):
            found = await self._fetch_verified(
                "root", f"{version}.root.json", self.config.root_max_length, top.update_root, missing_ok=True
            )
            if found is None:
                break
            await self._trust("root", found[0], top)
        return top.root.version >= first

    async def _root_moved(self, top: TopLevelSet) -> bool:
        """Whether a mirror serves the root after the one ``top`` trusts (fetched, not trusted: the cycle that
        follows verifies it); False when none answers."""
        try:
            found = await self._fetch_verified("root", f"{top.root.version + 1}.root.json",
                                               self.config.root_max_length, lambda _data: None, missing_ok=True,
                                               live=True)
        except errors.TrustError:
            return False
        return found is not None

    @staticmethod
    def _metadata_name(root: Root, role: str, version: int) -> str:
        encoded = quote(role, safe="")
        return f"{version}.{encoded}.json" if root.consistent_snapshot else f"{encoded}.json"

    @overload
    async def _fetch_verified(self, role: str, filename: str, max_length: int, verify: Callable[[bytes], T],
                              missing_ok: Literal[False] = False, live: bool = False) -> tuple[bytes, T]: ...

    @overload
    async def _fetch_verified(self, role: str, filename: str, max_length: int, verify: Callable[[bytes], T],
                              missing_ok: bool, live: bool = False) -> tuple[bytes, T] | None: ...

    async def _fetch_verified(
        self,
        role: str,
        filename: str,
        max_length: int,
        verify: Callable[[bytes], T],
        missing_ok: bool = False,
        live: bool = False,
    ) -> tuple[bytes, T] | None:
        """Bytes of ``filename`` that ``verify`` accepts, trying each mirror in order.

        ``missing_ok``: whether the file exists is the question (the next
        root); None answers it when a mirror said it has no such file
        (:class:`~proxy.transport.failover.Tried` says when).  ``live``: asked of the mirrors now, never
        answered from what a publish answer carried or named.
        """
        fetcher = self._fetcher.inner if live and isinstance(self._fetcher, Foreseen) else self._fetcher
        async def attempt(_mirror: int, url: str) -> tuple[bytes, T]:
            try:
                data = await fetcher.fetch_bytes(url, max_length)
            except DownloadLengthError as e:
                # An endless or oversized answer is the upstream lying, not a network fault.
                raise errors.LengthMismatch(f"{role}: {e}", role=role, expected=max_length, actual=f">{max_length}") from e
            # Off the loop for large metadata. Safe: ``verify`` only touches this cycle's own
            # TopLevelSet (cycles run one at a time, single-flight, and lookups read only
            # self._state, swapped in whole once the cycle ends) or, for delegated roles,
            # its own arguments (verify_delegated is pure; verified roles are never mutated).
            return data, verify(data) if len(data) <= _ON_LOOP_MAX else await asyncio.to_thread(verify, data)

        async def after(tried: Attempt) -> None:
            if isinstance(tried.error, errors.RepositoryError):
                logger.warning("refusing %s from %s (%s): %s", role, tried.url, tried.error.reason, tried.error)

        try:
            return await failover([m.metadata(filename) for m in self.mirrors], attempt, after=after)
        except Exhausted as e:
            tried = e.tried
        verdict = tried.verdict(probe=missing_ok)
        if verdict is Outcome.LIE:
            raise tried.lies[0]
        if verdict is Outcome.MISSING and missing_ok:
            return None
        # A role the repository must serve, missing everywhere, is the upstream broken.
        raise errors.UpstreamUnreachable(filename, tried.failures)

    # -- lookups -------------------------------------------------------
    async def _wait_for_refresh(self, target_path: str) -> None:
        """Wait for the cycle in flight (one is started if none is) at most ``miss_wait`` seconds.

        Raises MetadataPending past that, and the cycle's own error if it failed.
        """
        try:
            # Shielded: a caller giving up must not cancel everyone's refresh.
            await asyncio.wait_for(asyncio.shield(self._start_refresh()), self.config.miss_wait)
        except TimeoutError:
            raise errors.MetadataPending(target_path, _PENDING_RETRY_AFTER) from None

    @property
    def failing_closed(self) -> bool:
        """No usable trusted state: none, or the live one has expired."""
        return self._state is None or self._state.earliest[0] <= self._expiry_clock()

    async def _recheck(self, target_path: str) -> None:
        """While failing closed: join the cycle in flight, or start one at most a second after the
        last began; wait for it at most ``miss_wait`` in all (MetadataPending past that)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.miss_wait
        task = self._refresh_task
        if task is None or task.done():
            seen = self._last_attempt
            pause = 0.0 if seen is None else seen + _RETRY_FLOOR - time.monotonic()
            if pause > 0:
                if pause >= self.config.miss_wait:
                    raise errors.MetadataPending(target_path, _PENDING_RETRY_AFTER)
                await asyncio.sleep(pause)
            task = self._refresh_task
            if self._last_attempt != seen and task is not None and task.done():
                return  # another request's re-check ran meanwhile: its outcome is in _state/_last_error
        try:
            # Shielded: a caller giving up must not cancel everyone's refresh.
            await asyncio.wait_for(asyncio.shield(self._start_refresh()), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise errors.MetadataPending(target_path, _PENDING_RETRY_AFTER) from None

    def _current_now(self) -> _State | None:
        """The state to answer from when that needs no wait and no refusal (a cycle that is due
        is started in the background); None: ask :meth:`_current`."""
        state = self._state
        if state is None:
            return None
        if self._due() or (self._refresh_task is not None and not self._refresh_task.done()):
            if state.earliest[0] <= self._expiry_clock():
                return None
            # Stale-while-refresh: the live state is valid, so answer from it now and
            # let the cycle run in the background; a stalled mirror delays nobody.
            self._start_refresh()
        return state

    async def _current(self, target_path: str) -> _State:
        if (state := self._current_now()) is not None:
            return state
        try:
            await self._recheck(target_path)
        except (errors.UpstreamUnreachable, errors.RefreshFailed):
            if self._state is None:
                raise
            # Not a lie: keep serving the previous state; lookups still check its expiry.
        except errors.RepositoryError:
            pass  # the update was aborted; what the live state can still answer is decided below
        if self.failing_closed and isinstance(self._last_error, errors.RepositoryError):
            # Nothing valid to answer from and the mirrors served metadata the keys do not
            # vouch for (rollback, bad signature, freeze...): fail closed and say why.
            raise self._last_error
        if self._state is None:
            raise self._last_error or errors.UpstreamUnreachable("timestamp.json", [])
        return self._state

    async def _missing(self, target_path: str, error: errors.UnknownTarget) -> VerifiedTarget:
        """No trusted role lists ``target_path``.  After a refused cycle the update that may list it was
        aborted: re-check (failing closed for this target) and answer its refusal rather than not-found."""
        if not isinstance(self._last_error, errors.RepositoryError):
            raise error
        with contextlib.suppress(errors.TrustError):
            await self._recheck(target_path)
        if isinstance(self._last_error, errors.RepositoryError):
            raise self._last_error
        return await self._lookup(await self._current(target_path), target_path)

    async def get_target(self, target_path: str) -> VerifiedTarget:
        """The signed description of ``target_path`` (refreshing first if due).

        Raises UnknownTarget when no trusted role lists it, ExpiredMetadata
        when any role the lookup used has expired, and the other
        :mod:`proxy.protocol.errors` when delegated metadata fails to verify.
        """
        state = await self._current(target_path)
        if (found := self._remembered_in(state, target_path)) is not None:
            return found
        try:
            return await self._lookup(state, target_path)
        except errors.UnknownTarget as e:
            # Answered from the live state while a cycle runs in the background: a
            # target published since may be in the new one, so wait for it, once and
            # at most miss_wait (MetadataPending then).  Not found only from fresh metadata.
            task = self._refresh_task
            if task is None or task.done():
                return await self._missing(target_path, e)
            with contextlib.suppress(errors.RepositoryError, errors.UpstreamUnreachable, errors.RefreshFailed):
                await self._wait_for_refresh(target_path)  # _current says what a failure means
            try:
                return await self._lookup(await self._current(target_path), target_path)
            except errors.UnknownTarget as again:
                return await self._missing(target_path, again)

    def remembered(self, target_path: str) -> VerifiedTarget | None:
        """What :meth:`get_target` would answer when it can answer at once: a lookup remembered
        under the live state, its expiry checked now.  None when it would wait, walk or refuse
        (ask it then: it says why)."""
        state = self._current_now()
        if state is None:
            return None
        try:
            return self._remembered_in(state, target_path)
        except errors.ExpiredMetadata:
            return None

    def _remembered_in(self, state: _State, target_path: str) -> VerifiedTarget | None:
        """The lookup remembered under ``state`` (raising ExpiredMetadata past its deadline), or None."""
        if state is self._found_state and (hit := self._found.get(target_path)) is not None:
            _check_deadline(hit[1], self._expiry_clock())
            return hit[0]
        return None

    async def _find(self, state: _State, target_path: str) -> Found:
        """Where the spec's walk (5.6.7) ends for ``target_path`` in ``state``, no expiry checked."""
        walker = walk(target_path, state.targets, self.config.max_delegations)
        try:
            request = next(walker)
            while True:
                request = walker.send(await self._role(state, request))
        except StopIteration as stop:
            return stop.value

    async def _lookup(self, state: _State, target_path: str) -> VerifiedTarget:
        found = await self._find(state, target_path)
        state.check_expiry(self._expiry_clock(), found.used)
        if self.config.expiry_override is not None:
            try:
                state.check_expiry(_utcnow(), found.used)
            except errors.ExpiredMetadata as e:
                self.config.expiry_override.report(target_path, e)
        if found.target is None or found.role is None:
            raise errors.UnknownTarget(target_path)
        verified = _verified(found.target, found.role)
        if self.config.expiry_override is None:  # under an override every lookup walks (and reports)
            self._remember(state, target_path, verified, state.deadline(found.used))
        return verified

    async def listed(self, keep: Callable[[str], T | None],
                     only: Collection[str] | None = None) -> list[tuple[T, VerifiedTarget]]:
        """Every target of the live state whose path ``keep`` maps to a value, with that value, in path order.

        Visits every role the trusted targets delegate to (loaded and verified as for lookups, a few at a
        time), and counts a target only where the spec's walk for its path ends at that very role, so a
        listing never names what :meth:`get_target` would not answer.  What each role contributed is kept
        under the bytes it came from (its snapshot entry and delegator, and the top-level targets): after a
        publish only the bins it re-signed are fetched and walked again.  ``keep`` is pure and hashable (a
        profile's bound method): the contributions are kept under it.  ExpiredMetadata if any role visited
        has expired; BadMetadata past ``max_listed_roles`` roles.

        ``only``: of the roles a hash-bin delegation reaches, visit these alone (a caller that knows what the
        others held, because their snapshot versions did not move since it last listed them).  A hash bin
        left out is neither fetched nor walked, so what it might delegate further is not listed either.
        """
        state = await self._current("(every target)")
        top = state.targets
        shares: dict[tuple[object, ...], _Share] = {}
        limit = asyncio.Semaphore(_LISTING_FETCHES)

        async def share(role: VerifiedRole) -> _Share:
            found = []
            for path in sorted(role.signed.targets):
                value = keep(path)
                if value is not None and (hit := await self._find(state, path)).role == role.name:
                    assert hit.target is not None
                    found.append((value, _verified(hit.target, role.name)))
            return _Share(found, role.signed.expires, role.name, role if role.index is not None else None)

        async def child(request: RoleRequest) -> _Share | None:
            if only is not None and request.role not in only and _is_hash_bin(request.delegator):
                return None
            key = (keep, top.fingerprint, *self._role_key(state, request)[0])
            kept = self._shares.get(key)
            if kept is None or kept.delegator is not None:  # a delegator is loaded again for its children
                async with limit:
                    kept = await share(await self._role(state, request))
            shares[key] = kept
            return kept

        first = await share(top)
        visited, pending, seen = [first], [first], {top.name}
        while pending:
            delegator = pending.pop().delegator
            if delegator is None or delegator.index is None:
                continue
            names = [c for c in delegator.index.children() if c not in seen]
            seen.update(names)
            if len(seen) > self.config.max_listed_roles:
                raise errors.BadMetadata(f"{delegator.name} delegates past {self.config.max_listed_roles} roles: "
                                         "not listed", role=delegator.name)
            for at in range(0, len(names), _LISTING_CHUNK):
                # A chunk at a time, so the walks that confirm its targets find its roles still cached.
                chunk = names[at:at + _LISTING_CHUNK]
                done = [d for d in await asyncio.gather(*(child(RoleRequest(n, delegator)) for n in chunk)) if d is not None]
                visited += done
                pending += [d for d in done if d.delegator is not None]
        self._shares = shares  # contributions of roles this listing did not reach are not kept
        now = self._expiry_clock()
        state.check_expiry(now)
        for role in visited:
            if role.expires <= now:
                raise errors.ExpiredMetadata(role.name, role.expires)
        return sorted((f for role in visited for f in role.found), key=lambda f: f[1].path)

    def _remember(self, state: _State, target_path: str, target: VerifiedTarget, deadline: tuple[datetime, str]) -> None:
        """Keep a lookup's answer for as long as ``state`` is the live one."""
        if state is not self._state or self.config.found_cache_size < 1:
            return  # answered from a state already replaced, or nothing is kept: not worth keeping
        if self._found_state is not state:
            self._found, self._found_state = {}, state
        if len(self._found) >= self.config.found_cache_size:
            del self._found[next(iter(self._found))]
        self._found[target_path] = (target, deadline)

    def expect(self, roles: Mapping[str, int], targets: Mapping[str, str], version: int = 0,
               given: Mapping[str, bytes | None] | None = None) -> int:
        """Get ready for what a publish answer says the next cycle and lookup read: the next root's probe
        (usually a 404, handed over as such), ``roles`` (a snapshot or delegated role -> its version) and
        ``targets`` (path -> the digest it is served under); ``version``: the timestamp version the answer named.
        ``given``: bodies the answer carried, by their path under the first mirror (``metadata/7.snapshot.json``,
        ``metadata/timestamp.json``, a page's served name; None: the gateway says it has no such file); the others
        are fetched at once.  Trusts nothing: each body is verified when asked for, like any other
        (:mod:`proxy.transport.foreseen`), and the timestamp by the next cycle.  Only with a fetcher that
        foresees and consistent snapshots, whose versioned and hash-named files never change.  How many files
        it got ready."""
        fetcher, state, given = self._fetcher, self._state, given or {}
        if not isinstance(fetcher, Foreseen) or state is None or not state.root.consistent_snapshot:
            return 0
        mirror = self.mirrors[0]
        base = mirror.targets_url

        def key(url: str) -> str:  # a file's path in the tree, as the answer names it
            return url[len(base):] if url.startswith(base) else url

        timestamp = given.get(key(mirror.metadata("timestamp.json")))
        if timestamp is not None and len(timestamp) <= self.config.timestamp_max_length \
                and version > (self._given_timestamp or (0, b""))[0]:
            self._given_timestamp = (version, timestamp)
        files = [(mirror.metadata(f"{state.root.version + 1}.root.json"), self.config.root_max_length, True)]
        files += [(mirror.metadata(self._metadata_name(state.root, role, role_version)),
                   self.config.snapshot_max_length if role == "snapshot" else self.config.targets_max_length, False)
                  for role, role_version in roles.items() if role not in _UNVERSIONED]
        files += [(mirror.target(self.config.served_name(path, digest)), self.config.targets_max_length, False)
                  for path, digest in targets.items()]
        for url, limit, absent_ok in files:
            body = given.get(key(url), b"")
            if (body is None and absent_ok) or (body and len(body) <= limit):
                fetcher.give(url, body)
            else:
                fetcher.expect(url, limit, absent_ok=absent_ok)
        return len(files)

    def target_urls(self, target: VerifiedTarget) -> list[str]:
        """Where to download ``target``, one URL per mirror, in mirror order."""
        consistent = bool(self._state.root.consistent_snapshot) if self._state is not None else True
        return consistent_target_urls(target, self.mirrors, consistent, self.config.served_name)

    async def _role(self, state: _State, request: RoleRequest) -> VerifiedRole:
        """A delegated role for this state: from the LRU, the directory, another process's copy, or a mirror."""
        key, meta = self._role_key(state, request)
        cached = self._roles.get(key)
        if cached is not None:
            self._roles.move_to_end(key)
            return cached
        task = self._loading.get(key)
        if task is None:
            # A copy another process left is read and verified at once, as a role in the LRU is taken: a lookup
            # then ends in its first step, and asks the gateway nothing ahead (Resolver._page_target).  Only
            # copies small enough to verify on the loop are left (_load_role).
            if self._shared is not None and _is_hash_bin(request.delegator):
                data = self._shared.read(request.role, meta.version, min(self._role_limit(meta), _ON_LOOP_MAX))
                role = None if data is None else self._verified_local(data, request, meta)
                if role is not None:
                    return self._keep_role(key, role)
            task = self._loading[key] = asyncio.create_task(self._load_role(state, request, meta, key))
            task.add_done_callback(lambda _t: self._loading.pop(key, None))
        return await asyncio.shield(task)

    @staticmethod
    def _role_key(state: _State, request: RoleRequest) -> tuple[_RoleKey, MetaFile]:
        """What identifies the bytes of a delegated role in ``state``: its snapshot entry and its delegator."""
        meta = state.snapshot.meta.get(f"{request.role}.json")
        if meta is None:
            raise errors.BadMetadata(f"{request.role} is delegated but not listed in snapshot", role=request.role)
        hashes = tuple(sorted((meta.hashes or {}).items()))
        return (request.role, request.delegator.fingerprint, meta.version, meta.length, hashes), meta

    async def _load_role(self, state: _State, request: RoleRequest, meta: MetaFile, key: _RoleKey) -> VerifiedRole:
        name, delegator = request.role, request.delegator.signed
        persist = self.config.persist_bins or not _is_hash_bin(request.delegator)
        local = self._store.read(name) if persist else None
        role = None if local is None else self._verified_local(local, request, meta)
        if role is None:
            data, fetched = await self._fetch_verified(
                name,
                self._metadata_name(state.root, name, meta.version),
                self._role_limit(meta),
                lambda data: verify_delegated(data, name, delegator, meta, self._expiry_clock()),
            )
            role = fetched
            if persist:
                self._store.write(name, data)
            elif self._shared is not None and len(data) <= _ON_LOOP_MAX:
                # Not waited for: the lookup has its role; the other processes take the copy once it is there.
                self._shared.leave(name, meta.version, data)
        return self._keep_role(key, role)

    def _role_limit(self, meta: MetaFile) -> int:
        """The most bytes a delegated role may have: its snapshot entry's length, else the configured bound."""
        return meta.length or self.config.targets_max_length

    def _verified_local(self, data: bytes, request: RoleRequest, meta: MetaFile) -> VerifiedRole | None:
        """``data`` (kept on disk, by this process or another) verified as the role ``meta`` names; None if not."""
        try:
            return verify_delegated(data, request.role, request.delegator.signed, meta, self._expiry_clock())
        except errors.RepositoryError as e:
            logger.debug("local %s not usable: %s", request.role, e)
            return None

    def _keep_role(self, key: _RoleKey, role: VerifiedRole) -> VerifiedRole:
        self._roles[key] = role
        while len(self._roles) > self.config.bin_cache_size:
            self._roles.popitem(last=False)
        return role

    # -- reporting -----------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Live top-level roles (version, expires as datetime), last refresh (epoch s), last error reason, cache size."""
        state = self._state
        roles: dict[str, dict[str, Any]] = {}
        if state is not None:
            for name, signed in (
                ("root", state.root),
                ("timestamp", state.timestamp),
                ("snapshot", state.snapshot),
                ("targets", state.targets.signed),
            ):
                roles[name] = {"version": signed.version, "expires": signed.expires}
        return {
            "ready": state is not None and state.earliest[0] > self._expiry_clock(),
            "roles": roles,
            "last_refresh": self._last_success,
            "last_error": None if self._last_error is None else self._last_error.reason,
            "last_error_message": None if self._last_error is None else str(self._last_error)[:300],
            "cached_roles": len(self._roles),
        }


@dataclass(frozen=True)
class _Share:
    """What one role contributed to a listing: its targets kept, its expiry, and itself if it delegates further."""

    found: list[tuple[Any, VerifiedTarget]]
    expires: datetime
    name: str
    delegator: VerifiedRole | None


def _verified(target: TargetFile, role: str) -> VerifiedTarget:
    return VerifiedTarget(path=target.path, length=target.length, hashes=dict(target.hashes), role=role,
                          custom=dict(target.unrecognized_fields))


def _state_of(top: TopLevelSet, targets_bytes: bytes) -> _State:
    targets = VerifiedRole.of("targets", top.targets, targets_bytes)
    return _State(top.root, top.timestamp, top.snapshot, targets)


def _is_hash_bin(delegator: VerifiedRole) -> bool:
    """True for roles reached through a hash-bin delegation (kept in memory only)."""
    return delegator.index is not None and delegator.index.hashed


def _keys_rotated(before: Root, after: Root) -> bool:
    """Whether ``after`` trusts other keys (or thresholds) than ``before`` for timestamp, snapshot or targets."""
    def signers(root: Root, role: str) -> tuple[int, frozenset[tuple[str, str]]]:
        r = root.roles[role]
        return r.threshold, frozenset((k, root.keys[k].keyval.get("public", "")) for k in r.keyids)

    return any(signers(before, role) != signers(after, role) for role in ("timestamp", "snapshot", "targets"))
