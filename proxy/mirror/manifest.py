"""What the last ``mirror sync`` published into a tree, indexed on disk (``DEST/.mirror/manifest.sqlite``).

One row per target the tree holds: its path, its project, the role that
signed it (for a file vouched for by a signed page: that page's role), a
digest of its description (length and hashes, as signed or as the page
gives them) and whether it is itself signed (only those are compared
with the bins a later sync walks).  Beside them: each role's version in the snapshot the sync
published, the projects it could not complete (refused, failed or not
found: re-checked at every sync), and a head (snapshot, layout, the
selection asked for).

It is an index so that a sync of a few changed projects, or ``mirror
verify``, costs the same in a tree of 100,000 projects as in one of 1,000:
the next sync asks it which projects had a target signed by a role whose
version moved (an indexed query), what those targets were, and how many
rows the others hold, and replaces only the rows of the projects it
re-checked, in one transaction.  Nothing here is trusted for bytes: it
only says which projects may be left as they are (module docstring of
:mod:`proxy.mirror.tree`).  ``manifest.json`` beside it names the layout
for tools that only want that (``proxy.protocol.profiles.recorded_profile``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from proxy.protocol.layout import MIRROR_MANIFEST
from proxy.util.atomic import atomic_write

__all__ = ["Head", "Manifest", "Row", "digest", "hashes_of"]

_INDEX = "manifest.sqlite"
_CHUNK = 500  # names per IN (...) query: under SQLite's bound on parameters
_SCHEMA = """
CREATE TABLE IF NOT EXISTS head(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS roles(role TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS targets(path TEXT PRIMARY KEY, project TEXT NOT NULL, role TEXT NOT NULL,
                                   digest TEXT NOT NULL, signed INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS targets_by_role ON targets(role);
CREATE INDEX IF NOT EXISTS targets_by_project ON targets(project);
CREATE TABLE IF NOT EXISTS recheck(project TEXT PRIMARY KEY);
"""


def digest(length: int, hashes: Mapping[str, str]) -> str:
    """What identifies a target's description: equal digests, equal bytes."""
    return f"{length}:" + ",".join(f"{a}={h}" for a, h in sorted(hashes.items()))


def hashes_of(described: str) -> dict[str, str]:
    """The hashes a :func:`digest` names."""
    return dict(pair.split("=", 1) for pair in described.partition(":")[2].split(",") if "=" in pair)


@dataclass(frozen=True)
class Head:
    """The last sync's snapshot, layout and selection."""

    snapshot: int
    profile: str
    selection: str


@dataclass(frozen=True)
class Row:
    """One target the tree holds: ``project`` is "" for targets of no project (a root list, advisories);
    ``signed`` is False for a file vouched for by its page (the page's own row says when it changed)."""

    path: str
    project: str
    role: str
    digest: str
    signed: bool


class Manifest:
    """The index in ``state`` (a tree's ``.mirror`` directory); see the module docstring."""

    def __init__(self, state: Path) -> None:
        self.state = Path(state)
        self.path = self.state / _INDEX
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.state.mkdir(parents=True, exist_ok=True)
            # One user at a time (the sync, or a thread it hands the write to): not shared across threads at once.
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                db.executescript(_SCHEMA)
            except sqlite3.DatabaseError:
                db.close()
                self.path.unlink(missing_ok=True)  # not a manifest: the next sync re-checks everything anyway
                db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def head(self) -> Head | None:
        """The last sync's head, None when no sync completed (or the index is unreadable)."""
        if not self.path.exists():
            return None
        try:
            values = dict(self._conn().execute("SELECT key, value FROM head").fetchall())
            return Head(int(values["snapshot"]), values["profile"], values["selection"])
        except (sqlite3.DatabaseError, KeyError, ValueError):
            return None

    def roles(self) -> dict[str, int]:
        """Each role's version in the snapshot the last sync published."""
        return dict(self._conn().execute("SELECT role, version FROM roles").fetchall())

    def recheck(self) -> set[str]:
        """Projects the last sync could not complete."""
        return {p for (p,) in self._conn().execute("SELECT project FROM recheck")}

    def signed_by(self, roles: Collection[str]) -> list[Row]:
        """The rows of targets ``roles`` signed (or whose page they signed)."""
        return [Row(r[0], r[1], r[2], r[3], bool(r[4])) for chunk in _chunks(roles) for r in self._conn().execute(
            f"SELECT path, project, role, digest, signed FROM targets WHERE role IN ({_marks(chunk)})", chunk)]

    def known(self, projects: Collection[str]) -> set[str]:
        """Those of ``projects`` the tree holds rows for."""
        return {p for chunk in _chunks(projects) for (p,) in self._conn().execute(
            f"SELECT DISTINCT project FROM targets WHERE project IN ({_marks(chunk)})", chunk)}

    def totals(self, excluding: Collection[str] = ()) -> tuple[int, int]:
        """Projects and targets the tree holds, leaving out ``excluding`` (and targets of no project)."""
        db = self._conn()
        projects, targets = db.execute("SELECT COUNT(DISTINCT project), COUNT(*) FROM targets WHERE project != ''").fetchone()
        for chunk in _chunks(excluding):
            p, t = db.execute(f"SELECT COUNT(DISTINCT project), COUNT(*) FROM targets WHERE project != '' "
                              f"AND project IN ({_marks(chunk)})", chunk).fetchone()
            projects, targets = projects - p, targets - t
        return projects, targets

    def projects(self) -> list[str]:
        """Every project the tree holds, in order."""
        return [p for (p,) in self._conn().execute(
            "SELECT DISTINCT project FROM targets WHERE project != '' ORDER BY project")]

    def paths_of(self, projects: Collection[str]) -> dict[str, str]:
        """The targets of ``projects`` ("" for those of no project) the tree holds: path -> digest."""
        return {p: d for chunk in _chunks(projects) for p, d in self._conn().execute(
            f"SELECT path, digest FROM targets WHERE project IN ({_marks(chunk)})", chunk)}

    def by_role(self) -> Iterator[list[str]]:
        """Every target's path, the targets of one role together (in chunks of at most a few hundred)."""
        cursor = self._conn().execute("SELECT role, path FROM targets ORDER BY role, path")
        group: list[str] = []
        role = None
        while batch := cursor.fetchmany(_CHUNK):
            for r, path in batch:
                if group and (r != role or len(group) >= _CHUNK):
                    yield group
                    group = []
                role = r
                group.append(path)
        if group:
            yield group

    def record(self, head: Head, roles: Mapping[str, int], rows: Iterable[Row], *,
               replaced: Collection[str] | None, recheck: Collection[str]) -> None:
        """Publish what a sync left in the tree, in one transaction.

        ``replaced``: the projects whose rows ``rows`` replaces (targets of no
        project are always replaced); None replaces every row.
        """
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            if replaced is None:
                db.execute("DELETE FROM targets")
            else:
                db.execute("DELETE FROM targets WHERE project = ''")
                for chunk in _chunks(replaced):
                    db.execute(f"DELETE FROM targets WHERE project IN ({_marks(chunk)})", chunk)
            db.executemany("INSERT OR REPLACE INTO targets VALUES (?, ?, ?, ?, ?)",
                           ((r.path, r.project, r.role, r.digest, int(r.signed)) for r in rows))
            db.execute("DELETE FROM roles")
            db.executemany("INSERT INTO roles VALUES (?, ?)", roles.items())
            db.execute("DELETE FROM recheck")
            db.executemany("INSERT INTO recheck VALUES (?)", ((p,) for p in recheck))
            db.execute("DELETE FROM head")
            db.executemany("INSERT INTO head VALUES (?, ?)", [("snapshot", str(head.snapshot)), ("profile", head.profile),
                                                              ("selection", head.selection)])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        atomic_write(self.state / MIRROR_MANIFEST, json.dumps({"snapshot": head.snapshot, "profile": head.profile}).encode())

    def forget(self) -> None:
        """The tree is not what the index says: the next sync takes nothing from it."""
        self.close()
        for name in (_INDEX, f"{_INDEX}-journal", MIRROR_MANIFEST):
            with contextlib.suppress(FileNotFoundError):
                (self.state / name).unlink()


def _chunks(names: Collection[str]) -> Iterator[list[str]]:
    items = list(names)
    for at in range(0, len(items), _CHUNK):
        yield items[at:at + _CHUNK]


def _marks(chunk: list[str]) -> str:
    return ",".join("?" * len(chunk))
