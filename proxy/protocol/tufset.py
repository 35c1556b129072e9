"""The one place that drives python-tuf's internal ``TrustedMetadataSet``.

Why option (b) of issue 3: python-tuf's ``Updater`` is synchronous, refreshes
once per instance and freezes its reference time at construction, so a
long-running asyncio server would have to bridge every download to a worker
thread and rebuild an ``Updater`` per cycle anyway.  ``TrustedMetadataSet``
is the byte-level state machine underneath (spec 5.3-5.6: root chain,
threshold signatures, rollback, freeze, fast-forward recovery, snapshot
meta checks); driving it directly with awaited downloads keeps the state
machine and the crypto python-tuf's own, while the I/O is ours.  It is
internal API, so ``tuf`` is pinned to one minor version (pyproject) and
``tests/test_tuf_interface.py`` fails loudly if what we use here changes.
No other module imports ``tuf.ngclient``.

This module is pure: bytes in, verified objects or a typed
:mod:`proxy.protocol.errors` exception out.  tuf's coarse exceptions are
mapped onto ours by re-reading the offending bytes on the error path only.

A :class:`Verified` memo, kept by a long-running client across its cycles,
lets a cycle take back *local* bytes (``load_local_*``: what an earlier cycle
of the same process verified and persisted) without parsing, re-encoding
and checking their signatures again: python-tuf's own check is what ran
the first time, on the very same bytes, against the very same root bytes,
and its result is a pure function of those.  Everything else the set does
with the role (version, rollback, expiry, the snapshot's meta) still runs,
every cycle.  Bytes from the network are always verified, and remembered.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from tuf.api import exceptions as tuf_exc
from tuf.api.metadata import Metadata, MetaFile, Root, Signed, Snapshot, Targets, Timestamp
from tuf.api.serialization import DeserializationError
from tuf.ngclient._internal.trusted_metadata_set import TrustedMetadataSet
from tuf.ngclient.config import EnvelopeType

from proxy.protocol import errors
from proxy.protocol.verify import check_length_and_hashes

R = TypeVar("R")


# What python-tuf's loader returns for a role that verified: the payload, its signed bytes, its signatures.
_Loaded = tuple[Any, bytes, dict[str, Any]]


class Verified:
    """Top-level roles python-tuf verified, by (role, digest of their bytes, digest of the root bytes they
    verified under): what a later cycle's ``load_local_*`` of the same bytes under the same root takes back
    unchecked.  Only successes are kept, at most ``size`` (the newest last)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, str | None, bytes, bytes], _Loaded] = OrderedDict()
        self.reused = 0  # loads answered from here (observability, tests)

    def get(self, key: tuple[str, str | None, bytes, bytes]) -> _Loaded | None:
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            self.reused += 1
        return found

    def put(self, key: tuple[str, str | None, bytes, bytes], loaded: _Loaded) -> None:
        self._kept[key] = loaded
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)


