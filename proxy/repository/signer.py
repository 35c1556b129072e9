"""A PEP 458 repository on disk: keys, signed metadata, targets, pages.

``Repository`` owns one directory::

    <dir>/repository.json   settings (bin count, thresholds, expiry)
    <dir>/keys/             private keys, mode 0600 (never served)
    <dir>/public/           the static tree any HTTP server can serve
        metadata/           1.root.json ... N.root.json, root.json,
                            timestamp.json, V.snapshot.json, V.targets.json,
                            V.bins.json, V.bin-XXXX.json
        simple/...          index pages (targets), also under HASH.index.html
        packages/...        distribution and .metadata files, also HASH.NAME

Roles follow PEP 458: root, targets and bins are offline, signed with their
own keys; timestamp, snapshot and every bin-n share one online key.
*targets* delegates everything to *bins*, which delegates by TAP 15
succinct hash delegation to ``bin-0000`` ... (``bins`` must be a power of
two; PEP 458's 16,384 is the default).

Every change is a transaction: inputs are checked first, new files are
written under names no client reads yet (content and versioned metadata),
and ``timestamp.json`` is replaced last, atomically: until then clients see
the previous state, and a failure leaves only unreferenced files behind.
Version numbers move only when a change lands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from securesystemslib.signer import Key, Signer
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    SuccinctRoles,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError
from tuf.api.serialization.json import JSONSerializer

from proxy.protocol import index
from proxy.protocol.access import PRIVATE_CUSTOM
from proxy.protocol.bins import bins_problem
from proxy.protocol.errors import Fault
from proxy.protocol.layout import (
    PageFormat,
    core_metadata_target,
    file_target,
    metadata_filename,
    page_file_href,
    project_of_filename,
    root_page_target,
)
from proxy.protocol.model import file_digest
from proxy.protocol.profiles import Profile, get_profile
from proxy.repository.distributions import Distribution, NotADistribution, inspect_distribution
from proxy.repository.keys import BINS, ONLINE, ROOT, TARGETS, KeyStore, KeyURIs, MissingKey
from proxy.repository.keysource import KeyUnavailable
from proxy.util.atomic import Batch, atomic_link, atomic_write, file_stamp, fsync_file
from proxy.util.journal import Journal
from proxy.util.progress import Meter

BINS_ROLE = "bins"
JOURNAL = "written.journal"  # see Repository.journal
_BIN_ROLE_RE = re.compile(r"bins?-[0-9a-f]+")
_SERIALIZER = JSONSerializer(compact=True)
# Roles a process keeps parsed between its commits (the snapshot, bins, the bin-n of its batches): see _take.
_PARSED = 256


class RepositoryError(Exception):
    """A signer operation was refused; the repository is left as it was."""

    reason = "signer-refused"
    fault = Fault.OPERATOR


class DuplicateFile(RepositoryError):
    """A file of that name is already a target, with other bytes."""


@dataclass(frozen=True)
class Expiry:
    """How long each role's metadata stays valid (PEP 458's recommendations)."""

    root: timedelta = timedelta(days=365)
    targets: timedelta = timedelta(days=365)
    bins: timedelta = timedelta(days=365)
    timestamp: timedelta = timedelta(days=1)
    snapshot: timedelta = timedelta(days=1)
    bin_n: timedelta = timedelta(days=1)

    def for_role(self, role: str) -> timedelta:
        if _is_bin(role):
            return self.bin_n
        return getattr(self, role)

    def to_json(self) -> dict[str, float]:
        return {k: v.total_seconds() for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, float]) -> Expiry:
        return cls(**{k: timedelta(seconds=v) for k, v in data.items()})


@dataclass(frozen=True)
class Settings:
    """What ``repository.json`` holds."""

    bins: int = 16384
    expiry: Expiry = field(default_factory=Expiry)
    layout: str = "tufproxy"
    # New versions are at least the signing time in Unix milliseconds: they keep increasing across a
    # restore from an older backup of the tree (what a long-running publisher like the gateway needs).
    clock_versions: bool = False

    @property
    def bit_length(self) -> int:
        return int(math.log2(self.bins))

    @property
    def profile(self) -> Profile:
        return get_profile(self.layout)


@dataclass
class ChangeReport:
    """What one operation did, for the CLI to print."""

    added: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    yanked: list[str] = field(default_factory=list)
    signed: dict[str, int] = field(default_factory=dict)  # role -> new version
    # Targets given new contents: path -> (the digest its consistent name carries, the role listing it).
    targets: dict[str, tuple[str, str]] = field(default_factory=dict)
    writing: float = 0.0  # seconds the commit took to write its files, fsyncs included


def _now(now: datetime | None) -> datetime:
    return (now or datetime.now(UTC)).replace(microsecond=0)


def _is_bin(role: str) -> bool:
    """A hash-bin role of either layout (``bin-0a1f``, ``bins-3``)."""
    return bool(_BIN_ROLE_RE.fullmatch(role.removesuffix(".json")))


class _Change:
    """One transaction: metadata edited in memory, files staged, then committed."""

    def __init__(self, repo: Repository, now: datetime, reuse: bool = False) -> None:
        self.repo = repo
        self.now = now
        # reuse: take the roles an earlier change of this process committed as parsed objects, not from
        # their files (see Repository._take); only a change that commits under the lock may.
        self._read = repo._take if reuse else repo._load
        self._reuse = reuse
        # Always read: the one role rewritten under the same name, where a file's stamp alone would have to tell.
        self.timestamp = repo._load("timestamp")
        self.snapshot = self._read("snapshot", self.timestamp.signed.snapshot_meta.version)
        self._roles: dict[str, Metadata] = {}
        self.dirty: set[str] = set()
        self.content: dict[str, bytes | Path] = {}  # target path -> bytes or a local file
        self.plain: dict[str, bytes | Path] = {}  # served path -> bytes or a local file, not a target
        self.unlink_plain: list[Path] = []  # plain names of targets this change unsigns, gone once it commits
        self.root_dirty = False
        self.online: Signer | None = None  # a new online key, published with this change
        self.signed_elsewhere: set[str] = set()  # roles (and root) signed by the ceremony: published as they are
        self._keys: dict[str, Signer] = {}  # each key read once per change (see _key)
        self.root: Metadata[Root] = repo._load("root", repo.root_version())
        self.report = ChangeReport()

    def role(self, name: str) -> Metadata:
        if name not in self._roles:
            meta = self.snapshot.signed.meta[f"{name}.json"]
            self._roles[name] = self._read(name, meta.version)
        return self._roles[name]

    def bin_for(self, target_path: str) -> str:
        delegations = self.role(self.repo.profile.bin_delegator).signed.delegations
        assert delegations is not None and delegations.succinct_roles is not None
        return delegations.succinct_roles.get_role_for_target(target_path)

    def get_target(self, target_path: str) -> TargetFile | None:
        return self.role(self.bin_for(target_path)).signed.targets.get(target_path)

    def put_target(self, target_path: str, data: bytes | Path, custom: dict[str, Any] | None = None) -> TargetFile:
        algorithms = list(self.repo.profile.hash_algorithms)
        if isinstance(data, Path):
            info = TargetFile.from_file(target_path, str(data), algorithms)
        else:
            info = TargetFile.from_data(target_path, data, algorithms)
        if custom:
            info.unrecognized_fields["custom"] = custom
        name = self.bin_for(target_path)
        if self.role(name).signed.targets.get(target_path) == info:
            return info  # the same bytes are signed already: nothing to re-sign
        self.role(name).signed.targets[target_path] = info
        self.dirty.add(name)
        self.content[target_path] = data
        self.report.targets[target_path] = (next(iter(info.hashes.values())), name)
        return info

    def delete_target(self, target_path: str) -> None:
        name = self.bin_for(target_path)
        if self.role(name).signed.targets.pop(target_path, None) is not None:
            self.dirty.add(name)
            self.content.pop(target_path, None)
            self.report.targets.pop(target_path, None)

    def target_bytes(self, target_path: str) -> bytes | None:
        """Current bytes of a target: staged in this change, or on disk."""
        staged = self.content.get(target_path)
        if isinstance(staged, bytes):
            return staged
        info = self.get_target(target_path)
        if info is None:
            return None
        return self.repo.served_path(target_path, next(iter(info.hashes.values()))).read_bytes()

    def _sign(self, role_name: str, md: Metadata) -> None:
        floor = int(time.time() * 1000) if self.repo.settings.clock_versions else 0
        md.signed.version = max(md.signed.version + 1, floor)
        md.signed.expires = self.now + self.repo.settings.expiry.for_role(role_name)
        md.signatures.clear()
        for signer in self.repo._signers_for(role_name, self.online, self._key):
            md.sign(signer, append=True)
        self.report.signed[role_name] = md.signed.version

    def _key(self, name: str) -> Signer:
        """The key ``name``, read once per change: a batch signs every bin it touches, the snapshot and the
        timestamp with the one online key, which is not read (and parsed) from its file again for each."""
        if name not in self._keys:
            self._keys[name] = self.repo.keys.load(name)
        return self._keys[name]

    def commit(self, flush_also: Iterable[Path] = ()) -> ChangeReport:
        """Sign everything that changed and publish it, timestamp last (``flush_also``: see publish_pages)."""
        repo = self.repo
        staged: list[tuple[Path, bytes]] = []
        if self.root_dirty:
            if "root" not in self.signed_elsewhere:
                self._sign_root()
            root_file = repo.metadata_dir / metadata_filename("root", self.root.signed.version)
            staged.append((root_file, self.root.to_bytes(_SERIALIZER)))
        # Delegated roles first (bin-n, then bins, then targets), so snapshot lists their new versions.
        for name in sorted(self.dirty, key=lambda r: (not _is_bin(r), r != BINS_ROLE, r)):
            md = self.role(name)
            if name not in self.signed_elsewhere:
                self._sign(name, md)
            data = md.to_bytes(_SERIALIZER)
            staged.append((repo.metadata_dir / metadata_filename(name, md.signed.version), data))
            self.snapshot.signed.meta[f"{name}.json"] = MetaFile(version=md.signed.version)
            if _is_bin(name):
                repo._bin_expiry[name] = (md.signed.version, md.signed.expires)
        self._sign("snapshot", self.snapshot)
        staged.append(
            (repo.metadata_dir / metadata_filename("snapshot", self.snapshot.signed.version), self.snapshot.to_bytes(_SERIALIZER))
        )
        self.timestamp.signed.snapshot_meta = MetaFile(version=self.snapshot.signed.version)
        self._sign("timestamp", self.timestamp)

        started = time.monotonic()
        plain_links: list[tuple[Path, Path]] = []
        batch = Batch()
        for plain, content in self.plain.items():
            _write(batch, repo.public_dir / plain, content)
        for target_path, file_bytes in self.content.items():
            info = self.get_target(target_path)
            assert info is not None
            digests = list(info.hashes.values())
            first = repo.served_path(target_path, digests[0])
            _write(batch, first, file_bytes)
            for digest in digests[1:]:
                atomic_link(first, repo.served_path(target_path, digest))
                batch.add(repo.served_path(target_path, digest))
            plain_links.append((first, repo.public_dir / repo.plain_name(target_path)))
        for metadata_file, signed in staged:
            batch.write(metadata_file, signed)
        # Convenience names for plain HTTP clients and for pinning; not trusted by TUF clients.  Linked before the
        # commit point: a reader who sees the new timestamp (the gateway deciding a project is published, and
        # serving its plain page) finds them; linked after, a page request in that window was a 404.  Undone if
        # the commit fails: they name the signed page to garbage collection and pin rebuilds too.
        before: list[tuple[Path, Path | None]] = []
        try:
            _link_plain(plain_links, before)
            for _, plain_name in plain_links:
                batch.add(plain_name)
            written = [*batch.paths, repo.metadata_dir / metadata_filename("timestamp", None)]
            for path in flush_also:  # durable with the tree's files; not the tree's, so not in the journal
                if path.exists():
                    batch.add(path)
            # The commit point: from here on clients see the new state.  Everything the new timestamp reaches is
            # on disk before it is (these files, not the machine's), and the journal is told before it is: a
            # copier that reads the timestamp and then the journal has its files.
            batch.commit(repo.metadata_dir / metadata_filename("timestamp", None), self.timestamp.to_bytes(_SERIALIZER),
                         before=lambda: repo.wrote(written))
        except BaseException:
            _unlink_plain(before, restore=True)
            raise
        _unlink_plain(before, restore=False)
        repo.unlink(self.unlink_plain)
        if self.root_dirty:  # the plain name of the newest root, for clients bootstrapping trust by hand
            atomic_write(repo.metadata_dir / "root.json", self.root.to_bytes(_SERIALIZER))
            repo.wrote([repo.metadata_dir / "root.json"])
        self.report.writing = time.monotonic() - started
        self.keep()  # each object is now what its file says
        return self.report

    def keep(self) -> None:
        """Leave the roles read, each as its file now says (committed, or never edited), for the next change
        of this process that reuses (see Repository._take): bin-n first and the snapshot last, so that the
        ones every batch reads are the last to go."""
        if self._reuse:
            for name, md in (*sorted(self._roles.items(), key=lambda role: not _is_bin(role[0])),
                             ("snapshot", self.snapshot)):
                self.repo._keep(name, md)

    def _sign_root(self) -> None:
        """Sign a new root with the old root's keys and its own (TUF spec 5.3.4)."""
        old = self.repo._load("root", self.repo.root_version())
        md = self.root
        md.signed.version += 1
        md.signed.expires = self.now + self.repo.settings.expiry.root
        md.signatures.clear()
        keyids = list(dict.fromkeys(old.signed.roles["root"].keyids + md.signed.roles["root"].keyids))
        signers = self.repo.keys.root_signers(keyids)
        for signer in signers:
            md.sign(signer, append=True)
        for delegator in (old.signed, md.signed):
            try:
                delegator.verify_delegate("root", md.signed_bytes, md.signatures)
            except Exception as e:  # tuf raises UnsignedMetadataError; say which keys are missing
                raise MissingKey(f"cannot reach the root threshold: {e}") from e
        self.report.signed["root"] = md.signed.version


