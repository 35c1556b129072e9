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
  project's PEP 740 trusted publisher, pinned at its first verified file or
  accepted by the operator; the latest record wins
  (:mod:`proxy.gateway.provenance`).
* ``{"kind": "provenance", "project", "filename", "publisher", "sha256", "url"}``:
  a file's verified publisher and the sha256 of its provenance object.

Readers pick up lines other processes appended (``tufproxy gateway
revoke`` beside a running gateway) with :meth:`Ledger.reload`.  A torn
last line (a crash mid-append) is ignored and completed by the next append.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


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

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "ledger.jsonl"
        self.pins: dict[tuple[str, str], Pin] = {}
        self.project_index: dict[str, str] = {}
        self.revoked: set[tuple[str, str | None]] = set()
        self.publishers: dict[str, dict[str, Any]] = {}
        self.provenance: dict[tuple[str, str], dict[str, Any]] = {}
        self._offset = 0
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.reload()

    def reload(self) -> bool:
        """Read lines appended since the last read; True if there were any."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                return False
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                try:
                    self._apply(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn line completed by a later append, or junk: never fatal
            self._offset += end
            return end > 0

    def _apply(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        if kind == "pin":
            fields: dict[str, Any] = {k: record.get(k) for k in Pin.__dataclass_fields__}
            pin = Pin(**{**fields, "time": record.get("time") or ""})
            self.pins.setdefault((pin.project, pin.filename), pin)
        elif kind == "project":
            self.project_index.setdefault(record["project"], record["index"])
        elif kind == "revoke":
            self.revoked.add((record["project"], record.get("filename")))
        elif kind == "publisher":
            self.publishers[record["project"]] = record
        elif kind == "provenance":
            self.provenance[(record["project"], record["filename"])] = record

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
                if (p.project, p.filename) not in self.pins]

    def is_revoked(self, project: str, filename: str | None = None) -> bool:
        return (project, None) in self.revoked or (filename is not None and (project, filename) in self.revoked)

    def entries(self) -> list[dict[str, Any]]:
        """Every pin, project record and revocation, for ``tufproxy gateway ledger``."""
        return ([{"kind": "project", "project": p, "index": i} for p, i in sorted(self.project_index.items())]
                + [{"kind": "pin", **asdict(p)} for _, p in sorted(self.pins.items())]
                + [{"kind": "revoke", "project": p, "filename": f} for p, f in sorted(self.revoked, key=str)])


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)
