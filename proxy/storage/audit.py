"""The audit log: one JSON object per line for every refused (and, optionally, accepted) artifact.

Security teams read this file, so it is append-only, never holds secrets
(URLs are logged without credentials or query strings), and a failure to
write it is an :class:`AuditWriteError`: the request that caused the record
fails closed instead of succeeding unrecorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO
from urllib.parse import urlsplit, urlunsplit

from proxy.protocol.errors import CommandError, Fault
from proxy.util.logs import request_id


class AuditWriteError(OSError):
    """A record could not be written: the caller must refuse the request."""

    reason = "audit-unwritable"
    fault = Fault.OURS


def redact_url(url: str) -> str:
    """``url`` without user:password, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class AuditLog:
    """Appends JSON lines to a file (or stdout when no path is given)."""

    def __init__(self, path: Path | None = None, log_accepted: bool = False) -> None:
        self.path = path
        self.log_accepted = log_accepted
        self._lock = threading.Lock()
        self._stream: TextIO
        if path is None:
            self._stream = sys.stdout
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND: several processes may share one log; each line lands whole.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            self._stream = os.fdopen(fd, "a", buffering=1)

    def _write(self, record: dict[str, Any]) -> None:
        record = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), **record}
        if "request_id" not in record and request_id.get() != "-":
            record["request_id"] = request_id.get()  # the request being served (a gateway's: the edge's id)
        if record.get("upstream_url"):
            record["upstream_url"] = redact_url(str(record["upstream_url"]))
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        try:
            with self._lock:
                self._stream.write(line)
                self._stream.flush()
        except (OSError, ValueError) as e:
            raise AuditWriteError(f"cannot write audit log {self.path or 'stdout'}: {e}") from e

    def refused(self, **fields: Any) -> None:
        """Record a refusal: reason, target, expected vs actual, versions."""
        self._write({"event": "refused", **fields})

    def override(self, **fields: Any) -> None:
        """Record a lookup that succeeded only because an operator excused expired metadata."""
        self._write({"event": "expired-override", **fields})

    def published_root(self, **fields: Any) -> None:
        """Record a root ceremony's outcome: the versions published, who signed, which keys changed."""
        self._write({"event": "root-published", **fields})

    def accepted(self, **fields: Any) -> None:
        """Record an artifact served after verification (only when enabled)."""
        if self.log_accepted:
            self._write({"event": "accepted", **fields})

    def close(self) -> None:
        if self._stream is not sys.stdout:
            self._stream.close()


def summarize(lines: Iterable[str]) -> dict[str, Any]:
    """Counts of refusals by reason, role and target, and the time range covered.

    Lines that are not audit records (other log output shares stdout by
    default) are counted as skipped, never fatal.
    """
    by_reason: Counter[str] = Counter()
    by_target: Counter[str] = Counter()
    by_client: Counter[str] = Counter()
    accepted = overrides = skipped = 0
    first = last = None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if not isinstance(record, dict) or record.get("event") not in ("refused", "accepted", "expired-override"):
            skipped += 1
            continue
        when = record.get("time")
        first = when if first is None else min(first, when)
        last = when if last is None else max(last, when)
        if record["event"] == "accepted":
            accepted += 1
            continue
        if record["event"] == "expired-override":
            overrides += 1
            continue
        by_reason[str(record.get("reason"))] += 1
        # A gateway's records name no client (it serves edges), some name no target: counted only where named.
        for counter, key in ((by_target, "target"), (by_client, "client")):
            if record.get(key) is not None:
                counter[str(record[key])] += 1
    return {
        "refused": sum(by_reason.values()),
        "accepted": accepted,
        "expired_overrides": overrides,
        "skipped_lines": skipped,
        "first": first,
        "last": last,
        "by_reason": dict(by_reason.most_common()),
        "top_targets": dict(by_target.most_common(10)),
        "top_clients": dict(by_client.most_common(10)),
    }


class _Words(argparse.ArgumentParser):
    """A parser of what follows ``tufproxy audit``: its usage errors are one line."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{self.prog}: {message}")


def _words_parser(who_got: bool) -> argparse.ArgumentParser:
    p = _Words(prog="tufproxy audit who-got" if who_got else "tufproxy audit", add_help=False)
    p.add_argument("logs", nargs="+" if who_got else 1)
    p.add_argument("--json", action="store_true")
    if who_got:
        p.add_argument("--advisory")
        p.add_argument("--file")
        p.add_argument("--project")
        p.add_argument("--since")
    return p


def _cmd_audit(args: argparse.Namespace) -> int:
    who_got = bool(args.words) and args.words[0] == "who-got"
    # Options may come before LOG or among LOGs: the words after "audit" are parsed here, intermixed.
    words = _words_parser(who_got).parse_intermixed_args(args.words[1:] if who_got else args.words)
    as_json = args.json or words.json
    if who_got:
        from proxy.storage import whogot  # only this subcommand needs advisories' parsing

        given = [q for q in (words.advisory, words.file, words.project) if q is not None]
        if len(given) != 1:
            raise CommandError("who-got: give exactly one of --advisory ID, --file FILENAME, --project NAME==VERSION")
        query = whogot.Query(words.advisory, words.file,
                             whogot.parse_requirement(words.project) if words.project else None,
                             whogot.parse_since(words.since) if words.since else None)
        print(whogot.report(whogot.who_got([Path(w) for w in words.logs], query), as_json))
        return 0
    log = words.logs[0]
    try:
        with (sys.stdin if log == "-" else open(log, errors="replace")) as f:
            summary = summarize(f)
    except OSError as e:
        raise CommandError(f"cannot read the audit log {log}: {e.strerror or e}") from e
    if as_json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{summary['refused']} refused, {summary['accepted']} accepted, "
          f"{summary['expired_overrides']} served under an expired-metadata override, "
          f"from {summary['first']} to {summary['last']}")
    for title, key in (("by reason", "by_reason"), ("top targets", "top_targets"), ("top clients", "top_clients")):
        if summary[key]:
            print(f"{title}:")
            for name, count in summary[key].items():
                print(f"  {count:>6}  {name}")
    return 0


WHO_GOT_HELP = """\
tufproxy audit who-got (--advisory ID | --file FILENAME | --project NAME==VERSION) [--since TIME] [--json] LOG...
  lists each client, edge (the log it was read from) and time that received a file. Edges' logs
  need 'tufproxy serve --audit-accepted yes'. --advisory ID (or one of its aliases) names the files
  the gateway blocked under it: give the gateway's audit log among the LOGs. --since takes an
  ISO 8601 time (2025-01-31T00:00:00Z).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy audit`` (and ``tufproxy audit who-got``)."""
    p = subparsers.add_parser(
        "audit",
        usage="tufproxy audit [-h] [--json] LOG | who-got ... LOG...",
        description="Read an audit log (JSON lines written by 'tufproxy serve') and print what was refused. "
        "Other log lines mixed into the file are skipped.",
        epilog=WHO_GOT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("words", nargs=argparse.REMAINDER, metavar="LOG", help="audit log file, or - for standard input")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_audit)
