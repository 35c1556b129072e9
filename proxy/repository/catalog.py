"""Which projects a repository publishes, read from its own signed bins and kept current cheaply.

A layout that signs no root list (the gateway's) still needs to know its
projects: which are published (the refresher, the miss protocol), which
are private, what its own ``/simple/`` lists.  :class:`Catalog` reads
them from the page targets of the bins the current snapshot names, once,
then after each change only from the bins whose snapshot version moved:
a publish costs the bins it re-signed, not every project.  Another
process's publish (a worker, ``tufproxy gateway revoke``) is taken up the
same way.  These are the repository's own files, read under its name, not
verified: what edges trust they verify themselves.

Given a file (``persisted``: the gateway keeps it in ``run/catalog.json``),
a catalog also remembers across processes: :meth:`Catalog.save` writes what
each bin held at the version read, and a new process's first look takes a
bin from that file only if the snapshot names that exact version, reading
the others: a restart costs the bins signed since the file was written, not
every bin (4,096 files of ~27 KB at 100,000 projects).  The file is a cache:
one that is missing, damaged (its digest does not match), of another
repository (another root) or of an older format costs a full read, never a
wrong answer.  Writing it is O(projects), so its owner writes it seldom (the
publisher: after its first look, every few minutes while bins change, at a
clean stop); a crash only makes it older.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from proxy.protocol.access import marked_private
from proxy.protocol.profiles import Profile
from proxy.repository.signer import RepositoryError
from proxy.util.atomic import atomic_write

log = logging.getLogger(__name__)

FORMAT = 1  # of the persisted file: another value is read as no file

Bins = dict[str, tuple[int, dict[str, bool]]]  # role -> (version read, project -> private)


class Repository(Protocol):
    """What a catalog reads: the signer's :class:`~proxy.repository.signer.Repository`."""

    @property
    def profile(self) -> Profile: ...

    def metadata_json(self, role: str, version: int | None = None) -> dict[str, Any]: ...


def snapshot_version(repo: Repository) -> int:
    """The version of the snapshot ``repo``'s current timestamp names; RepositoryError if it names none."""
    version = repo.metadata_json("timestamp")["signed"]["meta"]["snapshot.json"]["version"]
    if not isinstance(version, int):
        raise RepositoryError("timestamp.json names no snapshot version")
    return version


def repository_identity(repo: Repository) -> str:
    """Which repository a file of ours describes: a digest of its first root (one initialised again has
    another); RepositoryError if that root cannot be read."""
    signed = repo.metadata_json("root", 1)["signed"]
    return hashlib.sha256(json.dumps(signed, sort_keys=True).encode()).hexdigest()