def _link_plain(links: list[tuple[Path, Path]], kept: list[tuple[Path, Path | None]]) -> None:
    """Point each plain name at its new served file, first adding to ``kept`` what it named before (under a
    hidden name until :func:`_unlink_plain`), or None where it named nothing."""
    for served, plain in links:
        hidden = plain.with_name(f".{plain.name}.{os.getpid()}.before")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hidden)  # left by a process that died mid-commit
        try:
            os.link(plain, hidden)
        except FileNotFoundError:
            kept.append((plain, None))
        else:
            kept.append((plain, hidden))
        atomic_link(served, plain)


def _unlink_plain(kept: list[tuple[Path, Path | None]], restore: bool) -> None:
    """Drop what :func:`_link_plain` kept, or (``restore``) put it back: a commit that failed leaves the plain
    names as they were."""
    for plain, before in kept:
        with contextlib.suppress(FileNotFoundError):
            if before is not None:
                if restore:
                    os.replace(before, plain)
                else:
                    os.unlink(before)
            elif restore:
                os.unlink(plain)


def _flush_existing(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            fsync_file(path)


def _write(batch: Batch, dest: Path, data: bytes | Path) -> None:
    if isinstance(data, Path):
        _copy_file(data, dest)
        batch.add(dest)
    else:
        batch.write(dest, data)


def _copy_file(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(source, "rb") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class Repository:
    """A PEP 458 repository in a directory; see the module docstring."""

    def __init__(self, path: Path, settings: Settings) -> None:
        self.path = Path(path)
        self.settings = settings
        self.keys = KeyStore(self.path / "keys")
        self.profile = settings.profile
        self.public_dir = self.path / "public"
        self.metadata_dir = self.public_dir / self.profile.metadata_path
        # Bin-n -> (version, expiry) as last signed or read here; see _bin_due.
        self._bin_expiry: dict[str, tuple[int, datetime]] = {}
        # Role -> (its file's name and stamp, the object a commit wrote to that file): see _take.
        self._parsed: OrderedDict[str, tuple[str, tuple[int, int, int] | None, Metadata]] = OrderedDict()
        # Told the name of every file a commit writes under public/, while a gateway copies the tree to a
        # bucket (it creates the journal): whichever process signs, a revoke or an advisory import too.
        journal = self.path / JOURNAL
        self.journal: Journal | None = Journal(journal) if journal.exists() else None

        self._root_list_dropped = False  # see publish_pages

    def wrote(self, paths: Iterable[Path]) -> None:
        """Tell the journal (if any) that ``paths`` under the served tree were written."""
        if self.journal is not None:
            self.journal.wrote(p.relative_to(self.public_dir).as_posix() for p in paths)

    def removed(self, paths: Iterable[Path]) -> None:
        """Tell the journal (if any) that ``paths`` under the served tree were removed."""
        if self.journal is not None:
            self.journal.removed(p.relative_to(self.public_dir).as_posix() for p in paths)

    def unlink(self, paths: Iterable[Path]) -> int:
        """Remove ``paths`` from the served tree (absent ones are fine) and tell the journal; how many went."""
        gone = []
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                gone.append(path)
        self.removed(gone)
        return len(gone)

    def served_path(self, target_path: str, digest: str) -> Path:
        """Where the tree serves a target under one of its digests."""
        return self.public_dir / self.profile.served_name(target_path, digest)

    def plain_name(self, target_path: str) -> str:
        """The target's plain name, for clients that do not speak TUF (pip straight at the tree)."""
        if target_path.startswith(("simple/", "packages/")):
            return target_path
        return f"simple/{target_path}/index.html"  # a warehouse page target is the bare project name

    # -- opening -------------------------------------------------------
    @classmethod
    def init(
        cls,
        path: Path,
        *,
        bins: int = 16384,
        root_keys: int = 1,
        root_threshold: int = 1,
        expiry: Expiry | None = None,
        now: datetime | None = None,
        layout: str = "tufproxy",
        clock_versions: bool = False,
        key_uris: KeyURIs | None = None,
        meter: Meter | None = None,
    ) -> Repository:
        """Create keys and the first signed metadata (empty targets) in ``path``; ``meter`` counts the roles signed.

        ``layout`` is a :mod:`proxy.protocol.profiles` name: ``tufproxy`` or ``warehouse``.
        A role ``key_uris`` names keeps its key where the URI says (a token, a
        KMS): its public key goes into the metadata, no private key into ``path``.
        """
        uris = key_uris or KeyURIs()
        if uris.root:
            root_keys = len(uris.root)
        path = Path(path)
        problem = bins_problem(bins)
        if problem is not None:
            raise RepositoryError(problem)
        if not 1 <= root_threshold <= root_keys:
            raise RepositoryError(f"root threshold {root_threshold} needs 1..{root_keys} root keys")
        if (path / "repository.json").exists():
            raise RepositoryError(f"{path} already holds a repository")
        try:
            settings = Settings(bins=bins, expiry=expiry or Expiry(), layout=layout, clock_versions=clock_versions)
            profile = settings.profile
        except ValueError as e:
            raise RepositoryError(str(e)) from e
        repo = cls(path, settings)
        when = _now(now)
        repo.keys.create_dir()

        # Keys by URI first: a token or KMS that cannot sign stops init before any key file is written.
        named = {name: repo.keys.adopt(name, uri) for name, uri in
                 ((ONLINE, uris.online), (TARGETS, uris.targets), (BINS, uris.bins)) if uri is not None}
        roots = [repo.keys.adopt(ROOT, uri) for uri in uris.root]
        if len({s.public_key.keyid for s in roots}) != len(roots):
            raise RepositoryError("the same root key is given twice")
        roots = roots or [repo.keys.generate_root() for _ in range(root_keys)]
        targets_key = named.get(TARGETS) or repo.keys.generate(TARGETS)
        bins_key = named.get(BINS) or repo.keys.generate(BINS)
        online = named.get(ONLINE) or repo.keys.generate(ONLINE)

        root = Root(consistent_snapshot=True, expires=when + settings.expiry.root)
        for s in roots:
            root.add_key(s.public_key, "root")
        root.roles["root"].threshold = root_threshold
        root.add_key(targets_key.public_key, "targets")
        for role in ("snapshot", "timestamp"):
            root.add_key(online.public_key, role)

        succinct = SuccinctRoles([online.public_key.keyid], 1, settings.bit_length, profile.bin_prefix)
        to_bins = Delegations(keys={online.public_key.keyid: online.public_key}, succinct_roles=succinct)
        targets = Targets(expires=when + settings.expiry.targets)
        files: list[tuple[str, Metadata]] = [("root", Metadata(root)), ("targets", Metadata(targets))]
        if profile.bin_delegator == BINS_ROLE:
            targets.delegations = Delegations(
                keys={bins_key.public_key.keyid: bins_key.public_key},
                roles={BINS_ROLE: DelegatedRole(BINS_ROLE, [bins_key.public_key.keyid], 1, True,
                                                paths=list(profile.bin_paths))},
            )
            bins_md = Targets(expires=when + settings.expiry.bins)
            bins_md.delegations = to_bins
            files.append((BINS_ROLE, Metadata(bins_md)))
        else:
            targets.delegations = to_bins
        files += [(name, Metadata(Targets(expires=when + settings.expiry.bin_n))) for name in succinct.get_roles()]
        snapshot = Snapshot(expires=when + settings.expiry.snapshot)
        signers = {"root": roots, "targets": [targets_key], BINS_ROLE: [bins_key]}
        repo.metadata_dir.mkdir(parents=True, exist_ok=True)
        batch = Batch()
        if meter is not None:
            meter.retotal(len(files))
        for name, md in files:
            for s in signers.get(name, [online]):
                md.sign(s, append=True)
            if meter is not None:
                meter.advance()
            batch.write(repo.metadata_dir / metadata_filename(name, 1), md.to_bytes(_SERIALIZER))
            if name != "root":
                snapshot.meta[f"{name}.json"] = MetaFile(version=1)
        snap_md = Metadata(snapshot)
        snap_md.sign(online)
        batch.write(repo.metadata_dir / metadata_filename("snapshot", 1), snap_md.to_bytes(_SERIALIZER))
        batch.flush()
        ts = Metadata(Timestamp(expires=when + settings.expiry.timestamp, snapshot_meta=MetaFile(version=1)))
        ts.sign(online)
        atomic_write(repo.metadata_dir / "timestamp.json", ts.to_bytes(_SERIALIZER))
        atomic_write(repo.metadata_dir / "root.json", files[0][1].to_bytes(_SERIALIZER))
        # repository.json last: its presence means "a complete repository".
        atomic_write(
            path / "repository.json",
            json.dumps(
                {"bins": bins, "expiry": settings.expiry.to_json(), "layout": settings.layout, "clock_versions": clock_versions},
                indent=2,
            ).encode(),
        )
        if profile.root_list_signed:
            # An empty index, so pip pointed at a new repository sees no projects rather than 404.
            with repo._locked():
                change = _Change(repo, when)
                repo._write_root_list(change, [])
                change.commit()
        return repo

    @classmethod
    def open(cls, path: Path) -> Repository:
        """Open an existing repository, or raise :class:`RepositoryError`."""
        path = Path(path)
        try:
            raw = json.loads((path / "repository.json").read_bytes())
            settings = Settings(
                bins=int(raw["bins"]),
                expiry=Expiry.from_json(raw["expiry"]),
                layout=raw.get("layout", "tufproxy"),
                clock_versions=bool(raw.get("clock_versions", False)),
            )
        except FileNotFoundError:
            raise RepositoryError(f"{path} is not a repository (no repository.json; run 'tufproxy repo init {path}')") from None
        except (ValueError, KeyError, TypeError) as e:
            raise RepositoryError(f"{path}/repository.json is unreadable: {e}") from e
        return cls(path, settings)

    # -- reading -------------------------------------------------------
    def _load(self, role: str, version: int | None = None) -> Metadata:
        return self._parse(metadata_filename(role, None if role == "timestamp" else version))

    def _take(self, role: str, version: int) -> Metadata:
        """:meth:`_load` of a versioned role (never the timestamp), or the object :meth:`_keep` left if its
        file is still the one it was kept with (its name, and its stamp).

        Parsing the snapshot (every bin listed) and the bins again at each
        batch was 14 % of a one-page batch at 1,024 bins
        (``bench/publish_batch.py``).  Taken, not shared: the change that
        takes an object edits it, and only a commit puts it back.
        """
        name = metadata_filename(role, version)
        kept = self._parsed.pop(role, None)
        if kept is not None and kept[0] == name and kept[1] == file_stamp(self.metadata_dir / name):
            return kept[2]
        return self._parse(name)

    def _keep(self, role: str, md: Metadata) -> None:
        """Leave ``md``, just committed to its file, for the next change's :meth:`_take`: one object per
        role, at most :data:`_PARSED` roles, the least recently kept dropped first."""
        name = metadata_filename(role, md.signed.version)
        self._parsed[role] = (name, file_stamp(self.metadata_dir / name), md)
        self._parsed.move_to_end(role)
        while len(self._parsed) > _PARSED:
            self._parsed.popitem(last=False)

    def _parse(self, name: str) -> Metadata:
        path = self.metadata_dir / name
        try:
            return Metadata.from_bytes(path.read_bytes())
        except FileNotFoundError:
            raise RepositoryError(f"metadata file {name} is missing from {self.metadata_dir}") from None
        except DeserializationError as e:
            raise RepositoryError(f"metadata file {path} is damaged ({e}): restore it from a backup") from None

    def metadata_json(self, role: str, version: int | None = None) -> dict[str, Any]:
        """A role's metadata file as plain JSON, unverified (the signer's own files, read fast); RepositoryError
        naming a file that is missing or damaged."""
        path = self.metadata_dir / metadata_filename(role, None if role == "timestamp" else version)
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise RepositoryError(f"metadata file {path.name} is missing from {self.metadata_dir}") from None
        except (OSError, ValueError) as e:
            raise RepositoryError(f"metadata file {path} is damaged ({e}): restore it from a backup") from None
        if not isinstance(data, dict) or not isinstance(data.get("signed"), dict):
            raise RepositoryError(f"metadata file {path} is damaged (no signed part): restore it from a backup")
        return data

    def load_metadata(self, role: str, version: int | None = None) -> Metadata:
        """A role's current metadata (``version`` for versioned names); RepositoryError naming a file
        that is missing or damaged."""
        return self._load(role, version)

    def check(self) -> int:
        """Parse every metadata file the current timestamp reaches; how many.  RepositoryError
        names the first one missing or damaged."""
        timestamp = self._load("timestamp")
        snapshot = self._load("snapshot", timestamp.signed.snapshot_meta.version)
        self._load("root", self.root_version())
        for name, meta in snapshot.signed.meta.items():
            self._load(name.removesuffix(".json"), meta.version)
        return 3 + len(snapshot.signed.meta)

    def root_version(self) -> int:
        return self._parse("root.json").signed.version

    @staticmethod
    def _signers_for(role: str, online: Signer | None, load: Callable[[str], Signer]) -> list[Signer]:
        """Which keys sign ``role``: ``online`` (a new online key) or the key kept, read with ``load``."""
        if role in ("timestamp", "snapshot") or _is_bin(role):
            return [online or load(ONLINE)]
        if role in (TARGETS, BINS):
            return [load(role)]
        raise ValueError(role)

    def check_key(self, name: str) -> None:
        """``Keys.check`` under the writers' lock: a token is then used by one process at a time (SoftHSM2
        answers a generic error, or no token at all, to a process reading it while another logs in)."""
        with self._locked():
            self.keys.check(name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time (a cron refresh and an add may overlap)."""
        with open(self.path / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The lock every signing transaction holds (across processes): a garbage collector deleting a page
        under it cannot race a publish that is writing the same bytes back."""
        return self._locked()

    # -- pages ---------------------------------------------------------
    def _current_page(self, change: _Change, project: str) -> index.ProjectPage:
        fmt = self.profile.signed_formats[0]
        data = change.target_bytes(self.profile.page_target(project, fmt))
        if data is None:
            return index.ProjectPage(name=project, files=())
        if fmt is PageFormat.JSON:
            return index.parse_project_json(data, project)
        return index.parse_project_html(data, project)

    def _drop_unsigned_pages(self, change: _Change, project: str) -> None:
        """Unsign the pages of ``project`` in formats this layout no longer signs (an earlier release signed the
        gateway's HTML page too), and their plain names with the commit: re-signed or removed without them,
        they would go on listing what the page no longer does."""
        signed = {self.profile.page_target(project, fmt) for fmt in self.profile.signed_formats}
        for fmt in PageFormat:
            if (path := self.profile.page_target(project, fmt)) not in signed and change.get_target(path) is not None:
                change.delete_target(path)
                change.unlink_plain.append(self.public_dir / self.plain_name(path))

    def _write_page(self, change: _Change, page: index.ProjectPage, private: bool = False) -> None:
        first = self.profile.page_target(page.name, self.profile.signed_formats[0])
        known = change.get_target(first) is not None  # a new project has no page of an older format to drop
        for fmt in self.profile.signed_formats:
            render = index.render_project_json if fmt is PageFormat.JSON else index.render_project_html
            change.put_target(self.profile.page_target(page.name, fmt), render(page), PRIVATE_CUSTOM if private else None)
        if known and first in change.content:
            self._drop_unsigned_pages(change, page.name)

    def _write_root_list(self, change: _Change, projects: Iterable[str], private: Iterable[str] = ()) -> None:
        """The root list names public projects only; the private ones are in its target's signed ``custom``
        (so the signer and the gateway know what is published), which edges never serve."""
        hidden = sorted(set(private))
        plist = index.ProjectList(projects=tuple(sorted(set(projects) - set(hidden))))
        custom = {"tufproxy": {"private_projects": hidden}} if hidden else None
        change.put_target(root_page_target(PageFormat.HTML), index.render_project_list_html(plist), custom)
        change.put_target(root_page_target(PageFormat.JSON), index.render_project_list_json(plist), custom)

    def _drop_root_list(self, change: _Change) -> None:
        """Unsign the root list a gateway signed before its layout stopped signing one (one bin looked at)."""
        for fmt in PageFormat:
            change.delete_target(root_page_target(fmt))

    def _projects(self, change: _Change) -> list[str]:
        """Every published project, public and private."""
        return [*self._public_projects(change), *self._private_projects(change)]

    def _public_projects(self, change: _Change) -> list[str]:
        if not self.profile.root_list_signed:
            return []
        data = change.target_bytes(root_page_target(PageFormat.JSON))
        return list(index.parse_project_list_json(data).projects) if data else []

    def _private_projects(self, change: _Change) -> list[str]:
        if not self.profile.root_list_signed:
            return []
        info = change.get_target(root_page_target(PageFormat.JSON))
        custom = info.unrecognized_fields.get("custom") if info is not None else None
        mark = custom.get("tufproxy") if isinstance(custom, dict) else None
        names = mark.get("private_projects") if isinstance(mark, dict) else None
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def _put_file(self, change: _Change, target_path: str, data: bytes | Path) -> tuple[int, str]:
        """A distribution or .metadata file: a target, or (warehouse) a plain file; (length, sha256)."""
        if self.profile.files_are_targets:
            info = change.put_target(target_path, data)
            return info.length, info.hashes["sha256"]
        change.plain[target_path] = data
        if isinstance(data, Path):
            return data.stat().st_size, file_digest("sha256", data)
        return len(data), hashlib.sha256(data).hexdigest()

    def _existing_sha256(self, change: _Change, target_path: str) -> str | None:
        if self.profile.files_are_targets:
            info = change.get_target(target_path)
            return None if info is None else info.hashes["sha256"]
        plain = self.public_dir / target_path
        return file_digest("sha256", plain) if plain.is_file() else None

    # -- operations ----------------------------------------------------
    def add(self, files: Sequence[Path], now: datetime | None = None) -> ChangeReport:
        """Add distributions; re-sign their bins, pages, snapshot and timestamp."""
        try:
            dists = [inspect_distribution(Path(f)) for f in files]
        except NotADistribution as e:
            raise RepositoryError(str(e)) from e
        names = [d.filename for d in dists]
        if len(set(names)) != len(names):
            raise RepositoryError("the same file name is given twice")
        when = _now(now)
        with self._locked():
            change = _Change(self, when)
            by_project: dict[str, list[Distribution]] = {}
            for dist in dists:
                existing = self._existing_sha256(change, file_target(dist.project, dist.filename))
                if existing is not None:
                    if existing != file_digest("sha256", dist.path):
                        raise DuplicateFile(f"{dist.filename} is already in the repository with other contents")
                    change.report.unchanged.append(dist.filename)
                    continue
                by_project.setdefault(dist.project, []).append(dist)
            if not by_project:
                return change.report
            for project, new in by_project.items():
                page = self._current_page(change, project)
                entries = list(page.files)
                versions = list(page.versions)
                for dist in new:
                    length, sha256 = self._put_file(change, file_target(project, dist.filename), dist.path)
                    core: dict[str, str] | bool = False
                    if dist.core_metadata is not None:
                        _, meta_sha256 = self._put_file(change, core_metadata_target(project, dist.filename), dist.core_metadata)
                        core = {"sha256": meta_sha256}
                    entries.append(
                        index.DistFile(
                            filename=dist.filename,
                            url=page_file_href(project, dist.filename),
                            hashes={"sha256": sha256},
                            requires_python=dist.requires_python,
                            core_metadata=core,
                            size=length,
                            upload_time=when.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
                        )
                    )
                    if dist.version not in versions:
                        versions.append(dist.version)
                    change.report.added.append(dist.filename)
                entries.sort(key=lambda f: f.filename)
                self._write_page(change, index.ProjectPage(name=project, files=tuple(entries), versions=tuple(versions)))
            known = self._projects(change)
            if self.profile.root_list_signed and set(by_project) - set(known):
                self._write_root_list(change, known + list(by_project))
            return change.commit()

    def current_page(self, project: str) -> index.ProjectPage | None:
        """The signed page of ``project`` (normalised name) as the current timestamp reaches it, or None."""
        change = _Change(self, _now(None))
        if change.get_target(self.profile.page_target(project, self.profile.signed_formats[0])) is None:
            return None
        return self._current_page(change, project)

    def signed_targets(self, target_paths: Iterable[str]) -> dict[str, TargetFile]:
        """The signed entry of each of ``target_paths`` that the current timestamp reaches (absent ones left out)."""
        change = _Change(self, _now(None))
        return {path: info for path in target_paths if (info := change.get_target(path)) is not None}

    def publish_pages(self, pages: Mapping[str, index.ProjectPage | None], now: datetime | None = None,
                      private: Callable[[str], bool] | None = None,
                      targets: Mapping[str, tuple[bytes, dict[str, Any]]] | None = None,
                      flush_also: Iterable[Path] = ()) -> ChangeReport:
        """Set (a page) or remove (None) whole project pages in one transaction: one snapshot, one timestamp.

        For a layout whose files are not targets (the gateway's): the page's
        hashes are what vouch for its files, and the caller stores the files.
        Keys are normalised project names; the root list follows.  ``targets``
        are other targets signed in the same transaction, each with its
        ``custom`` field (a file's PEP 740 provenance object).  ``flush_also``:
        files outside the tree made durable with the transaction's, before its
        commit point (the gateway's ledger, whose pins the pages rely on), and
        fsynced before it returns when it signs nothing.
        """
        if self.profile.files_are_targets:
            raise RepositoryError(f"the {self.profile.name} layout signs files as targets: publish them with add()")
        when = _now(now)
        with self._locked():
            change = _Change(self, when, reuse=True)
            listed = self.profile.root_list_signed
            # Only a root list knows every project at once; without one, each project's own page target says.
            known = set(self._projects(change)) if listed else {
                p for p in pages if change.get_target(self.profile.page_target(p, self.profile.signed_formats[0]))}
            # A root list signed by an earlier release is unsigned at this process's first publish, then not
            # looked for again (its bin is read once, not at every publish).
            drop = not listed and not self._root_list_dropped
            if drop:
                self._drop_root_list(change)
            for path, (data, custom) in (targets or {}).items():
                change.put_target(path, data, custom)
            hidden = set(self._private_projects(change))
            hidden_before = set(hidden)
            for project, page in pages.items():
                if page is None:
                    for fmt in self.profile.signed_formats:
                        change.delete_target(self.profile.page_target(project, fmt))
                    hidden.discard(project)
                    if project in known:
                        self._drop_unsigned_pages(change, project)
                        known.discard(project)
                        change.report.removed.append(project)
                    continue
                if page.name != project:
                    raise RepositoryError(f"page for {page.name!r} given as {project!r}")
                is_private = private is not None and private(project)
                (hidden.add if is_private else hidden.discard)(project)
                self._write_page(change, page, is_private)
                signed = self.profile.page_target(project, self.profile.signed_formats[0]) in change.content
                # "added": the page is signed anew (a new project or a changed page); "unchanged": the same bytes.
                (change.report.added if signed else change.report.unchanged).append(project)
                known.add(project)
            if listed and (known != set(self._projects(change)) or hidden != hidden_before):
                self._write_root_list(change, known, hidden)
            if not change.dirty:
                change.keep()  # nothing edited
                self._root_list_dropped |= drop
                _flush_existing(flush_also)  # durable when this returns, whether it signed or not
                return change.report
            report = change.commit(flush_also)
            # Plain names follow the signed state (pip straight at the tree); a dropped root list's go too.
            gone = [self.public_dir / self.plain_name(self.profile.page_target(project, fmt))
                    for project in report.removed for fmt in self.profile.signed_formats]
            gone += [self.public_dir / root_page_target(fmt) for fmt in PageFormat] if drop else []
            self.unlink(gone)
            self._root_list_dropped |= drop
            return report

    def publish_target(self, target_path: str, data: bytes, now: datetime | None = None) -> ChangeReport:
        """Sign ``data`` as the target ``target_path`` (one snapshot and timestamp; nothing if it is signed already)."""
        with self._locked():
            change = _Change(self, _now(now))
            change.put_target(target_path, data)
            return change.commit() if change.dirty else change.report

    def remove(
        self, filename: str, *, delete: bool = False, reason: str | None = None, now: datetime | None = None
    ) -> ChangeReport:
        """Yank a file (PEP 592: stays installable when pinned) or delete it outright."""
        when = _now(now)
        with self._locked():
            change = _Change(self, when)
            project = project_of_filename(filename)
            if project is not None:
                page = self._current_page(change, project)
                if not any(f.filename == filename for f in page.files):
                    project = None
            if project is not None:
                if delete:
                    rest = tuple(f for f in page.files if f.filename != filename)
                    if self.profile.files_are_targets:
                        change.delete_target(file_target(project, filename))
                        change.delete_target(core_metadata_target(project, filename))
                    change.report.removed.append(filename)
                else:
                    rest = tuple(
                        f if f.filename != filename else dataclasses.replace(f, yanked=reason or True) for f in page.files
                    )
                    change.report.yanked.append(filename)
                self._write_page(change, index.ProjectPage(name=page.name, files=rest, versions=page.versions))
                return change.commit()
            raise RepositoryError(f"{filename} is not in the repository")

    def refresh(self, now: datetime | None = None, force: bool = False) -> ChangeReport:
        """Re-sign roles that pass half their lifetime (all online ones with ``force``).

        Offline roles (targets, bins) are re-signed too when due and their
        keys are present here (``force`` does not touch them); root is never
        re-signed implicitly: use ``rotate_root``.
        """
        when = _now(now)
        with self._locked():
            change = _Change(self, when)

            def due(role: str, md: Metadata, forced: bool = force) -> bool:
                return forced or md.signed.expires - when < self.settings.expiry.for_role(role) / 2

            for role in dict.fromkeys((TARGETS, self.profile.bin_delegator)):
                if due(role, change.role(role), forced=False):
                    try:
                        self.keys.load(role)
                    except (MissingKey, KeyUnavailable):  # kept offline (a file moved away, a token unplugged)
                        continue
                    change.dirty.add(role)
            for name in _bin_names(change):
                if force or self._bin_due(change, name):
                    change.dirty.add(name)
            if not change.dirty and not due("snapshot", change.snapshot) and not due("timestamp", change.timestamp):
                return change.report
            return change.commit()

    def _bin_due(self, change: _Change, name: str) -> bool:
        """Whether bin ``name`` as ``change``'s snapshot lists it is past half its lifetime.  Its expiry is
        remembered from its signing or an earlier look while the snapshot names the same version (a refresh
        then reads only the bins it re-signs)."""
        version = change.snapshot.signed.meta[f"{name}.json"].version
        kept = self._bin_expiry.get(name)
        loaded = None
        if kept is None or kept[0] != version:
            loaded = change._roles.get(name) or self._load(name, version)
            kept = self._bin_expiry[name] = (loaded.signed.version, loaded.signed.expires)
        due = kept[1] - change.now < self.settings.expiry.bin_n / 2
        if due and loaded is not None:
            # Kept in the change only when due (it is re-signed): a first refresh looks at every bin, and holding
            # 4,096 parsed bins of 100,000 projects at once took 200 MB, a peak the process keeps.
            change._roles.setdefault(name, loaded)
        return due

    def rotate_root(
        self,
        *,
        new_keys: int | None = None,
        threshold: int | None = None,
        rotate_online: bool = False,
        now: datetime | None = None,
    ) -> ChangeReport:
        """Publish root N+1, signed by a threshold of root N's keys and its own."""
        when = _now(now)
        with self._locked():
            change = _Change(self, when)
            root = change.root.signed
            old_root_keyids = list(root.roles["root"].keyids)
            if new_keys is not None:
                if new_keys < 1:
                    raise RepositoryError("a root needs at least one key")
                for _ in range(new_keys):
                    root.add_key(self.keys.generate_root().public_key, "root")
                for keyid in old_root_keyids:
                    root.revoke_key(keyid, "root")
            count = len(root.roles["root"].keyids)
            if threshold is not None:
                if not 1 <= threshold <= count:
                    raise RepositoryError(f"threshold {threshold} needs 1..{count} root keys")
                root.roles["root"].threshold = threshold
            if rotate_online:
                self._rotate_online(change)
            change.root_dirty = True
            report = change.commit()
            if rotate_online:
                self.keys.promote(ONLINE)
            if new_keys is not None:
                for keyid in old_root_keyids:
                    self.keys.retire_root(keyid)
            return report

    def publish_signed(self, root: Metadata[Root], offline: Mapping[str, Metadata], keys: Mapping[str, tuple[str, Key]],
                       now: datetime | None = None) -> ChangeReport:
        """Publish what the root ceremony signed (:mod:`proxy.repository.ceremony`): root N+1, new targets/bins
        versions as they are, then snapshot and timestamp, and every bin-n again when the online key changed.

        ``keys`` are the roles whose key changed to a URI (role -> URI, public key), recorded under the lock:
        the new online key signs this change and every later one.
        """
        when = _now(now)
        with self._locked():
            change = _Change(self, when)
            if root.signed.version != change.root.signed.version + 1:
                raise RepositoryError(f"the draft is root v{root.signed.version}; the repository is at root "
                                      f"v{change.root.signed.version}: draft again")
            for name, md in offline.items():
                current = change.role(name).signed.version
                if md.signed.version <= current:
                    raise RepositoryError(f"the draft's {name} v{md.signed.version} is not newer than v{current}: draft again")
            # Only the online key must sign here and now; a new targets or bins key is offline, only recorded.
            signers = {role: self.keys.open(uri, public) for role, (uri, public) in keys.items() if role == ONLINE}
            change.root, change.root_dirty = root, True
            change.signed_elsewhere = {"root", *offline}
            for name, md in offline.items():
                change._roles[name] = md
                change.dirty.add(name)
            if ONLINE in signers:
                change.online = signers[ONLINE]
                change.dirty.update(_bin_names(change))
            report = change.commit()
            report.signed["root"] = root.signed.version
            for name, md in offline.items():
                report.signed[name] = md.signed.version
            for role, (uri, public) in keys.items():
                self.keys.record(role, uri, public)
            return report

    def rebin(self, bins: int, now: datetime | None = None) -> ChangeReport:
        """Grow the bin count to ``bins``: the delegator (``bins``, or ``targets`` for the warehouse layout)
        is re-signed with its offline key, delegating to ``bins`` succinct roles, and every target moves to
        the bin its hash names now, in one transaction (one snapshot, one timestamp).

        Clients that trust the old metadata follow it as any update: every bin-n is signed above the
        version they hold.  A TUF client refuses a snapshot that drops a role it has seen, so old names the
        new count no longer delegates (when the names get longer: 4,096 to 8,192 bins) stay listed in the
        snapshot, signed once more with no targets, and are never re-signed again; no client looks them up.
        """
        problem = bins_problem(bins)
        if problem is not None:
            raise RepositoryError(problem)
        if bins <= self.settings.bins:
            raise RepositoryError(f"--bins {bins} does not grow the repository's {self.settings.bins} bins: "
                                  "a bin count only grows")
        when = _now(now)
        with self._locked():
            change = _Change(self, when)
            delegator = change.role(self.profile.bin_delegator)
            self.keys.load(self.profile.bin_delegator)  # the offline key must be here: say so before any work
            assert delegator.signed.delegations is not None and delegator.signed.delegations.succinct_roles is not None
            old = delegator.signed.delegations.succinct_roles
            moving: dict[str, TargetFile] = {}
            for name in old.get_roles():
                moving.update(change.role(name).signed.targets)
            new = SuccinctRoles(old.keyids, old.threshold, int(math.log2(bins)), old.name_prefix)
            delegator.signed.delegations.succinct_roles = new
            change.dirty.add(self.profile.bin_delegator)
            # Old names the new count no longer delegates are signed once more, empty: nothing stale stays
            # reachable from the snapshot.
            for name in dict.fromkeys([*old.get_roles(), *new.get_roles()]):
                if f"{name}.json" in change.snapshot.signed.meta:
                    change.role(name).signed.targets = {}
                else:
                    change._roles[name] = Metadata(Targets(expires=when))
                change.dirty.add(name)
            for path, info in moving.items():
                change.role(new.get_role_for_target(path)).signed.targets[path] = info
            report = change.commit()
            self.settings = dataclasses.replace(self.settings, bins=bins)
            raw = json.loads((self.path / "repository.json").read_bytes())
            atomic_write(self.path / "repository.json", json.dumps(raw | {"bins": bins}, indent=2).encode())
            return report

    def _rotate_online(self, change: _Change) -> None:
        """New online key: root lists it for timestamp/snapshot, bins for every bin-n."""
        old = self.keys.load(ONLINE)
        new = change.online = self.keys.stage(ONLINE)
        root = change.root.signed
        for role in ("timestamp", "snapshot"):
            root.revoke_key(old.public_key.keyid, role)
            root.add_key(new.public_key, role)
        delegator = self.profile.bin_delegator
        bins = change.role(delegator).signed
        assert bins.delegations is not None and bins.delegations.succinct_roles is not None
        bins.delegations.keys = {new.public_key.keyid: new.public_key}
        bins.delegations.succinct_roles.keyids = [new.public_key.keyid]
        change.dirty.add(delegator)
        change.dirty.update(_bin_names(change))

    def status(self, now: datetime | None = None) -> dict[str, Any]:
        """Versions and expiries of every top-level role, bin expiry range, counts."""
        when = _now(now)
        change = _Change(self, when)
        roles: dict[str, object] = {}
        for name, md in (
            ("root", change.root),
            ("timestamp", change.timestamp),
            ("snapshot", change.snapshot),
            *((name, change.role(name)) for name in dict.fromkeys((TARGETS, self.profile.bin_delegator))),
        ):
            roles[name] = {
                "version": md.signed.version,
                "expires": md.signed.expires.isoformat(),
                "expired": md.signed.is_expired(when),
            }
        # The delegated bins only: names an earlier bin count left in the snapshot (rebin) are not counted.
        bin_versions = {name: change.snapshot.signed.meta[f"{name}.json"].version for name in _bin_names(change)}
        targets = projects = 0
        earliest: datetime | None = None
        for name, version in bin_versions.items():
            md = self._load(name, version)
            targets += len(md.signed.targets)
            projects += sum(self.profile.page_project(path) is not None for path in md.signed.targets)
            earliest = md.signed.expires if earliest is None else min(earliest, md.signed.expires)
        return {
            "path": str(self.path),
            "served_tree": str(self.public_dir),
            "roles": roles,
            "bins": {"count": len(bin_versions), "earliest_expiry": earliest.isoformat() if earliest else None},
            "targets": targets,
            "projects": projects,
            "layout": self.profile.name,
        }


def _bin_names(change: _Change) -> Iterator[str]:
    delegations = change.role(change.repo.profile.bin_delegator).signed.delegations
    assert delegations is not None and delegations.succinct_roles is not None
    return delegations.succinct_roles.get_roles()
