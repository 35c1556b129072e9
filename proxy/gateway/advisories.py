"""The gateway's advisory store: OSV records imported into ``DIR/gateway/advisories.json``, and kept current.

Owns reading OSV records from files, directories and ``all.zip``-style zips
(streamed member by member: a zip of any size imports in bounded memory),
merging them into the store (newest ``modified`` per id, see
:class:`~proxy.protocol.osv.AdvisorySet`), and :class:`AdvisoryWatch`,
through which a running gateway sees an import at once and learns which
projects' blocks it changes.  The store holds only the compact PyPI part
of each record, written atomically; parsing and matching are
:mod:`proxy.protocol.osv`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.protocol.errors import Fault
from proxy.protocol.osv import ADVISORY_TARGET, Advisory, AdvisorySet, RecordError, parse_record, read_store
from proxy.repository import Repository
from proxy.util.atomic import atomic_write
from proxy.util.progress import Meter

log = logging.getLogger(__name__)
STORE_NAME = "advisories.json"
MAX_RECORD_SIZE = 8 * 1024 * 1024  # OSV's largest PyPI records are tens of kB
MAX_NAMED_SKIPS = 20  # a warning names this many skipped records, then counts


class SourceError(Exception):
    """A source that cannot be read at all (a missing file, a corrupt zip); one line for people."""

    reason = "bad-advisory-source"
    fault = Fault.OPERATOR


def store_path(gateway_dir: Path) -> Path:
    return Path(gateway_dir) / STORE_NAME


@dataclass
class ImportReport:
    read: int = 0
    pypi: int = 0
    kept: int = 0  # new ids, or newer records of held ids
    skipped: list[str] = field(default_factory=list)

    def warning(self) -> str | None:
        if not self.skipped:
            return None
        named = "; ".join(self.skipped[:MAX_NAMED_SKIPS])
        more = f" and {len(self.skipped) - MAX_NAMED_SKIPS} more" if len(self.skipped) > MAX_NAMED_SKIPS else ""
        return f"skipped {len(self.skipped)} malformed record(s): {named}{more}"


def _records(paths: Iterable[Path]) -> Iterator[tuple[str, bytes | str]]:
    """(name, JSON bytes) per record, or (name, why it cannot be read); never more than one record in memory."""
    for path in paths:
        path = Path(path)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and (child.suffix == ".json" or zipfile.is_zipfile(child)):
                    yield from _records([child])
        elif path.is_file() and zipfile.is_zipfile(path):
            try:
                with zipfile.ZipFile(path) as zf:
                    for info in zf.infolist():
                        if info.is_dir() or not info.filename.endswith(".json"):
                            continue
                        name = f"{path.name}:{info.filename}"
                        if info.file_size > MAX_RECORD_SIZE:
                            yield name, f"larger than {MAX_RECORD_SIZE} bytes"
                            continue
                        with zf.open(info) as member:
                            data = member.read(MAX_RECORD_SIZE + 1)
                        yield (name, data) if len(data) <= MAX_RECORD_SIZE else (name, "larger than it says")
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise SourceError(f"{path}: not a readable zip ({e})") from None
        elif path.is_file():
            if path.stat().st_size > MAX_RECORD_SIZE:
                yield str(path), f"larger than {MAX_RECORD_SIZE} bytes"
                continue
            yield str(path), path.read_bytes()
        else:
            raise SourceError(f"{path}: no such file or directory")


def parse_sources(paths: Iterable[Path], report: ImportReport, meter: Meter | None = None) -> Iterator[Advisory]:
    """The PyPI advisories in ``paths``; malformed records are counted and named in ``report``."""
    for name, data in _records(paths):
        report.read += 1
        if meter is not None:
            meter.advance()
        if isinstance(data, str):
            report.skipped.append(f"{name} ({data})")
            continue
        try:
            adv = parse_record(json.loads(data))
        except (ValueError, RecursionError) as e:  # RecordError and JSONDecodeError are ValueErrors
            report.skipped.append(f"{name} ({str(e)[:120]})")
            continue
        if adv is not None:
            report.pypi += 1
            yield adv


@dataclass
class Store:
    """The loaded store: the set, and what ``gateway advisories DIR`` reports of it."""

    advisories: AdvisorySet
    imported: str | None = None
    sources: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        kinds = Counter[str]()
        for adv in self.advisories.by_id.values():
            kinds["withdrawn" if adv.withdrawn else "malicious" if adv.malicious else "vulnerability"] += 1
            kinds[f"prefix {adv.id.split('-', 1)[0]}"] += 1
        return dict(sorted(kinds.items()))

    def newest_modified(self) -> str | None:
        return max((a.modified for a in self.advisories.by_id.values()), default=None)

    def to_json(self) -> dict[str, Any]:
        return {"imported": self.imported, "sources": self.sources[-20:],
                "records": [a.to_json() for a in sorted(self.advisories.by_id.values(), key=lambda a: a.id)]}


def load(path: Path) -> Store:
    """The store at ``path``; an empty one if there is none yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Store(AdvisorySet())
    return parse_store(raw)


