"""``tufproxy audit who-got``: which clients, through which edge, received a file now known to be bad.

Reads audit logs (JSON lines): edges' ``accepted`` records (``serve
--audit-accepted yes``: every file served, with the client's address)
and the gateway's advisory records (``advisory-malicious`` /
``advisory-vulnerable``, naming the advisory, its aliases and the file).
A query names the files: ``--advisory ID`` (every file a gateway record
blocked under that id or one of its aliases), ``--file FILENAME``, or
``--project NAME==VERSION``.  Each log is read line by line; lines that are
not records are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from proxy.protocol.errors import CommandError
from proxy.protocol.osv import RULES, file_version

MAX_RESULTS = 100_000  # a bound on what one answer holds


@dataclass(frozen=True)
class Query:
    advisory: str | None = None
    filename: str | None = None
    project: tuple[str, Version] | None = None
    since: datetime | None = None


@dataclass(frozen=True)
class Receipt:
    """One file served to one client."""

    time: str
    client: str | None
    edge: str  # the log it was read from
    file: str
    target: str
    request_path: str | None


def parse_requirement(text: str) -> tuple[str, Version]:
    name, sep, version = text.partition("==")
    try:
        if not sep or not name.strip():
            raise InvalidVersion(text)
        return canonicalize_name(name.strip()), Version(version.strip())
    except InvalidVersion:
        raise CommandError(f"--project: give NAME==VERSION, not {text!r}") from None


def parse_since(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CommandError(f"--since: {text!r} is not an ISO 8601 time (e.g. 2025-01-31T00:00:00Z)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _records(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    yield record
    except OSError as e:
        raise CommandError(f"cannot read the audit log {path}: {e.strerror or e}") from None


def _when(record: dict[str, Any]) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(record.get("time")))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def blocked_files(logs: Iterable[Path], advisory: str) -> set[str]:
    """File names gateway records blocked under ``advisory`` (its id or one of its aliases)."""
    files = set()
    for path in logs:
        for r in _records(path):
            if r.get("reason") in RULES and (r.get("advisory") == advisory or advisory in (r.get("aliases") or ())):
                files.add(str(r.get("file")))
    return files


def _wanted(query: Query, filename: str, files: set[str] | None) -> bool:
    if files is not None:
        return filename in files
    if query.filename is not None:
        return filename == query.filename
    if query.project is not None:
        name, version = query.project
        parsed, _ = file_version(filename)
        return parsed == version and canonicalize_name(filename.split("-", 1)[0]) == name
    return False


def who_got(logs: list[Path], query: Query) -> list[Receipt]:
    """Every ``accepted`` record in ``logs`` of a file the query names, oldest first."""
    files = blocked_files(logs, query.advisory) if query.advisory is not None else None
    found: list[Receipt] = []
    for path in logs:
        for r in _records(path):
            if r.get("event") != "accepted":
                continue
            target = str(r.get("target") or "")
            filename = target.rpartition("/")[2]
            if not _wanted(query, filename, files):
                continue
            when = _when(r)
            if query.since is not None and (when is None or when < query.since):
                continue
            found.append(Receipt(str(r.get("time")), r.get("client"), str(path), filename, target, r.get("request_path")))
            if len(found) >= MAX_RESULTS:
                raise CommandError(f"more than {MAX_RESULTS} receipts: narrow the query with --since")
    return sorted(found, key=lambda x: x.time)


def report(receipts: list[Receipt], as_json: bool) -> str:
    if as_json:
        return json.dumps([asdict(r) for r in receipts], indent=2)
    lines = [f"{len(receipts)} download(s) by {len({r.client for r in receipts})} client(s)"]
    lines += [f"{r.time}  {r.client or '?'}  {r.edge}  {r.file}" for r in receipts]
    return "\n".join(lines)
