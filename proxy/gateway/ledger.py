"""The gateway's memory: an append-only ledger of what it pinned and revoked.

``DIR/gateway/ledger.jsonl`` holds one JSON object per line, appended
(``O_APPEND``, fsynced) and never rewritten:

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

Readers pick up lines other processes appended (``tufproxy gateway
revoke`` beside a running gateway) with :meth:`Ledger.reload`.  A torn
last line (a crash mid-append) is ignored and completed by the next append.
A file found shorter than what was read, or replaced (another inode), is
read again from its start (what was read before stays known).  A line
that is not a record is counted and named in a warning, never skipped in
silence.  The signed pages are a second record of every pin: a pin they
list and the ledger lacks is rebuilt from them (:meth:`Ledger.missing_pins`)
with no index URL, which the next listing of the same contents fills in.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dataclass_replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.protocol import index

log = logging.getLogger(__name__)
# Junk lines named in one warning (the count is always given).
_NAMED_JUNK = 5


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


class Ledger:
    """The ledger file and its in-memory view."""

    def __init__(self, directory: Path, quiet_start: bool = False) -> None:
        """``quiet_start``: junk in the file as it is now was reported already (by ``gateway serve``'s start-up check)."""
        self.path = Path(directory) / "ledger.jsonl"
        self.pins: dict[tuple[str, str], Pin] = {}
        self.project_index: dict[str, str] = {}
        self.revoked: set[tuple[str, str | None]] = set()
        self.publishers: dict[str, dict[str, Any]] = {}
        self.provenance: dict[tuple[str, str], dict[str, Any]] = {}
        self.seen: dict[tuple[str, str], datetime | None] = {}
        self._listed: set[str] = set()  # projects with a file seen
        self._offset = 0
        self._lines = 0  # lines read so far (junk is named by its line number)
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file read
        self.junk = 0  # lines that were not records
        self.rereads = 0  # times the file was found truncated or replaced and read again
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._quiet = quiet_start
        self.reload()
        self._quiet = False

    def reload(self) -> bool:
        """Read lines appended since the last read (all of a truncated or replaced file); True if there were any."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    st = os.fstat(f.fileno())
                    identity = (st.st_dev, st.st_ino)
                    if self._identity is not None and (identity != self._identity or st.st_size < self._offset):
                        how = "replaced" if identity != self._identity else f"truncated to {st.st_size} bytes"
                        log.warning("ledger %s was %s since it was read: reading all of it again", self.path, how)
                        self._offset = self._lines = 0
                        self.rereads += 1
                    self._identity = identity
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                if self._identity is not None:
                    log.warning("ledger %s was removed since it was read: what was read stays known", self.path)
                    self._identity, self._offset, self._lines = None, 0, 0
                return False
            end = data.rfind(b"\n") + 1
            junk: list[tuple[int, bytes]] = []
            for line in data[:end].splitlines():
                self._lines += 1
                try:
                    self._apply(json.loads(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    if line.strip():
                        junk.append((self._lines, line[:40]))
            self._offset += end
            self.junk += len(junk)
            if junk and not self._quiet:
                named = ", ".join(f"line {n} ({text!r})" for n, text in junk[:_NAMED_JUNK])
                more = f" and {len(junk) - _NAMED_JUNK} more" if len(junk) > _NAMED_JUNK else ""
                log.warning("ledger %s: %d line(s) are not records and were skipped: %s%s",
                            self.path, len(junk), named, more)
            return end > 0

    def _apply(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        if kind == "pin":
            fields: dict[str, Any] = {k: record.get(k) for k in Pin.__dataclass_fields__}
            pin = Pin(**{**fields, "time": record.get("time") or ""})
            known = self.pins.get((pin.project, pin.filename))
            # A pin rebuilt from the signed pages learns its index URL from a listing of the same contents.
            if known is None or (not known.url and pin.url and not known.differs_from(pin.hashes, pin.size)):
                filled = pin if known is None else dataclass_replace(known, url=pin.url, index=pin.index)
                self.pins[(pin.project, pin.filename)] = filled
        elif kind == "project":
            self.project_index.setdefault(record["project"], record["index"])
        elif kind == "revoke":
            self.revoked.add((record["project"], record.get("filename")))
        elif kind == "publisher":
            self.publishers[record["project"]] = record
        elif kind == "provenance":
            self.provenance[(record["project"], record["filename"])] = record
        elif kind == "seen":
            when = record.get("counts_from")
            self.seen.setdefault((record["project"], record["filename"]), datetime.fromisoformat(when) if when else None)
            self._listed.add(record["project"])
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records durably, then apply them."""
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
            os.fsync(fd)
        finally:
            os.close(fd)
        self.reload()

    def pin_records(self, pins: list[Pin]) -> list[dict[str, Any]]:
        return [{"kind": "pin", **{k: v for k, v in asdict(p).items() if k != "time"}} for p in pins
                if (p.project, p.filename) not in self.pins or not self.pins[(p.project, p.filename)].url]

    def missing_pins(self, project: str, signed: index.ProjectPage) -> list[Pin]:
        """Pins of the files ``signed`` (the project's signed page) lists that the ledger lacks, rebuilt from it."""
        return [Pin(project, f.filename, dict(f.hashes), f.size, self.project_index.get(project, ""), "",
                    dict(f.core_metadata) if isinstance(f.core_metadata, dict) else None)
                for f in signed.files if (project, f.filename) not in self.pins]

    def listed(self, project: str) -> bool:
        """True when this gateway has listed ``project`` before."""
        return project in self.project_index or project in self._listed

    def seen_records(self, project: str, first_seen: dict[str, datetime | None]) -> list[dict[str, Any]]:
        return [{"kind": "seen", "project": project, "filename": f, "counts_from": w.isoformat() if w else None}
                for f, w in first_seen.items() if (project, f) not in self.seen]

    def is_revoked(self, project: str, filename: str | None = None) -> bool:
        return (project, None) in self.revoked or (filename is not None and (project, filename) in self.revoked)

    def entries(self) -> list[dict[str, Any]]:
        """Every project record, pin, first sight and revocation, for ``tufproxy gateway ledger``."""
        return ([{"kind": "project", "project": p, "index": i} for p, i in sorted(self.project_index.items())]
                + [{"kind": "pin", **asdict(p)} for _, p in sorted(self.pins.items())]
                + [{"kind": "seen", "project": p, "filename": f, "counts_from": w.isoformat() if w else None}
                   for (p, f), w in sorted(self.seen.items())]
                + [{"kind": "revoke", "project": p, "filename": f} for p, f in sorted(self.revoked, key=str)])


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)
