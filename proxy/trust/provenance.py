"""PEP 740 attestations verified with ``pypi-attestations`` on ``sigstore``: which trust root, and where.

:func:`verify_offline` is the one verification of a provenance object:
every attestation is checked against the file's sha256 and name (the
statement's subject) and its bundle's publisher against the signing
certificate.  No Sigstore, DSSE or in-toto check is written here.
:meth:`SigstoreTrust.check` runs it for the gateway
(:mod:`proxy.gateway.provenance`, at a file's first publish) and the edge
(``tufproxy serve --verify-provenance yes``) in a pool of worker processes,
at most one per core given: it is all CPU (about 2 ms an attestation, most
of it certificate chain and signature checks) and holds the GIL, so in
threads a page of a hundred files would verify on one core and stall the
event loop meanwhile.  ``mirror verify`` uses it too.  Each worker keeps
one sigstore ``Verifier`` per trust root (:func:`_keep_verifiers`), where
pypi-attestations would build one per attestation.

The trust root: ``production`` or ``staging``, refreshed over TUF by
sigstore-python, or with ``--sigstore-offline yes`` the one that ships
inside sigstore-python, never refreshed.  A FILE is a private trust root,
always offline.  sigstore-python's cache is pointed at a directory of ours
(:meth:`SigstoreTrust.prepare`), so no user cache is consulted.

Every attestation is verified offline, against the trust root in that
cache.  Online, :meth:`SigstoreTrust.check` first makes sure it is
current: one TUF refresh (sigstore-python's own, the embedded root.json
bootstrapping it) at the first verification and then at most every
:data:`REFRESH_SECONDS`, however many files are verified meanwhile.
Left to itself, pypi-attestations refreshes over the network for every
attestation it verifies: a hundred round trips to publish one page of a
hundred files.  A refresh that fails is tried again after
:data:`RETRY_SECONDS`; the root last refreshed goes on verifying for
:data:`STALE_SECONDS`, then verification stops (``unavailable``: fail
closed, like sigstore-python, which refuses to verify on a failed refresh).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any
from urllib.parse import quote

from proxy.protocol import provenance as rules
from proxy.protocol.options import Option, yes_no
from proxy.protocol.provenance import Outcome, PublisherSpec
from proxy.util.lifetime import die_with

_SIGSTORE_URLS = {"production": "https://tuf-repo-cdn.sigstore.dev", "staging": "https://tuf-repo-cdn.sigstage.dev"}
REFRESH_SECONDS = 3600.0
RETRY_SECONDS = 30.0
STALE_SECONDS = 86400.0  # sigstore-python's own refresh would already refuse; a day bridges an outage of its CDN
log = logging.getLogger(__name__)


def parse_trust_root(value: Any) -> str:
    text = str(value)
    if text in _SIGSTORE_URLS:
        return text
    if not Path(text).is_file():
        raise ValueError(f"give production, staging or a trusted_root.json FILE; {text[:200]!r} is no file")
    return str(Path(text).resolve())


SIGSTORE_OPTIONS: tuple[Option, ...] = (
    Option("sigstore_trust_root", "Sigstore trust root for PEP 740 attestations: production, staging, or a "
           "trusted_root.json FILE (always offline)", "production", parse_trust_root, metavar="ROOT"),
    Option("sigstore_offline", "yes: use the trust root shipped with sigstore-python (or FILE), never the network",
           "no", yes_no, metavar="yes|no"),
)


class SigstoreTrust:
    """Which Sigstore trust root verifies attestations, prepared once per process; see the module docstring."""

    def __init__(self, root: str = "production", offline: bool = False, processes: int = 1) -> None:
        self.staging = root == "staging"
        self.file = None if root in _SIGSTORE_URLS else Path(root)
        self.offline = offline or self.file is not None
        self.processes = max(1, processes)  # for check(); started at its first call
        self._lock = threading.Lock()  # one refresh at a time; the verifications waiting on it use its result
        self._refreshed: float | None = None  # time.monotonic() of the last successful refresh
        self._failed: tuple[float, str] | None = None  # when the last refresh failed, and why
        self._pool: ProcessPoolExecutor | None = None
        self._refresher: ThreadPoolExecutor | None = None  # a refresh waits on the network: not in the loop's threads

    def prepare(self, home: Path) -> None:
        """Point sigstore-python's cache at ``home``, holding the shipped root (or FILE) until a refresh."""
        _quiet()
        os.environ["XDG_CACHE_HOME"] = str(home / "cache")
        os.environ["XDG_DATA_HOME"] = str(home / "data")
        if self.file is not None:
            target = _trusted_root_file(home / "cache", "production")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.file.read_bytes())

    def unavailable(self) -> str | None:
        """None when the trust root is current enough to verify with (refreshing it if due), else why not."""
        if self.offline:
            return None
        with self._lock:
            now = time.monotonic()
            if self._refreshed is not None and now - self._refreshed < REFRESH_SECONDS:
                return None
            if self._failed is None or now - self._failed[0] >= RETRY_SECONDS:
                from sigstore.models import ClientTrustConfig

                try:
                    (ClientTrustConfig.staging if self.staging else ClientTrustConfig.production)(offline=False)
                except Exception as e:  # noqa: BLE001 - TUFError, or whatever its network and parsing raise
                    cause = e.__cause__ or e
                    self._failed = (now, f"{e}: {type(cause).__name__}: {str(cause)[:200]}")
                    log.warning("the Sigstore trust root could not be refreshed (%s); next try in %.0f s",
                                self._failed[1], RETRY_SECONDS)
                else:
                    self._refreshed, self._failed = now, None
                    return None
            if self._refreshed is not None and now - self._refreshed < STALE_SECONDS:
                return None
            return f"no current Sigstore trust root: {self._failed[1] if self._failed else 'not refreshed'}"

    async def check(self, data: bytes, filename: str, sha256: str) -> Outcome:
        """Verify provenance object ``data`` for the file in a worker process: :meth:`check_all` of one."""
        return (await self.check_all([(data, filename, sha256)]))[0]

    async def check_all(self, files: Sequence[tuple[bytes, str, str]]) -> list[Outcome]:
        """Verify each (provenance object, filename, sha256) in worker processes, once the trust root is current
        (:meth:`unavailable`).  A page's files go in a few chunks, not one by one: each hand-over to a worker
        costs this process more than the loop's share of a fetch.  A worker that died (killed, out of memory)
        makes its chunk ``unavailable``, and the next call starts a new pool."""
        if not files:
            return []
        loop = asyncio.get_running_loop()
        if not self.offline:
            if self._refresher is None:
                self._refresher = ThreadPoolExecutor(1, thread_name_prefix="sigstore-refresh")
            if (why := await loop.run_in_executor(self._refresher, self.unavailable)) is not None:
                return [Outcome("unavailable", why, digest=hashlib.sha256(data).hexdigest()) for data, _, _ in files]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_start, initargs=(os.getpid(),))
        pool = self._pool
        size = -(-len(files) // (2 * self.processes))  # two chunks a worker: one slow chunk does not hold up the rest

        async def chunk(part: Sequence[tuple[bytes, str, str]]) -> list[Outcome]:
            try:
                return await loop.run_in_executor(pool, verify_many, self.staging, part)
            except BrokenProcessPool as e:
                if self._pool is pool:
                    self._pool = None
                    pool.shutdown(wait=False, cancel_futures=True)
                    log.error("a PEP 740 verification worker died (%s): starting new ones", e)
                return [Outcome("unavailable", f"the verification worker died: {e}",
                                digest=hashlib.sha256(data).hexdigest()) for data, _, _ in part]

        done = await asyncio.gather(*(chunk(files[i:i + size]) for i in range(0, len(files), size)))
        return [outcome for part in done for outcome in part]

    def close(self) -> None:
        """Stop the worker processes (a verification running now is abandoned)."""
        for executor in (self._pool, self._refresher):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        self._pool = self._refresher = None


def _trusted_root_file(cache: Path, root: str) -> Path:
    """Where sigstore-python, its cache at ``cache`` (XDG_CACHE_HOME), keeps the trust root it verifies with."""
    return cache / "sigstore-python" / "tuf" / quote(_SIGSTORE_URLS[root], safe="") / "trusted_root.json"


def _quiet() -> None:
    logging.getLogger("sigstore._internal.tuf").setLevel(logging.ERROR)  # "offline mode" on every verify


def _worker_start(parent: int) -> None:
    """A verification worker: Ctrl-C is for its parent, which stops it, and so is its parent's death; loaded
    before its first file."""
    die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _quiet()
    _keep_verifiers()


def _keep_verifiers() -> None:
    """In a verification worker (a process that does nothing else): one sigstore ``Verifier`` per trust root.

    pypi-attestations builds a new ``Verifier.production()`` (or ``staging()``) for every attestation, which
    reads and parses the trust root from the cache each time: about 40 % of a verification's CPU.  Here the
    two constructors keep what they built while the trust root file is the same one (its inode, size and
    mtime): a refresh that replaces it gets a new one at the next attestation.  Offline only, as workers ask.
    """
    from sigstore.verify import Verifier

    kept: dict[str, tuple[tuple[int, int, int], Verifier]] = {}

    def keeping(name: str) -> classmethod:
        build = getattr(Verifier, name)

        def make(cls: type[Verifier], *, offline: bool = False) -> Verifier:
            cache = os.environ.get("XDG_CACHE_HOME")  # set by SigstoreTrust.prepare
            if not offline or cache is None:
                return build(offline=offline)
            path = _trusted_root_file(Path(cache), name)
            try:
                stat = path.stat()
                key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            except OSError:
                return build(offline=offline)  # not there yet: sigstore writes the shipped one on its first build
            if (hit := kept.get(name)) is not None and hit[0] == key:
                return hit[1]
            verifier = build(offline=offline)
            kept[name] = (key, verifier)
            return verifier

        return classmethod(make)

    Verifier.production = keeping("production")  # type: ignore[method-assign,assignment]
    Verifier.staging = keeping("staging")  # type: ignore[method-assign,assignment]
    import pypi_attestations  # noqa: F401


def verify_many(staging: bool, files: Sequence[tuple[bytes, str, str]]) -> list[Outcome]:
    return [verify_offline(staging, *file) for file in files]


def verify_offline(staging: bool, data: bytes, filename: str, sha256: str) -> Outcome:
    """Verify provenance object ``data`` for the file against the trust root in the (prepared) cache."""
    # Imported here: pydantic and sigstore load only where provenance is on.
    import pydantic
    from pypi_attestations import AttestationError, Distribution, Provenance

    digest = hashlib.sha256(data).hexdigest()
    try:
        prov = Provenance.model_validate_json(data)
        dist = Distribution(name=filename, digest=sha256)
    except (pydantic.ValidationError, ValueError) as e:
        return Outcome("invalid", f"not a PEP 740 provenance object: {str(e).splitlines()[0][:200]}", digest=digest)
    seen: PublisherSpec | None = None
    for bundle in prov.attestation_bundles:
        try:
            publisher = rules.from_publisher(bundle.publisher.model_dump())
        except (ValueError, KeyError) as e:
            return Outcome("invalid", str(e), digest=digest)
        if not bundle.attestations:
            return Outcome("invalid", "an attestation bundle with no attestation", digest=digest)
        for attestation in bundle.attestations:
            try:
                attestation.verify(bundle.publisher, dist, staging=staging, offline=True)
            except AttestationError as e:
                return Outcome("invalid", f"{str(e)[:300]}", publisher, digest)
            except Exception as e:  # noqa: BLE001 - sigstore raises others on junk (bad DER, TUF): invalid, never a crash
                return Outcome("invalid", f"{type(e).__name__}: {str(e)[:300]}", publisher, digest)
        if seen is not None and seen != publisher:
            return Outcome("invalid", f"attestations from two publishers ({seen}, {publisher})", publisher, digest)
        seen = publisher
    if seen is None:
        return Outcome("invalid", "no attestation bundle", digest=digest)
    return Outcome("verified", publisher=seen, digest=digest)