class TopLevelSet:
    """Fresh trusted top-level metadata for one refresh cycle.

    Load order is root → timestamp → snapshot → targets, as in the spec.
    ``load_local_*`` feed previously trusted bytes (rollback protection and
    cache); their failures are expected and swallowed.  ``update_*`` feed
    bytes from the network and raise typed errors.  ``verified``: see
    :class:`Verified` (the module docstring).
    """

    def __init__(self, trusted_root: bytes, now: datetime, verified: Verified | None = None) -> None:
        self._set = _guard("root", trusted_root, lambda: TrustedMetadataSet(trusted_root, EnvelopeType.METADATA))
        # The set freezes its clock at construction; pin it to the caller's.
        self._set.reference_time = now
        self.now = now
        self._verified = verified
        self._root_digest = hashlib.sha256(trusted_root).digest()  # of the root the set trusts now
        self._local = False  # whether the bytes being loaded are local ones (a memo hit may answer them)
        if verified is not None:
            self._set._load_data = self._remembering(self._set._load_data)

    def _remembering(self, load: Callable[..., _Loaded]) -> Callable[..., _Loaded]:
        """python-tuf's loader (parse, type check, the delegator's signature threshold), remembered per bytes."""
        verified = self._verified
        assert verified is not None

        def remembered(role: type[Signed], data: bytes, delegator: object = None, role_name: str | None = None) -> _Loaded:
            if delegator is None or delegator is not self._set.root or role.type == Root.type:
                return load(role, data, delegator, role_name)  # a root, or not a top-level role
            key = (role.type, role_name, hashlib.sha256(data).digest(), self._root_digest)
            if self._local and (found := verified.get(key)) is not None:
                return found
            loaded = load(role, data, delegator, role_name)
            verified.put(key, loaded)
            return loaded

        return remembered

    def _load_local(self, load: Callable[[], object]) -> bool:
        self._local = True
        try:
            return _swallow(load)
        finally:
            self._local = False

    @property
    def root(self) -> Root:
        return self._set.root

    @property
    def timestamp(self) -> Timestamp:
        return self._set.timestamp

    @property
    def snapshot(self) -> Snapshot:
        return self._set.snapshot

    @property
    def targets(self) -> Targets:
        return self._set.targets

    def has(self, role: str) -> bool:
        return role in self._set

    def update_root(self, data: bytes) -> Root:
        trusted = self._set.root.version

        def details(e: Exception) -> errors.TrustError | None:
            offered = _version_of(data)
            if isinstance(e, tuf_exc.BadVersionNumberError):
                if offered is not None and offered <= trusted:
                    return errors.Rollback("root", trusted, offered)
                return errors.VersionMismatch("root", trusted + 1, offered or -1)
            return None

        root = _guard("root", data, lambda: self._set.update_root(data), details)
        self._root_digest = hashlib.sha256(data).digest()
        return root

    def load_local_timestamp(self, data: bytes) -> bool:
        """True when the local timestamp loaded as final (not expired)."""
        return self._load_local(lambda: self._set.update_timestamp(data))

    @property
    def timestamp_version(self) -> int:
        """The version of the timestamp trusted so far in this set (0 before any)."""
        prior = self._set.get(Timestamp.type)
        return 0 if prior is None else prior.version

    def update_timestamp(self, data: bytes) -> Timestamp | None:
        """The new timestamp, or None when it is the version already trusted."""
        if self._set.root.is_expired(self.now):
            raise errors.ExpiredMetadata("root", self._set.root.expires)
        prior = self._set.get(Timestamp.type)

        def details(e: Exception) -> errors.TrustError | None:
            if isinstance(e, tuf_exc.ExpiredMetadataError):
                return errors.ExpiredMetadata("timestamp", self._set.timestamp.expires)
            offered = Metadata[Timestamp].from_bytes(data).signed
            if isinstance(e, tuf_exc.BadVersionNumberError) and prior is not None and isinstance(offered, Timestamp):
                if offered.version < prior.version:
                    return errors.Rollback("timestamp", prior.version, offered.version)
                return errors.Rollback(
                    "snapshot", prior.snapshot_meta.version, offered.snapshot_meta.version
                )
            return None

        try:
            return _guard("timestamp", data, lambda: self._set.update_timestamp(data), details)
        except errors.BadSignature as e:
            if _signed_by_none_of(data, set(self._set.root.roles[Timestamp.type].keyids)):
                raise errors.BadSignature(f"timestamp: {WRONG_ROOT}", role="timestamp") from e
            raise
        except tuf_exc.EqualVersionNumberError:
            # Same version as the local one: keep it, but it must still be final.
            if self._set.timestamp.is_expired(self.now):
                raise errors.ExpiredMetadata("timestamp", self._set.timestamp.expires) from None
            return None

    def load_local_snapshot(self, data: bytes) -> bool:
        """True when the local snapshot is the final one (no download needed)."""
        return self._load_local(lambda: self._set.update_snapshot(data, trusted=True))

    def update_snapshot(self, data: bytes) -> Snapshot:
        meta = self._set.timestamp.snapshot_meta
        # Checked here to tell length from hash; tuf is then told not to rehash.
        check_length_and_hashes("snapshot", data, meta)
        prior = self._set.get(Snapshot.type)

        def details(e: Exception) -> errors.TrustError | None:
            if isinstance(e, tuf_exc.ExpiredMetadataError):
                return errors.ExpiredMetadata("snapshot", self._set.snapshot.expires)
            offered = Metadata[Snapshot].from_bytes(data).signed
            if not isinstance(offered, Snapshot):
                return None  # another role's document: tuf's "expected snapshot" says it
            if prior is not None:
                for name, info in prior.meta.items():
                    new = offered.meta.get(name)
                    if new is None or new.version < info.version:
                        role = name.removesuffix(".json")
                        return errors.Rollback(role, info.version, None if new is None else new.version)
            if isinstance(e, tuf_exc.BadVersionNumberError):
                return _version_error("snapshot", meta.version, offered.version)
            return None

        return _guard("snapshot", data, lambda: self._set.update_snapshot(data, trusted=True), details)

    def load_local_targets(self, data: bytes) -> bool:
        return self._load_local(lambda: self._set.update_targets(data))

    def update_targets(self, data: bytes) -> Targets:
        meta = self.snapshot_meta("targets")
        check_length_and_hashes("targets", data, meta)

        def details(e: Exception) -> errors.TrustError | None:
            if isinstance(e, tuf_exc.ExpiredMetadataError):
                return errors.ExpiredMetadata("targets", Metadata[Targets].from_bytes(data).signed.expires)
            if isinstance(e, tuf_exc.BadVersionNumberError):
                return _version_error("targets", meta.version, _version_of(data) or -1)
            return None

        return _guard("targets", data, lambda: self._set.update_targets(data), details)

    def snapshot_meta(self, role: str) -> MetaFile:
        meta = self._set.snapshot.meta.get(f"{role}.json")
        if meta is None:
            raise errors.BadMetadata(f"snapshot does not list {role}", role=role)
        return meta


