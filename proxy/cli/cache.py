"""``tufproxy cache verify DIR``: re-hash every blob and page of a cache directory, offline.

What a store shared by processes or hosts must keep true, checked from
outside: each file under ``blobs/`` holds exactly the bytes its sha256
name says, each page in the index cache the bytes its key's signed digest
says, and the index cache's database is consistent.  Nothing is changed;
exit status 1 if anything is unsound.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

import diskcache

from proxy.protocol.errors import CommandError, RepositoryError
from proxy.protocol.hashing import verify_bytes
from proxy.protocol.model import file_digest
from proxy.storage.pagecache import IndexCache

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass
class CacheReport:
    """What :func:`verify_cache` found."""

    sound: int = 0
    bytes: int = 0
    pages: int = 0
    unsound: list[str] = field(default_factory=list)
    index_warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unsound and not self.index_warnings


def verify_cache(cache_dir: Path) -> CacheReport:
    """Re-hash every blob under ``cache_dir/blobs`` and check the index database."""
    blobs = cache_dir / "blobs"
    if not blobs.is_dir():
        raise CommandError(f"{cache_dir} has no blobs/ directory: not a tufproxy cache")
    report = CacheReport()
    for path in sorted(blobs.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        rel = str(path.relative_to(cache_dir))
        name = path.name
        if path.is_symlink() or not _SHA256_RE.fullmatch(name) or path.parent.name != name[:2]:
            report.unsound.append(f"{rel}: not a blob the store wrote")
            continue
        try:
            actual = file_digest("sha256", path)
        except FileNotFoundError:
            continue  # evicted by a running proxy meanwhile
        if actual != name:
            report.unsound.append(f"{rel}: content has sha256 {actual}")
            continue
        report.sound += 1
        report.bytes += path.stat().st_size
    if (cache_dir / "index").is_dir():
        with diskcache.Cache(str(cache_dir / "index")) as pages:
            report.index_warnings = [str(w.message) for w in pages.check(fix=False)]
            _verify_pages(pages, report)
    return report


def _verify_pages(pages: diskcache.Cache, report: CacheReport) -> None:
    """Re-hash every cached page against the signed digest its key names (the one hash check)."""
    for key in pages.iterkeys():
        parsed = IndexCache.parse_key(key) if isinstance(key, str) else None
        data = pages.get(key, default=None, retry=True)
        if data is None:
            continue  # evicted by a running proxy meanwhile
        if parsed is None or not isinstance(data, bytes):
            report.unsound.append(f"index/{str(key)[:200]}: not a page the proxy stored")
            continue
        path, algorithm, digest = parsed
        try:
            verify_bytes(path, {algorithm: digest}, len(data), data)
        except RepositoryError as e:
            report.unsound.append(f"index/{path}: {e.reason}: {e}")
            continue
        report.pages += 1


def _cmd_verify(args: argparse.Namespace) -> int:
    report = verify_cache(Path(args.dir))
    for problem in report.unsound:
        print(f"UNSOUND {problem}")
    for warning in report.index_warnings:
        print(f"INDEX {warning}")
    print(f"{report.sound} blob(s) sound ({report.bytes} bytes), {report.pages} page(s) sound, {len(report.unsound)} unsound, "
          f"{len(report.index_warnings)} index warning(s)")
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy cache``."""
    p = subparsers.add_parser("cache", description="Offline checks of a tufproxy cache directory (safe while proxies run).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    v = actions.add_parser("verify", help="re-hash every blob and page; exit 1 if any is not what its name says",
                           description="Re-hash every blob under DIR/blobs against its sha256 name, every cached "
                           "page against its signed digest, and check the index cache database. "
                           "Exit status 0 if all is sound, 1 otherwise.")
    v.add_argument("dir", metavar="DIR", help="the cache directory (--cache-dir of tufproxy serve)")
    v.set_defaults(func=_cmd_verify)
