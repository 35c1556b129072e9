"""A mirror tree on disk: only verified bytes ever get a served name.

Layout of ``DEST`` (the layout ``tufproxy repo`` serves, so ``tufproxy
serve --repository DEST`` and any static HTTP server can serve it)::

    DEST/metadata/      N.root.json, root.json, timestamp.json and the
                        versioned snapshot, targets and delegated roles
    DEST/simple/..., DEST/packages/...
                        every target under HASH.name for each signed hash,
                        and under its plain name
    DEST/.mirror/       sync state, never served: trust/ (the trusted
                        metadata of the sync's TUF client), tmp/, audit.log,
                        manifest.sqlite (the targets the last sync published:
                        :mod:`proxy.mirror.manifest`)

A download is streamed into ``.mirror/tmp``, hashed with every signed
algorithm and length-bounded as it arrives; only a file that matches is
fsynced and renamed to its hash name.  Plain names and the new
``timestamp.json`` are published last, so an interrupted sync leaves the
previous state served plus verified files nobody references yet.

DEST may sit on removable media that anyone could have edited between two
syncs, so nothing already in it is trusted for its name or size: every
reuse (a file the sync would otherwise download, a page it parses, a file
it re-signs) re-hashes the bytes against this run's trusted target first,
and a copy that does not match loses every name it has.  The one thing a
sync takes from DEST unchecked is which projects did not change: a project
whose every target is signed by roles the new snapshot lists at the
versions the manifest recorded is left as the last sync published it
(``mirror sync --full`` re-checks them; ``mirror verify`` re-hashes every
byte, and what serves the tree verifies each target it sends anyway).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from tuf.api import exceptions as tuf_exc
from tuf.api.metadata import Metadata, Root, Snapshot, Timestamp

from proxy.mirror.manifest import Manifest
from proxy.protocol.errors import BadMetadata, BadSignature, RepositoryError
from proxy.protocol.hashing import StreamingVerifier
from proxy.protocol.layout import METADATA_DIR, MIRROR_STATE_DIR, consistent_name
from proxy.trust.fetch import FileSink, Want
from proxy.util.atomic import Batch, atomic_link, atomic_write, fsync_dir

STATE_DIR = MIRROR_STATE_DIR
_READ_CHUNK = 1 << 20


def target_names(target: Want) -> list[str]:
    """Every name ``target`` is served under: one per signed hash, then the plain one."""
    return [*(consistent_name(target.path, d) for d in target.hashes.values()), target.path]


def verify_file(path: Path, target: Want, copy_to: BinaryIO | None = None) -> None:
    """Re-hash ``path`` against ``target`` (length and every signed hash), optionally copying it.

    ``target`` is a signed target (``Want.of``) or a file its verified page
    vouches for (:mod:`proxy.trust.pagefiles`, where the length may be a bound).
    Reads at most one byte more than the length.  Raises
    ``FileNotFoundError``, or the typed refusal when the bytes are not the
    target's; ``copy_to`` then holds bytes nobody may use.
    """
    verifier = StreamingVerifier(target.path, target.hashes, target.length, exact=target.exact, role=target.role)
    with open(path, "rb") as f:
        while chunk := f.read(min(_READ_CHUNK, target.length - verifier.received + 1)):
            verifier.update(chunk)
            if copy_to is not None:
                copy_to.write(chunk)
    verifier.finish()


def check_file(path: Path, target: Want) -> str | None:
    """None when ``path`` holds exactly ``target``'s bytes, else what is wrong."""
    try:
        verify_file(path, target)
    except FileNotFoundError:
        return "missing"
    except RepositoryError as e:
        return str(e).removeprefix(f"{target.path}: ")
    return None