def _version_error(role: str, listed: int, offered: int) -> errors.TrustError:
    if offered < listed:
        return errors.Rollback(role, listed, offered)
    return errors.VersionMismatch(role, listed, offered)


def _version_of(data: bytes) -> int | None:
    try:
        return Metadata.from_bytes(data).signed.version
    except Exception:  # noqa: BLE001 (only used to describe an error)
        return None


def _swallow(load: Callable[[], object]) -> bool:
    try:
        load()
        return True
    except Exception:  # noqa: BLE001 (a local file that does not load is simply not used)
        return False


# A timestamp no pinned key signed is far likelier a root for another repository than an attack: say so.
WRONG_ROOT = "the upstream's timestamp is signed by none of the pinned root's keys: is --root this upstream's root?"


def _signed_by_none_of(data: bytes, keyids: set[str]) -> bool:
    """True when ``data`` is metadata whose signatures all name keys outside ``keyids``."""
    try:
        signatures = Metadata.from_bytes(data).signatures
    except Exception:  # noqa: BLE001 (bytes too odd to tell: the refusal as it was says enough)
        return False
    return bool(signatures) and not keyids & set(signatures)


def _guard(
    role: str,
    data: bytes,
    call: Callable[[], R],
    details: Callable[[Exception], errors.TrustError | None] | None = None,
) -> R:
    """Run a tuf call, turning every exception it raises into a typed refusal of ours.

    Whatever bytes the repository sends, what comes out is a verified object
    or a :class:`~proxy.protocol.errors.RepositoryError`: the repository lied.
    """
    try:
        return call()
    except tuf_exc.EqualVersionNumberError:
        raise
    except tuf_exc.UnsignedMetadataError as e:
        raise errors.BadSignature(f"{role}: {e}", role=role) from e
    except DeserializationError as e:
        raise errors.BadMetadata(f"{role}: malformed metadata: {e}", role=role) from e
    except tuf_exc.LengthOrHashMismatchError as e:
        raise errors.HashMismatch(f"{role}: {e}", role=role) from e
    except tuf_exc.RepositoryError as e:
        try:
            mapped = details(e) if details is not None else None
        except Exception:  # noqa: BLE001 (bytes too odd to describe further: tuf's message says enough)
            mapped = None
        raise mapped or errors.BadMetadata(f"{role}: {e}", role=role) from e
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        # tuf raises these for structurally odd but parseable metadata: the repository's fault,
        # never a crash.  Anything else is a bug of ours and must not be blamed on the repository.
        raise errors.BadMetadata(f"{role}: invalid metadata: {type(e).__name__}: {e}", role=role) from e