def parse_store(raw: bytes) -> Store:
    """A store's bytes as a :class:`Store` (ValueError if they are not one)."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("not an advisory store")
    return Store(read_store(data), data.get("imported"), list(data.get("sources", [])))


@contextlib.contextmanager
def _store_locked(path: Path) -> Iterator[None]:
    """One writer of the store at a time (an import, a feed refresh, a replica's merge)."""
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def merge_into(path: Path, other: Store) -> int:
    """Take ``other``'s advisories into the store at ``path`` (a newer ``modified`` wins); how many changed."""
    with _store_locked(path):
        store = load(path)
        kept = store.advisories.add(other.advisories.by_id.values())
        if kept:
            store.imported = max(filter(None, (store.imported, other.imported)), default=None)
            store.sources += [s for s in other.sources if s not in store.sources]
            write(path, store)
    return kept


def sign_store(repo: Repository, path: Path) -> None:
    """Sign the store as the repository's advisory target (mirror sync carries it across air gaps)."""
    repo.publish_target(ADVISORY_TARGET, path.read_bytes())


def import_into(path: Path, sources: Iterable[Path], label: str | None = None,
                meter: Meter | None = None) -> tuple[Store, ImportReport]:
    """Merge the records of ``sources`` into the store at ``path`` and write it (once, atomically);
    ``meter`` counts the records read."""
    sources = list(sources)
    # One import at a time (the CLI beside a feed refresh): each reads what the other wrote.
    with _store_locked(path):
        store = load(path)
        report = ImportReport()
        report.kept = store.advisories.add(parse_sources(sources, report, meter))
        store.imported = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        store.sources.append(label or ", ".join(str(s) for s in sources)[:500])
        write(path, store)
    return store, report


def write(path: Path, store: Store) -> None:
    atomic_write(path, json.dumps(store.to_json(), separators=(",", ":")).encode())


def _fingerprint(adv: Advisory) -> tuple[str, bool]:
    return adv.modified, adv.withdrawn


class AdvisoryWatch:
    """The store as a running gateway sees it: reloaded when the file changes (a cheap stat per check)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self.store = Store(AdvisorySet())
        self.check()

    @property
    def advisories(self) -> AdvisorySet:
        return self.store.advisories

    def check(self) -> set[str]:
        """Reload if the store changed; the projects whose advisories changed (empty if none did)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return set()
        try:
            fresh = load(self.path)
        except (OSError, ValueError, RecordError) as e:
            log.error("advisory store %s is unreadable, keeping the loaded one: %s", self.path, e)
            return set()
        self._stamp = stamp
        before, self.store = self.store.advisories.by_id, fresh
        after = fresh.advisories.by_id
        changed: set[str] = set()
        for ident in before.keys() | after.keys():
            old, new = before.get(ident), after.get(ident)
            if old is None or new is None or _fingerprint(old) != _fingerprint(new) or old.affected != new.affected:
                for adv in (old, new):
                    changed.update(a.project for a in (adv.affected if adv else ()))
        return changed