class Catalog:
    """The published projects of ``repo``, remembered in ``persisted`` if given: see the module docstring.
    Not thread-safe: one caller of :meth:`update` at a time; :meth:`save` may run beside it in another thread."""

    def __init__(self, repo: Repository, persisted: Path | None = None) -> None:
        self.repo = repo
        self.persisted = persisted
        self.projects: set[str] = set()  # every published project (a set the caller may read, never change)
        self.private: set[str] = set()  # those marked private
        # Replaced whole by update(), never changed in place: save() in another thread reads a consistent table.
        self._bins: Bins = {}
        self._snapshot: int | None = None
        # Projects in bins re-read since the caller last took them (see take_touched): whose pages may have
        # been replaced, the candidates of an incremental garbage collection.
        self._touched: set[str] = set()
        self._kept: Bins | None = None  # the persisted file's bins, until the first look has taken what it can
        self._identity: str | None = None  # which repository the persisted file must be of (its root)
        self._saved: Bins | None = None  # the table persisted last (or read from the file unchanged)

    def update(self) -> Catalog:
        """Take up what was signed since the last call (by anyone); cheap when nothing was.  RepositoryError
        (a file missing or damaged) leaves the catalog as it was: nothing is applied until every bin is read."""
        version = snapshot_version(self.repo)
        if version == self._snapshot:
            return self
        meta = self.repo.metadata_json("snapshot", version)["signed"]["meta"]
        first = self._snapshot is None
        if first and self.persisted is not None and self._kept is None:
            self._kept = self._load()
        kept = self._kept or {}
        skip = {"targets", self.repo.profile.bin_delegator}
        listed = {name.removesuffix(".json"): entry["version"] for name, entry in meta.items()}
        bins = dict(self._bins)
        new: list[dict[str, bool]] = []
        touched: set[str] = set()
        left: set[str] = set()
        came: set[str] = set()
        read = 0
        for role in [r for r in bins if r not in listed]:
            touched.update(bins[role][1])
            left.update(bins[role][1])
            del bins[role]
        for role, role_version in listed.items():
            if role in skip or bins.get(role, (None,))[0] == role_version:
                continue
            if role not in bins and kept.get(role, (None,))[0] == role_version:
                pages = kept[role][1]  # what this process would read: the file the snapshot names
            else:
                pages = self._read(role, role_version)
                read += 1
            if role in bins:  # a first look is no change: the caller collects everything once anyway
                touched.update(bins[role][1], pages)
                left.update(bins[role][1].keys() - pages.keys())
            came.update(pages)  # in place: `came |= pages.keys()` built a new set per bin, quadratic in a first look
            bins[role] = (role_version, pages)
            new.append(pages)
        for pages in new:
            for project, private in pages.items():
                self.projects.add(project)
                (self.private.add if private else self.private.discard)(project)
        # Gone only if no bin read now holds it: a re-bin moves every project out of its old bin and into a new
        # one, read in either order.  Added first, removed last: a reader in another thread never misses a
        # project that stays.
        for project in left - came:
            self.projects.discard(project)
            self.private.discard(project)
        self._touched.update(touched)
        if new or len(bins) != len(self._bins):
            self._bins = bins
        if first and self.persisted is not None:
            log.debug("catalog: %d bin(s) taken from %s, %d read", len(new) - read, self.persisted, read)
            if new and not read:
                self._saved = self._bins  # the file already says all of it
            self._kept = None
        self._snapshot = version
        return self

    def _read(self, role: str, version: int) -> dict[str, bool]:
        targets = self.repo.metadata_json(role, version)["signed"].get("targets", {})
        pages = {}
        for path, info in targets.items():
            project = self.repo.profile.page_project(path)
            if project is not None:
                pages[project] = marked_private(info) if isinstance(info, dict) else False
        return pages

    def take_touched(self) -> set[str]:
        """Projects whose bin was re-signed since the last call (removed ones included), forgotten here."""
        touched, self._touched = self._touched, set()
        return touched

    @property
    def public(self) -> list[str]:
        """The published projects not marked private, sorted (what a root page lists)."""
        return sorted(self.projects - self.private)

    @property
    def unsaved(self) -> bool:
        """Whether ``persisted`` lacks bins this catalog read since it last wrote the file (or took every bin from it)."""
        return self.persisted is not None and self._snapshot is not None and self._bins is not self._saved

    def save(self) -> bool:
        """Write what every bin held, at the version read, to ``persisted`` (O(projects)); whether it wrote.
        OSError if it cannot."""
        bins = self._bins  # one table: update() replaces it whole, so another thread may update() meanwhile
        if self.persisted is None or self._snapshot is None or bins is self._saved:
            return False
        identity = self._identity or self._root_identity()
        if identity is None:
            return False
        body = json.dumps({role: [version, [p for p, private in pages.items() if not private],
                                  [p for p, private in pages.items() if private]]
                           for role, (version, pages) in bins.items()}, separators=(",", ":")).encode()
        head = json.dumps({"format": FORMAT, "profile": self.repo.profile.name, "root": identity,
                           "sha256": hashlib.sha256(body).hexdigest()}).encode()
        atomic_write(self.persisted, head + b"\n" + body, durable=False)  # lost in a crash: only older
        self._saved = bins
        return True

    def _root_identity(self) -> str | None:
        """:func:`repository_identity`, read once; None (said) if it cannot be read."""
        try:
            self._identity = repository_identity(self.repo)
        except RepositoryError as e:
            log.info("catalog: not persisted (%s)", e)
            return None
        return self._identity

    def _load(self) -> Bins:
        """The persisted file's bins; {} (every bin read) when it is missing, damaged or of another repository."""
        assert self.persisted is not None
        try:
            data = self.persisted.read_bytes()
        except FileNotFoundError:
            log.debug("catalog: no %s yet: reading every bin", self.persisted)
            return {}
        except OSError as e:
            log.info("catalog: cannot read %s (%s): reading every bin", self.persisted, e.strerror)
            return {}
        head_line, _, body = data.partition(b"\n")
        try:
            head = json.loads(head_line)
            if not isinstance(head, dict) or head.get("format") != FORMAT or head.get("profile") != self.repo.profile.name:
                raise ValueError("another format or layout")
            identity = self._root_identity()
            if identity is None or head.get("root") != identity:
                raise ValueError("another repository's (its first root differs)")
            if head.get("sha256") != hashlib.sha256(body).hexdigest():
                raise ValueError("truncated or damaged: its digest does not match")
            kept: Bins = {}
            for role, (version, public, private) in json.loads(body).items():
                if type(version) is not int or not isinstance(public, list) or not isinstance(private, list):
                    raise ValueError(f"entry {role} malformed")
                pages = dict.fromkeys(public, False)
                pages.update(dict.fromkeys(private, True))
                kept[role] = (version, pages)
        except (ValueError, TypeError, AttributeError) as e:  # TypeError: an entry not of three; unhashable names
            log.info("catalog: %s not used (%s): reading every bin", self.persisted, e)
            return {}
        return kept