class MirrorTree:
    """``DEST`` and its state directory; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.state = self.root / STATE_DIR
        self.trust_dir = self.state / "trust"
        self.tmp = self.state / "tmp"
        self.metadata_dir = self.root / METADATA_DIR
        self.manifest = Manifest(self.state)
        self.tmp.mkdir(parents=True, exist_ok=True)
        # Left by an interrupted sync: never verified, never served.
        for stale in self.tmp.iterdir():
            stale.unlink()

    def path(self, name: str) -> Path:
        return self.root / name

    def read(self, target: Want) -> bytes:
        """The bytes of a target in the tree (small things: pages), re-verified as they are read.

        Raises the typed refusal (after :meth:`discard`) when they are not the target's.
        """
        with io.BytesIO() as out:
            self._verified(target, out)
            return out.getvalue()

    def has(self, target: Want) -> bool:
        """True when ``target`` is on disk under its first hash name, re-hashed just now.

        False when it is absent; the typed refusal (after :meth:`discard`)
        when the bytes there are not the target's: DEST was altered.
        """
        try:
            self._verified(target)
        except FileNotFoundError:
            return False
        # An interrupted sync may have renamed the file but not linked its other hash names yet.
        path = self.path(target_names(target)[0])
        for other in target_names(target)[1:-1]:
            _link(path, self.path(other))
        return True

    def copy_verified(self, target: Want, dest: Path) -> None:
        """Copy ``target`` out of the tree to ``dest``, checking the very bytes copied.

        What is later read from ``dest`` (a private directory) is what was
        hashed, whatever happens to DEST meanwhile.  Raises
        ``FileNotFoundError`` or the typed refusal (after :meth:`discard`,
        with ``dest`` removed).
        """
        try:
            with open(dest, "xb") as out:
                self._verified(target, out)
        except BaseException:
            dest.unlink(missing_ok=True)
            raise

    def discard(self, target: Want) -> None:
        """Remove every name of ``target`` from the tree (its bytes there are not the target's)."""
        for name in target_names(target):
            self.path(name).unlink(missing_ok=True)

    def _verified(self, target: Want, copy_to: BinaryIO | None = None) -> None:
        try:
            verify_file(self.path(target_names(target)[0]), target, copy_to)
        except RepositoryError:
            self.discard(target)
            raise

    async def download(self, target: Want, fill: Callable[[FileSink], Awaitable[object]]) -> int:
        """Publish ``target`` from what ``fill`` (the one fetch-and-verify) streamed into a temp file.

        ``fill`` returns only once the bytes verified (else raises); bytes written.
        """
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp, suffix=".part")
        tmp = Path(tmp_name)
        try:
            sink = FileSink(fd)
            await fill(sink)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.chmod(tmp, 0o644)
            first, *others = target_names(target)[:-1]
            dest = self.path(first)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        for name in others:
            _link(dest, self.path(name))
        for directory in dict.fromkeys([dest.parent, *(self.path(n).parent for n in others)]):
            fsync_dir(directory)  # the renames and links survive a crash before the next timestamp
        return sink.size

    def link_plain(self, target: Want) -> None:
        """Give a verified target its plain name too (for plain HTTP clients and humans)."""
        _link(self.path(target_names(target)[0]), self.path(target.path))

    # -- metadata ------------------------------------------------------
    def publish_metadata(self, roots: Iterable[bytes], published: Mapping[str, int] | None = None) -> int:
        """Copy the sync client's trusted metadata into ``metadata/``, timestamp last.

        ``roots`` is the verified root chain, oldest first.  Delegated roles
        are published only at the version the trusted snapshot lists; one
        at the version ``published`` says the last sync published it at
        (role -> version) is not read again when its file is there.
        Returns the published snapshot version.
        """
        published = published or {}
        batch = Batch()
        chain = list(roots)
        for data in chain:
            version = Metadata.from_bytes(data).signed.version
            self._put(batch, f"{version}.root.json", data)
        timestamp = (self.trust_dir / "timestamp.json").read_bytes()
        snapshot = (self.trust_dir / "snapshot.json").read_bytes()
        snap = Metadata[Snapshot].from_bytes(snapshot).signed
        for name, meta in snap.meta.items():
            role = name[: -len(".json")]
            served = self.metadata_dir / f"{meta.version}.{quote(role, safe='')}.json"
            if published.get(role) == meta.version and served.exists():
                continue  # what the last sync published: a sync of a few projects reads a few roles, not thousands
            local = self.trust_dir / f"{quote(role, safe='')}.json"
            try:
                data = local.read_bytes()
            except FileNotFoundError:
                continue  # a role no lookup of this mirror needed
            if Metadata.from_bytes(data).signed.version == meta.version:
                self._put(batch, f"{meta.version}.{quote(role, safe='')}.json", data)
        self._put(batch, f"{snap.version}.snapshot.json", snapshot)
        # The commit point: from here on the tree serves the new snapshot; what it reaches is on disk before it is.
        batch.commit(self.metadata_dir / "timestamp.json", timestamp)
        atomic_write(self.metadata_dir / "root.json", chain[-1])
        return Metadata[Timestamp].from_bytes(timestamp).signed.snapshot_meta.version

    def _put(self, batch: Batch, name: str, data: bytes) -> None:
        path = self.metadata_dir / name
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == data:
                return
        batch.write(path, data)

    def published_root(self, version: int) -> bytes | None:
        with contextlib.suppress(FileNotFoundError):
            return (self.metadata_dir / f"{version}.root.json").read_bytes()
        return None



def _link(source: Path, name: Path) -> None:
    """Make ``name`` a hard link to ``source`` unless it already is one.

    Checked first because renaming a link over another link to the same
    inode is a no-op in POSIX, which would leave atomic_link's temp name behind.
    """
    with contextlib.suppress(FileNotFoundError):
        if os.path.samefile(source, name):
            return
    atomic_link(source, name)


def verify_root_chain(pinned: bytes, versions: Iterable[bytes]) -> list[bytes]:
    """Check each root is signed by a threshold of its predecessor's keys and its own (TUF 5.3.4).

    ``versions`` are roots ``pinned.version + 1`` onwards, in order.  Returns
    the whole chain including ``pinned``.
    """
    chain = [pinned]
    previous = _root(pinned)
    for data in versions:
        new = _root(data)
        if new.signed.version != previous.signed.version + 1:
            raise BadMetadata(f"root version {new.signed.version} follows {previous.signed.version}", role="root")
        try:
            previous.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
            new.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
        except tuf_exc.UnsignedMetadataError as e:
            raise BadSignature(f"root v{new.signed.version}: {e}", role="root") from e
        chain.append(data)
        previous = new
    return chain


def _root(data: bytes) -> Metadata[Root]:
    try:
        md = Metadata[Root].from_bytes(data)
    except Exception as e:  # tuf raises several types for malformed input
        raise BadMetadata(f"root: {e}", role="root") from e
    if md.signed.type != Root.type:
        raise BadMetadata("not a root", role="root")
    return md
