"""Pure verification of delegated targets roles and of target lookups.

No sockets, no files: bytes and already-verified delegators in, verified
objects or :mod:`proxy.protocol.errors` exceptions out.  Top-level roles go
through tuf's own state machine (:mod:`proxy.protocol.tufset`); delegated
roles are verified here with tuf's public API, mirroring
``TrustedMetadataSet.update_delegated_targets`` step for step, because the
set keeps every delegated role it loads forever and a proxy touching
16,384 bins needs them in a bounded cache instead.

Lookups walk the delegation graph in pre-order depth-first as the spec
(5.6.7) says, with terminating delegations and a bound on visited roles.
Finding the children responsible for a path is the hot spot: TAP 15
succinct bins compute the name directly; classic ``path_hash_prefixes``
delegations use a prefix → roles map built once per verified delegator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime

from tuf.api import exceptions as tuf_exc
from tuf.api.metadata import Metadata, MetaFile, TargetFile, Targets
from tuf.api.serialization import DeserializationError, SerializationError

from proxy.protocol import errors
from proxy.protocol.model import digest


def check_length_and_hashes(role: str, data: bytes, meta: MetaFile) -> None:
    """Raise LengthMismatch / HashMismatch unless ``data`` matches ``meta``."""
    if meta.length is not None and len(data) != meta.length:
        raise errors.LengthMismatch(
            f"{role}: {len(data)} bytes, {meta.length} listed",
            role=role, expected=meta.length, actual=len(data),
        )
    for algorithm, expected in (meta.hashes or {}).items():
        actual = digest(algorithm, data)
        if actual != expected:
            raise errors.HashMismatch(
                f"{role}: {algorithm} {actual}, {expected} listed",
                role=role, expected=expected, actual=actual,
            )


@dataclass(frozen=True, eq=False)
class VerifiedRole:
    """A targets role whose signatures, version, hashes and expiry checked out.

    ``fingerprint`` (sha256 of the bytes) identifies exactly what was
    verified, so roles it delegates to can be reused only while it is the
    same.  ``index`` answers "which children cover this path" quickly.
    """

    name: str
    signed: Targets
    fingerprint: str
    index: DelegationIndex | None = field(default=None)

    @classmethod
    def of(cls, name: str, signed: Targets, data: bytes) -> VerifiedRole:
        index = DelegationIndex(signed) if signed.delegations is not None else None
        return cls(name, signed, hashlib.sha256(data).hexdigest(), index)

    @property
    def expires(self) -> datetime:
        return self.signed.expires


def verify_delegated(
    data: bytes, role: str, delegator: Targets, meta: MetaFile | None, now: datetime
) -> VerifiedRole:
    """Verify ``data`` as ``role`` delegated by ``delegator`` (spec 5.6)."""
    if meta is None:
        raise errors.BadMetadata(f"{role} is delegated but not listed in snapshot", role=role)
    check_length_and_hashes(role, data, meta)
    try:
        md = Metadata[Targets].from_bytes(data)
    except DeserializationError as e:
        raise errors.BadMetadata(f"{role}: malformed metadata: {e}", role=role) from e
    if md.signed.type != Targets.type:
        raise errors.BadMetadata(f"{role}: expected targets, got {md.signed.type}", role=role)
    try:
        delegator.verify_delegate(role, md.signed_bytes, md.signatures)
    except tuf_exc.UnsignedMetadataError as e:
        raise errors.BadSignature(f"{role}: {e}", role=role) from e
    except SerializationError as e:  # parsed, but with no canonical form to check a signature over (a float)
        raise errors.BadMetadata(f"{role}: cannot verify: {e}", role=role) from e
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:  # odd but parseable metadata
        raise errors.BadMetadata(f"{role}: cannot verify: {type(e).__name__}: {e}", role=role) from e
    version = md.signed.version
    if version < meta.version:
        raise errors.Rollback(role, meta.version, version)
    if version > meta.version:
        raise errors.VersionMismatch(role, meta.version, version)
    if md.signed.is_expired(now):
        raise errors.ExpiredMetadata(role, md.signed.expires)
    return VerifiedRole.of(role, md.signed, data)


class DelegationIndex:
    """Which delegated roles of one targets role cover a target path, in order.

    Reproduces ``Delegations.get_roles_for_target`` exactly (same roles, same
    order, same terminating flags) without scanning every role per lookup.
    """

    def __init__(self, targets: Targets) -> None:
        delegations = targets.delegations
        assert delegations is not None
        self._succinct = delegations.succinct_roles
        # prefix length → prefix → [(position, name, terminating)]
        self._by_prefix: dict[int, dict[str, list[tuple[int, str, bool]]]] = {}
        self._patterns: list[tuple[int, object]] = []
        for position, role in enumerate((delegations.roles or {}).values()):
            if role.path_hash_prefixes is not None:
                for prefix in role.path_hash_prefixes:
                    table = self._by_prefix.setdefault(len(prefix), {})
                    table.setdefault(prefix, []).append((position, role.name, role.terminating))
            elif role.paths is not None:
                self._patterns.append((position, role))

    @property
    def hashed(self) -> bool:
        """True when this is a hash-bin delegation (succinct or by prefixes)."""
        return self._succinct is not None or bool(self._by_prefix)

    def children(self) -> list[str]:
        """Every role this one delegates to, in delegation order (what a listing of all targets visits)."""
        if self._succinct is not None:
            return list(self._succinct.get_roles())
        return list(dict.fromkeys(name for _, name in sorted(
            [(p, n) for table in self._by_prefix.values() for entries in table.values() for p, n, _ in entries]
            + [(p, r.name) for p, r in self._patterns])))  # type: ignore[attr-defined]

    def roles_for(self, target_path: str) -> list[tuple[str, bool]]:
        if self._succinct is not None:
            return [(self._succinct.get_role_for_target(target_path), True)]
        hits: list[tuple[int, str, bool]] = []
        if self._by_prefix:
            path_hash = hashlib.sha256(target_path.encode("utf-8")).hexdigest()
            for length, table in self._by_prefix.items():
                hits.extend(table.get(path_hash[:length], ()))
        for position, role in self._patterns:
            if role.is_delegated_path(target_path):  # type: ignore[attr-defined]
                hits.append((position, role.name, role.terminating))  # type: ignore[attr-defined]
        # A role whose prefixes overlap matches twice but is listed once, like tuf.
        unique = {position: (name, terminating) for position, name, terminating in hits}
        return [unique[position] for position in sorted(unique)]


@dataclass(frozen=True)
class RoleRequest:
    """The walker needs ``role`` as delegated by ``delegator``."""

    role: str
    delegator: VerifiedRole


@dataclass(frozen=True)
class Found:
    """Where the walk ended: the target (or None) and every role it used."""

    target: TargetFile | None
    role: str | None
    used: tuple[VerifiedRole, ...]


def walk(
    target_path: str, top: VerifiedRole, max_delegations: int
) -> Generator[RoleRequest, VerifiedRole, Found]:
    """Pre-order DFS for ``target_path``; ``send()`` each requested role back.

    The caller loads and verifies (``verify_delegated``) each
    :class:`RoleRequest` it is given and sends the result in; the return
    value (``StopIteration.value``) is the :class:`Found`.
    """
    to_visit: list[tuple[str, VerifiedRole | None]] = [(top.name, None)]
    visited: set[str] = set()
    used: list[VerifiedRole] = []
    while to_visit and len(visited) <= max_delegations:
        name, delegator = to_visit.pop()
        if name in visited:
            continue
        role = top if delegator is None else (yield RoleRequest(name, delegator))
        used.append(role)
        target = role.signed.targets.get(target_path)
        if target is not None:
            return Found(target, name, tuple(used))
        visited.add(name)
        if role.index is None:
            continue
        children: list[tuple[str, VerifiedRole | None]] = []
        for child, terminating in role.index.roles_for(target_path):
            children.append((child, role))
            if terminating:
                to_visit = []
                break
        to_visit.extend(reversed(children))
    return Found(None, None, tuple(used))
