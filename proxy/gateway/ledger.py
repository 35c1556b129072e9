"""The gateway's memory: an append-only ledger of what it pinned and revoked, indexed on disk.

``DIR/gateway/ledger.jsonl`` holds one JSON object per line, appended
(``O_APPEND``, fsynced: a page's pins with the signing batch that publishes
it, before its commit point) and never rewritten:

* ``{"kind": "project", "project", "index"}``: the index a project was first
  published from; later refreshes ask that index only.
* ``{"kind": "pin", "project", "filename", "hashes", "size", "core_metadata",
  "index", "url"}``: a file as first published.  An index never lets a
  filename change contents, so a later listing with other hashes or size
  is left out, and the pin stays.
* ``{"kind": "revoke", "project", "filename" (or null: the whole project)}``.
* ``{"kind": "publisher", "project", "spec", "filename", "accepted"}``: the
  project's PEP 740 trusted publisher, pinned at its first verified file,
  accepted by the operator, or (``"rebuilt": true``) read back from the
  signed provenance targets after the ledger lost it; the latest record wins
  (:mod:`proxy.gateway.provenance`).
* ``{"kind": "provenance", "project", "filename", "publisher", "sha256", "url"}``:
  a file's verified publisher and the sha256 of its provenance object.
* ``{"kind": "seen", "project", "filename", "counts_from"}``: a file listed
  for the first time (hidden by the policy or not), and the time its
  release cooldown counts from (null: the index's claim alone), fixed then.

The file is the record; ``ledger.sqlite`` beside it is an index of what
it says, so that a gateway holding 100,000 projects neither keeps every
pin in memory (it took 474 MB as decoded JSON) nor reads the whole file at
each start: a process reads only the lines appended since the index last
took some in, and looks records up by project.  The index says which file
it was built from (device, inode) and what it had read (the offset, and
digests of the first and last 4 KiB before it).  A file found shorter
than that, replaced, or with other bytes there is the record no more
described: at a process's start the index is built again from the file's
first line (:attr:`Ledger.reindexed`, which tells ``gateway serve`` to
cross-check the signed pages); a running process reads the whole file
again and keeps what it knew.  Deleting ``ledger.sqlite`` is always safe.
Several processes (workers, ``tufproxy gateway revoke`` beside a running
gateway) share the index: each takes in new lines in one write
transaction, so no line is applied twice.

The index also keys each record by what it says without its time
(:func:`record_key`), with where its line is and whether a replica group
holds it: a replica sends its group what it appended since (:meth:`Ledger.unshared`)
and takes in what the group's log adds (:meth:`Ledger.take`) without
holding either ledger in memory (:mod:`proxy.gateway.shared`).

Readers pick up lines other processes appended with :meth:`Ledger.reload`.
A torn last line (a crash mid-append) is ignored and completed by the next
append.  A line that is not a record is counted and named in a warning,
never skipped in silence.  The signed pages are a second record of every
pin: a pin they list and the ledger lacks is rebuilt from them
(:meth:`Ledger.missing_pins`) with no index URL, which the next listing of
the same contents fills in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.protocol import index

log = logging.getLogger(__name__)
# Junk lines named in one warning (the count is always given).
_NAMED_JUNK = 5
INDEX = "ledger.sqlite"
# Bytes read at once when taking lines in: a re-index of a large ledger stays within this.
_CHUNK = 8 << 20
# Bytes at each end of what was read whose digests tell the same file from a rewritten one.
_EDGE = 4096
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS projects(project TEXT PRIMARY KEY, idx TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pins(project TEXT NOT NULL, filename TEXT NOT NULL, hashes TEXT NOT NULL, size INTEGER,
                                idx TEXT NOT NULL, url TEXT NOT NULL, core TEXT, time TEXT NOT NULL,
                                PRIMARY KEY(project, filename)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seen(project TEXT NOT NULL, filename TEXT NOT NULL, counts_from TEXT,
                                PRIMARY KEY(project, filename)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS revoked(project TEXT NOT NULL, filename TEXT NOT NULL,
                                   PRIMARY KEY(project, filename)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS publishers(project TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS provenance(project TEXT NOT NULL, filename TEXT NOT NULL, record TEXT NOT NULL,
                                      PRIMARY KEY(project, filename)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records(key BLOB PRIMARY KEY, offset INTEGER NOT NULL, length INTEGER NOT NULL,
                                   shared INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS unshared ON records(offset) WHERE shared = 0;
CREATE TABLE IF NOT EXISTS sync(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_TABLES = ("projects", "pins", "seen", "revoked", "publishers", "provenance", "records", "sync")
# The index's layout: an index written by an older one is built again (quietly: the file lost nothing).
_LAYOUT = "2"
_WHOLE = ""  # the filename of a revocation of a whole project (filenames are never empty)


@dataclass(frozen=True)
class Pin:
    """A file as the gateway first published it."""

    project: str
    filename: str
    hashes: dict[str, str]
    size: int | None
    index: str
    url: str
    core_metadata: dict[str, str] | None = None
    time: str = field(default="", compare=False)

    def differs_from(self, hashes: dict[str, str], size: int | None) -> bool:
        """True when a listing names this file with other contents (hashes both sides give, or size)."""
        common = set(self.hashes) & set(hashes)
        if any(self.hashes[a] != hashes[a] for a in common):
            return True
        return self.size is not None and size is not None and self.size != size


@dataclass(frozen=True)
class Project:
    """What the ledger holds on one project, read in one go (rendering a page looks at each of its files)."""

    pins: dict[str, Pin]
    seen: dict[str, datetime | None]
    provenance: frozenset[str]  # files with a verified publisher
    listed: bool  # listed by this gateway before (a project record or a file seen)


@dataclass
class _Position:
    """What the index had read of the file: where to go on from, and what tells that file from another."""

    offset: int = 0
    lines: int = 0
    junk: int = 0
    identity: tuple[int, int] | None = None
    head: str = ""
    tail: str = ""
    layout: str = _LAYOUT

    @classmethod
    def of(cls, values: dict[str, str]) -> _Position:
        identity = (int(values["device"]), int(values["inode"])) if "inode" in values else None
        return cls(int(values.get("offset", 0)), int(values.get("lines", 0)), int(values.get("junk", 0)),
                   identity, values.get("head", ""), values.get("tail", ""), values.get("layout", "1"))

    def values(self) -> dict[str, str]:
        out = {"offset": str(self.offset), "lines": str(self.lines), "junk": str(self.junk),
               "head": self.head, "tail": self.tail, "layout": self.layout}
        if self.identity is not None:
            out |= {"device": str(self.identity[0]), "inode": str(self.identity[1])}
        return out


class Ledger:
    """The ledger file and its index; see the module docstring.  Thread-safe."""

    def __init__(self, directory: Path, quiet_start: bool = False) -> None:
        """``quiet_start``: junk in the file as it is now was reported already (by ``gateway serve``'s start-up check)."""
        self.path = Path(directory) / "ledger.jsonl"
        self.index_path = Path(directory) / INDEX
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._connect()
        # (identity, size) of the file when last taken in whole: nothing to do while it stays so.
        self._seen_size: tuple[tuple[int, int] | None, int] | None = None
        self.revoked: frozenset[tuple[str, str | None]] = frozenset()
        self.pins = _Pins(self)
        self.reindexed = False  # this process built the index from the file's start (it may have lost records)
        self.lines_read = 0  # lines this object took in (others' were taken in by them)
        self._quiet = quiet_start
        self._take_in(starting=True)
        self._quiet = False

    def _connect(self) -> sqlite3.Connection:
        for attempt in (1, 2):
            # As private as the file it indexes (SQLite gives its -wal and -shm files the database's mode).
            os.close(os.open(self.index_path, os.O_WRONLY | os.O_CREAT, 0o640))
            db = sqlite3.connect(self.index_path, isolation_level=None, check_same_thread=False, timeout=60)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                # The file is the durable record (fsynced before anything relies on its lines); the index can lose
                # its last transactions and catch up, or outlive lines a power loss took from the file, which the
                # next start finds (the file is not the one it read) and indexes again from the first line.
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                return db
            except sqlite3.DatabaseError as e:
                db.close()
                if attempt == 2:
                    raise
                log.warning("ledger index %s is unreadable (%s): building it again from %s", self.index_path, e,
                            self.path)
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{self.index_path}{suffix}").unlink(missing_ok=True)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction of the index (the caller holds ``_lock``): other processes wait for it."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- taking lines in -----------------------------------------------------------------------

    def reload(self) -> bool:
        """Take in lines appended since the index last did (by any process; all of a truncated or replaced
        file); True if this call applied any."""
        return self._take_in(starting=False)

    def _take_in(self, starting: bool) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below, after the transaction
        except FileNotFoundError:
            f = None
        with self._lock:
            try:
                st = os.fstat(f.fileno()) if f is not None else None
                identity = (st.st_dev, st.st_ino) if st is not None else None
                if not starting and self._seen_size == (identity, st.st_size if st is not None else 0):
                    return False  # nothing appended: the common case, on every file request
                with self._transaction():
                    applied = self._take_in_locked(f, identity, st.st_size if st is not None else 0, starting)
                self.revoked = frozenset((p, f or None) for p, f in self._db.execute("SELECT project, filename "
                                                                                      "FROM revoked"))
                return applied
            finally:
                if f is not None:
                    f.close()

    def _take_in_locked(self, f: Any, identity: tuple[int, int] | None, size: int, starting: bool) -> bool:
        at = _Position.of(dict(self._db.execute("SELECT key, value FROM meta").fetchall()))
        if f is None:
            if starting:  # the record is gone (or not written yet): so is what the index said of it
                self._clear()
                self.reindexed = True
            elif at.identity is not None:
                log.warning("ledger %s was removed since it was read: what was read stays known", self.path)
            self._put(_Position())
            self._seen_size = (None, 0)
            return False
        same = (at.identity == identity and size >= at.offset
                and (at.offset == 0 or (at.head, at.tail) == _edges(f, at.offset)))
        if starting and same and at.layout != _LAYOUT:
            log.info("ledger index %s was written by an older tufproxy: indexing %s again", self.index_path, self.path)
            self._clear()
            at = _Position()
        elif at.identity is None or not same:
            if starting:
                if at.identity is not None:
                    log.info("ledger %s is not the file its index %s describes (replaced, truncated or rewritten): "
                             "indexing it again from its first line", self.path, self.index_path)
                self._clear()
                at = _Position()
            elif at.identity is not None:
                how = ("replaced" if identity != at.identity else f"truncated to {size} bytes" if size < at.offset
                       else "rewritten")
                log.warning("ledger %s was %s since it was read: reading all of it again", self.path, how)
                at = _Position()
            self.reindexed = self.reindexed or starting
        elif starting and at.junk and not self._quiet:
            log.warning("ledger %s: %d line(s) are not records and were skipped (named when first read)",
                        self.path, at.junk)
        at.identity = identity
        applied = self._read_from(f, at, size)
        at.head, at.tail = _edges(f, at.offset)
        self._put(at)
        self._seen_size = (identity, at.offset) if at.offset == size else None
        return applied

    def _read_from(self, f: Any, at: _Position, size: int) -> bool:
        """Apply the whole lines after ``at.offset`` (of ``size`` bytes known), moving ``at`` past them."""
        junk: list[tuple[int, bytes]] = []
        applied = False
        f.seek(at.offset)
        rest = b""
        # Sized reads: a read of _CHUNK allocates that much even at the end of the file.
        while chunk := f.read(max(0, min(_CHUNK, size - f.tell()))):
            data = rest + chunk
            end = data.rfind(b"\n") + 1
            rest = data[end:]
            start = 0
            while start < end:
                stop = data.index(b"\n", start)
                line = data[start:stop]
                at.lines += 1
                self.lines_read += 1
                try:
                    record = json.loads(line)
                    self._apply(record)
                    # Where the record is (a re-read moves it), for what a replica group has yet to share.
                    self._db.execute("INSERT INTO records VALUES (?, ?, ?, 0) ON CONFLICT(key) DO UPDATE "
                                     "SET offset = excluded.offset, length = excluded.length",
                                     (record_key(record), at.offset + start, stop - start))
                    applied = True
                except (ValueError, KeyError, TypeError, AttributeError):
                    if line.strip():
                        junk.append((at.lines, line[:40]))
                start = stop + 1
            at.offset += end
        at.junk += len(junk)
        if junk and not self._quiet:
            named = ", ".join(f"line {n} ({text!r})" for n, text in junk[:_NAMED_JUNK])
            more = f" and {len(junk) - _NAMED_JUNK} more" if len(junk) > _NAMED_JUNK else ""
            log.warning("ledger %s: %d line(s) are not records and were skipped: %s%s",
                        self.path, len(junk), named, more)
        return applied

    def _clear(self) -> None:
        for table in _TABLES:
            self._db.execute(f"DELETE FROM {table}")

    def _put(self, at: _Position) -> None:
        self._db.execute("DELETE FROM meta")
        self._db.executemany("INSERT INTO meta VALUES (?, ?)", at.values().items())

    def _apply(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        db = self._db
        if kind == "pin":
            project, filename = str(record["project"]), str(record["filename"])
            hashes, size = dict(record["hashes"]), record.get("size")
            url = record.get("url") or ""
            core = record.get("core_metadata")
            row = (project, filename, json.dumps(hashes, sort_keys=True), size if isinstance(size, int) else None,
                   record.get("index") or "", url, json.dumps(dict(core), sort_keys=True) if core else None,
                   record.get("time") or "")
            if db.execute("INSERT OR IGNORE INTO pins VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row).rowcount == 0 and url:
                # A pin rebuilt from the signed pages learns its index URL from a listing of the same contents.
                known = self._pin(project, filename)
                if known is not None and not known.url and not known.differs_from(hashes, size):
                    db.execute("UPDATE pins SET url = ?, idx = ? WHERE project = ? AND filename = ?",
                               (url, row[4], project, filename))
        elif kind == "project":
            db.execute("INSERT OR IGNORE INTO projects VALUES (?, ?)", (str(record["project"]), str(record["index"])))
        elif kind == "revoke":
            db.execute("INSERT OR IGNORE INTO revoked VALUES (?, ?)",
                       (str(record["project"]), str(record.get("filename") or _WHOLE)))
        elif kind == "publisher":
            db.execute("INSERT OR REPLACE INTO publishers VALUES (?, ?)", (str(record["project"]), json.dumps(record)))
        elif kind == "provenance":
            db.execute("INSERT OR REPLACE INTO provenance VALUES (?, ?, ?)",
                       (str(record["project"]), str(record["filename"]), json.dumps(record)))
        elif kind == "seen":
            when = record.get("counts_from")
            if when:
                datetime.fromisoformat(when)  # a line that is not a record is junk, never a failure later
            db.execute("INSERT OR IGNORE INTO seen VALUES (?, ?, ?)",
                       (str(record["project"]), str(record["filename"]), when or None))
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    # -- appending -----------------------------------------------------------------------------

    def append(self, records: list[dict[str, Any]], durable: bool = True) -> None:
        """Append records, then take them in; durably, unless a commit point that flushes this file
        (:attr:`path`) comes before anything relies on them: the pins of a page, flushed with the batch that signs
        it (:class:`~proxy.gateway.publisher.Publisher`'s ``flush_also``)."""
        if not records:
            return
        now = datetime.now(UTC).isoformat(timespec="seconds")
        lines = b"".join(json.dumps({"time": now, **r}, sort_keys=True).encode() + b"\n" for r in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            # After a torn line, start on a fresh one so this record parses.
            if os.fstat(fd).st_size and _last_byte(self.path) != b"\n":
                lines = b"\n" + lines
            os.write(fd, lines)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        self.reload()

    def pin_records(self, pins: list[Pin]) -> list[dict[str, Any]]:
        return [{"kind": "pin", **{k: v for k, v in asdict(p).items() if k != "time"}} for p in pins
                if (known := self.pins.get((p.project, p.filename))) is None or not known.url]

    def seen_records(self, project: str, first_seen: dict[str, datetime | None]) -> list[dict[str, Any]]:
        known = self.project(project).seen if first_seen else {}
        return [{"kind": "seen", "project": project, "filename": f, "counts_from": w.isoformat() if w else None}
                for f, w in first_seen.items() if f not in known]

    # -- sharing with a replica group ----------------------------------------------------------

    def lacking(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ``records`` this ledger lacks (compared without their time), in their order, each once."""
        return self._lacking([(record_key(r), r) for r in records])

    def _lacking(self, keyed: list[tuple[bytes, dict[str, Any]]]) -> list[dict[str, Any]]:
        self.reload()
        taken: list[dict[str, Any]] = []
        seen: set[bytes] = set()
        with self._lock:
            for key, record in keyed:
                if key not in seen and self._db.execute("SELECT 1 FROM records WHERE key = ?", (key,)).fetchone() is None:
                    taken.append(record)
                seen.add(key)
        return taken

    def take(self, records: list[dict[str, Any]], shared: bool, position: dict[str, Any] | None = None) -> int:
        """Append the ``records`` this ledger lacks; how many.  ``shared``: they are the group's (read from
        the bucket), noted so with ``position``, the group's log as read up to them, in one transaction."""
        keyed = [(record_key(r), r) for r in records]
        new = self._lacking(keyed)
        self.append(new)
        if shared:
            self.mark_shared([key for key, _ in keyed], position)
        return len(new)

    def unshared(self, limit: int) -> list[tuple[bytes, bytes]]:
        """(key, line) of the records not yet noted as the group's, in the file's order, about ``limit``
        bytes of them at most (always one if there is one)."""
        self.reload()
        with self._lock:
            found: list[tuple[bytes, bytes]] = []
            stale: list[bytes] = []
            size = 0
            try:
                f = open(self.path, "rb")  # noqa: SIM115 - closed below
            except FileNotFoundError:
                return []
            with f:
                for key, offset, length in self._unshared_rows():
                    if found and size + length > limit:
                        break
                    f.seek(offset)
                    line = f.read(length)
                    try:
                        same = record_key(json.loads(line)) == key
                    except (ValueError, AttributeError):
                        same = False
                    if same:
                        found.append((key, line))
                        size += length + 1
                    else:
                        stale.append(key)
            if stale:
                # Records the index knew from a file replaced since: not in this one to share.  Forgotten, so
                # the group's copy, if any, is appended again at the next pull.
                log.warning("ledger %s: %d record(s) its index knew are no longer in it", self.path, len(stale))
                with self._transaction():
                    self._db.executemany("DELETE FROM records WHERE key = ?", [(k,) for k in stale])
        return found

    def _unshared_rows(self) -> Iterator[tuple[bytes, int, int]]:
        after = -1
        while rows := self._db.execute("SELECT key, offset, length FROM records WHERE shared = 0 AND offset > ? "
                                       "ORDER BY offset LIMIT 500", (after,)).fetchall():
            yield from rows
            after = rows[-1][1]

    def mark_shared(self, keys: list[bytes], position: dict[str, Any] | None = None) -> None:
        """Note ``keys`` as records the group holds (and ``position``: how far its log was read)."""
        with self._lock, self._transaction():
            self._db.executemany("UPDATE records SET shared = 1 WHERE key = ?", [(k,) for k in keys])
            if position is not None:
                self._db.execute("INSERT OR REPLACE INTO sync VALUES ('group', ?)", (json.dumps(position),))

    def group_position(self) -> dict[str, Any]:
        """How far this replica read its group's log (kept with the index: a rebuilt index reads it again)."""
        rows = self._query("SELECT value FROM sync WHERE key = 'group'")
        return json.loads(rows[0][0]) if rows else {}

    # -- looking up ----------------------------------------------------------------------------

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _pin(self, project: str, filename: str) -> Pin | None:
        row = self._db.execute("SELECT * FROM pins WHERE project = ? AND filename = ?", (project, filename)).fetchone()
        return _pin_of(row) if row is not None else None

    def project(self, project: str) -> Project:
        """Everything recorded on ``project``."""
        with self._lock:
            db = self._db
            pins = {r[1]: _pin_of(r) for r in db.execute("SELECT * FROM pins WHERE project = ?", (project,))}
            seen = {f: datetime.fromisoformat(w) if w else None
                    for f, w in db.execute("SELECT filename, counts_from FROM seen WHERE project = ?", (project,))}
            provenance = frozenset(f for (f,) in db.execute("SELECT filename FROM provenance WHERE project = ?",
                                                            (project,)))
            listed = bool(seen) or db.execute("SELECT 1 FROM projects WHERE project = ?", (project,)).fetchone() is not None
        return Project(pins, seen, provenance, listed)

    def index_of(self, project: str) -> str | None:
        """The index ``project`` was first published from (None: never published)."""
        rows = self._query("SELECT idx FROM projects WHERE project = ?", (project,))
        return rows[0][0] if rows else None

    def publisher(self, project: str) -> dict[str, Any] | None:
        """The latest publisher record of ``project``."""
        rows = self._query("SELECT record FROM publishers WHERE project = ?", (project,))
        return json.loads(rows[0][0]) if rows else None

    def publishers(self) -> list[dict[str, Any]]:
        """The latest publisher record of every project that has one, by project."""
        return [json.loads(r) for (r,) in self._query("SELECT record FROM publishers ORDER BY project")]

    def missing_pins(self, project: str, signed: index.ProjectPage) -> list[Pin]:
        """Pins of the files ``signed`` (the project's signed page) lists that the ledger lacks, rebuilt from it."""
        known = self.project(project).pins if signed.files else {}
        origin = self.index_of(project) or "" if signed.files else ""
        return [Pin(project, f.filename, dict(f.hashes), f.size, origin, "",
                    dict(f.core_metadata) if isinstance(f.core_metadata, dict) else None)
                for f in signed.files if f.filename not in known]

    def is_revoked(self, project: str, filename: str | None = None) -> bool:
        return (project, None) in self.revoked or (filename is not None and (project, filename) in self.revoked)

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every project record, pin, first sight and revocation, for ``tufproxy gateway ledger``."""
        for p, i in self._query("SELECT project, idx FROM projects ORDER BY project"):
            yield {"kind": "project", "project": p, "index": i}
        for _, pin in self.pins.items():
            yield {"kind": "pin", **asdict(pin)}
        for p, f, w in self._query("SELECT project, filename, counts_from FROM seen ORDER BY project, filename"):
            yield {"kind": "seen", "project": p, "filename": f, "counts_from": w}
        for p, f in sorted(self.revoked, key=str):
            yield {"kind": "revoke", "project": p, "filename": f}


class _Pins:
    """``ledger.pins``: the pins, looked up by (project, filename) in the index."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def get(self, key: tuple[str, str]) -> Pin | None:
        with self._ledger._lock:
            return self._ledger._pin(*key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.get((str(key[0]), str(key[1]))) is not None

    def items(self) -> Iterator[tuple[tuple[str, str], Pin]]:
        """Every pin, by project and filename (read in pages: a gateway holds hundreds of thousands)."""
        after = ("", "")
        while rows := self._ledger._query("SELECT * FROM pins WHERE (project, filename) > (?, ?) "
                                          "ORDER BY project, filename LIMIT 1000", after):
            for row in rows:
                yield (row[0], row[1]), _pin_of(row)
            after = (rows[-1][0], rows[-1][1])


def record_key(record: dict[str, Any]) -> bytes:
    """What identifies a record whatever its time: the same fact written by two replicas is one record."""
    return hashlib.sha256(json.dumps({k: v for k, v in record.items() if k != "time"}, sort_keys=True).encode()).digest()


def _pin_of(row: tuple[Any, ...]) -> Pin:
    project, filename, hashes, size, origin, url, core, time = row
    return Pin(project, filename, json.loads(hashes), size, origin, url, json.loads(core) if core else None, time)


def _edges(f: Any, end: int) -> tuple[str, str]:
    """Digests of the first and of the last ``_EDGE`` bytes before ``end``."""
    f.seek(0)
    head = f.read(min(end, _EDGE))
    f.seek(max(0, end - _EDGE))
    tail = f.read(min(end, _EDGE))
    return hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest()


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)
