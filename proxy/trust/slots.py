"""Catching a metadata directory up with the newest state its siblings trust.

Processes sharing a cache directory (workers, more workers after a restart,
replicas on a shared volume) each keep their own metadata directory, a
"slot".  A slot that starts behind another one (a new slot holds only the
pinned root) would accept a still-valid timestamp its sibling already
outgrew: a rollback.  :func:`catch_up` closes that hole.  It never copies a
sibling's files blindly: each sibling's state is verified again from the
pinned root, walking its kept root chain (``roots/N.root.json``) and then
its timestamp, snapshot and targets through tuf's trusted set; only what
verifies can be adopted, and only when it is newer than the slot's own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tuf.api.metadata import Metadata

from proxy.protocol import errors
from proxy.protocol.tufset import TopLevelSet
from proxy.trust.metadir import MetadataStore

logger = logging.getLogger(__name__)

_ROLES = ("timestamp", "snapshot", "targets")
# (root, timestamp, snapshot) versions; -1 where a role is absent.
Rank = tuple[int, int, int]


@dataclass
class _Verified:
    """What of one directory verified from the pinned root."""

    roots: dict[int, bytes] = field(default_factory=dict)  # version -> bytes, the whole chain
    roles: dict[str, bytes] = field(default_factory=dict)
    rank: Rank = (-1, -1, -1)


def _reverify(pinned_root: bytes, directory: Path, now: datetime) -> _Verified:
    store = MetadataStore(directory)
    top = TopLevelSet(pinned_root, now)
    found = _Verified(roots={top.root.version: pinned_root})
    # Slots written before roots/ was kept hold only root.json: it is tried as the next link too.
    for version in range(top.root.version + 1, top.root.version + 1 + 1024):
        data = store.kept_root(version) or _if_version(store.read("root"), version)
        if data is None:
            break
        try:
            top.update_root(data)
        except errors.TrustError as e:
            logger.warning("%s: kept root v%d does not verify (%s): ignored", directory, version, e)
            break
        found.roots[version] = data
    loads = {"timestamp": top.load_local_timestamp, "snapshot": top.load_local_snapshot,
             "targets": top.load_local_targets}
    for role in _ROLES:
        data = store.read(role)
        if data is None:
            break
        loads[role](data)
        if not top.has(role):  # did not verify at all (expired ones still load: they guard against rollback)
            break
        found.roles[role] = data
    found.rank = (top.root.version,
                  top.timestamp.version if "timestamp" in found.roles else -1,
                  top.snapshot.version if "snapshot" in found.roles else -1)
    return found


def _if_version(data: bytes | None, version: int) -> bytes | None:
    return data if data is not None and _claimed_version(data) == version else None


def _claimed_version(data: bytes | None) -> int:
    try:
        return Metadata.from_bytes(data).signed.version if data is not None else -1
    except Exception:  # noqa: BLE001 (unreadable: claims nothing)
        return -1


def catch_up(metadata_dir: Path, pinned_root: bytes, siblings: Iterable[Path]) -> Rank | None:
    """Move ``metadata_dir`` up to the newest sibling state that verifies from ``pinned_root``.

    Role by role, only forward: a role is written when the sibling's verified
    version is newer than the one the directory holds.  Takes the directory's
    lock meanwhile (MetadataDirLocked if another process holds it).  Returns
    the sibling's rank when anything was adopted, else None.
    """
    store = MetadataStore(metadata_dir)
    store.lock()
    try:
        now = datetime.now(UTC)
        best: _Verified | None = None
        for sibling in map(Path, siblings):
            if sibling == Path(metadata_dir) or not (sibling / "root.json").exists():
                continue
            found = _reverify(pinned_root, sibling, now)
            if best is None or found.rank > best.rank:
                best = found
        if best is None:
            return None
        adopted = False
        if best.rank[0] > _claimed_version(store.read("root")):
            for version, data in sorted(best.roots.items()):
                store.keep_root(version, data)
            store.write("root", best.roots[best.rank[0]])
            adopted = True
        for role, data in best.roles.items():
            if _claimed_version(data) > _claimed_version(store.read(role)):
                store.write(role, data)
                adopted = True
        if not adopted:
            return None
        logger.info("%s caught up with its siblings: root v%d, timestamp v%d, snapshot v%d", metadata_dir, *best.rank)
        return best.rank
    finally:
        store.unlock()
