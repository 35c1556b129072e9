"""Benchmark the trust core beside python-tuf's own client, in one run.

Figures (ours, python-tuf, ratio tuf/ours — above 1 means we are faster):

* per-bin verify time (µs) for a bin of ~600 targets: our
  ``verify_delegated`` vs ``TrustedMetadataSet.update_delegated_targets``
  (the step ``Updater`` runs for every bin it loads);
* delegation lookup (µs) over 16384 classic ``path_hash_prefixes`` roles:
  our precomputed index vs ``Delegations.get_roles_for_target``;
* refresh time (ms) for a snapshot listing 16384 bins: ``TrustedClient.refresh``
  vs ``Updater.refresh``, both over an in-memory fetcher (no HTTP, so only
  verification and bookkeeping are compared);
* lookup of one target in every bin (total ms), and traced memory (MB) after
  touching all bins.

Usage: ``python3 bench/trust.py`` (16384 bins) or ``--quick`` (1024 bins).
Not run by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
import timeit
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from securesystemslib.signer import CryptoSigner
from tuf.api import exceptions as tuf_exc
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    SuccinctRoles,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.ngclient import FetcherInterface, Updater
from tuf.ngclient._internal.trusted_metadata_set import TrustedMetadataSet
from tuf.ngclient.config import EnvelopeType, UpdaterConfig

from proxy.protocol.verify import DelegationIndex, verify_delegated
from proxy.transport.upstream import ByteStream, DownloadHTTPError, Fetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient

BASE = "http://bench.invalid/metadata/"
NOW = datetime.now(UTC).replace(microsecond=0)
EXPIRES = NOW + timedelta(days=7)


def _target(path: str) -> TargetFile:
    digest = hashlib.sha256(path.encode()).hexdigest()
    return TargetFile(1234, {"sha256": digest, "sha512": hashlib.sha512(path.encode()).hexdigest()}, path)


def _sign(signed: object, key: CryptoSigner) -> bytes:
    md = Metadata(signed)  # type: ignore[arg-type]
    md.sign(key)
    return md.to_bytes()


class Repo:
    """Signed metadata in memory: targets → bins → 2**bits succinct bins."""

    def __init__(self, bits: int, targets_per_bin: int) -> None:
        self.key = key = CryptoSigner.generate_ed25519()
        keyid = key.public_key.keyid
        root = Root(expires=EXPIRES, consistent_snapshot=True)
        for role in ("root", "timestamp", "snapshot", "targets"):
            root.add_key(key.public_key, role)
        self.root = _sign(root, key)
        top = Targets(expires=EXPIRES, delegations=Delegations(
            {keyid: key.public_key}, roles={"bins": DelegatedRole("bins", [keyid], 1, True, paths=["packages/*/*"])}))
        self.succinct = SuccinctRoles([keyid], 1, bits, "bin")
        bins = Targets(expires=EXPIRES, delegations=Delegations({keyid: key.public_key}, succinct_roles=self.succinct))
        per_bin: dict[str, Targets] = {name: Targets(expires=EXPIRES) for name in self.succinct.get_roles()}
        for i in range(targets_per_bin << bits):
            path = f"packages/p{i}/p{i}-1.0.tar.gz"
            per_bin[self.succinct.get_role_for_target(path)].targets[path] = _target(path)
        self.sample = {name: next(iter(t.targets)) for name, t in per_bin.items() if t.targets}
        self.files: dict[str, bytes] = {"1.root.json": self.root}
        snapshot = Snapshot(expires=EXPIRES)
        for name, signed in [("targets", top), ("bins", bins), *per_bin.items()]:
            self.files[f"1.{name}.json"] = _sign(signed, key)
            snapshot.meta[f"{name}.json"] = MetaFile(1)
        self.files["1.snapshot.json"] = _sign(snapshot, key)
        self.files["timestamp.json"] = _sign(Timestamp(expires=EXPIRES, snapshot_meta=MetaFile(1)), key)

    def get(self, url: str) -> bytes | None:
        return self.files.get(url.removeprefix(BASE))


class OurMemoryFetcher(Fetcher):
    def __init__(self, repo: Repo) -> None:
        self.repo = repo

    def stream(self, url: str, max_length: int):  # type: ignore[override]
        return self._stream(url)

    @asynccontextmanager
    async def _stream(self, url: str) -> AsyncIterator[ByteStream]:
        data = self.repo.get(url)
        if data is None:
            raise DownloadHTTPError(url, 404)

        async def one() -> AsyncIterator[bytes]:
            yield data

        yield ByteStream(one(), len(data))


class TufMemoryFetcher(FetcherInterface):
    def __init__(self, repo: Repo) -> None:
        self.repo = repo

    def _fetch(self, url: str) -> Iterator[bytes]:
        data = self.repo.get(url)
        if data is None:
            raise tuf_exc.DownloadHTTPError("not found", 404)
        return iter([data])


def bench_bin_verify(repeat: int) -> tuple[float, float]:
    key = CryptoSigner.generate_ed25519()
    keyid = key.public_key.keyid
    root = Root(expires=EXPIRES)
    for role in ("root", "timestamp", "snapshot", "targets"):
        root.add_key(key.public_key, role)
    bins = Targets(expires=EXPIRES, delegations=Delegations(
        {keyid: key.public_key}, succinct_roles=SuccinctRoles([keyid], 1, 14, "bin")))
    big = Targets(expires=EXPIRES)
    for i in range(600):
        path = f"packages/project-{i}/project_{i}-1.0-py3-none-any.whl"
        big.targets[path] = _target(path)
    data = _sign(big, key)
    snapshot = Snapshot(expires=EXPIRES, meta={"targets.json": MetaFile(1), "bin-0000.json": MetaFile(1)})
    tset = TrustedMetadataSet(_sign(root, key), EnvelopeType.METADATA)
    tset.update_timestamp(_sign(Timestamp(expires=EXPIRES, snapshot_meta=MetaFile(1)), key))
    tset.update_snapshot(_sign(snapshot, key))
    tset.update_targets(_sign(bins, key))  # "targets" stands in for the bins delegator
    meta = MetaFile(1)
    ours = min(timeit.repeat(lambda: verify_delegated(data, "bin-0000", bins, meta, NOW), number=1, repeat=repeat))
    theirs = min(timeit.repeat(lambda: tset.update_delegated_targets(data, "bin-0000", "targets"), number=1, repeat=repeat))
    return ours * 1e6, theirs * 1e6


def bench_prefix_lookup(count: int) -> tuple[float, float]:
    key = CryptoSigner.generate_ed25519()
    keyid = key.public_key.keyid
    width = len(f"{count - 1:x}")
    roles = {f"bin-{i:0{width}x}": DelegatedRole(f"bin-{i:0{width}x}", [keyid], 1, False,
                                                 path_hash_prefixes=[f"{i:0{width}x}"]) for i in range(count)}
    targets = Targets(expires=EXPIRES, delegations=Delegations({keyid: key.public_key}, roles=roles))
    index = DelegationIndex(targets)
    path = "packages/demo/demo-1.0.tar.gz"
    assert index.roles_for(path) == list(targets.delegations.get_roles_for_target(path))
    ours = min(timeit.repeat(lambda: index.roles_for(path), number=100, repeat=5)) / 100
    theirs = min(timeit.repeat(lambda: list(targets.delegations.get_roles_for_target(path)), number=3, repeat=3)) / 3
    return ours * 1e6, theirs * 1e6


async def run_ours(repo: Repo, directory: Path, trace: bool) -> tuple[float, float, float]:
    TrustedClient.initialize(directory, repo.root)
    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    client = TrustedClient(directory, [Mirror(BASE, BASE)], OurMemoryFetcher(repo),
                           TrustConfig(refresh_interval=3600, bin_cache_size=len(repo.sample) + 8))
    t0 = time.perf_counter()
    await client.refresh(force=True)
    refresh = time.perf_counter() - t0
    t0 = time.perf_counter()
    for path in repo.sample.values():
        await client.get_target(path)
    lookups = time.perf_counter() - t0
    memory = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    client.close()
    return refresh * 1e3, lookups * 1e3, memory / 1e6


def run_tuf(repo: Repo, directory: Path, trace: bool) -> tuple[float, float, float]:
    directory.mkdir(parents=True)
    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    config = UpdaterConfig(snapshot_max_length=16_000_000, targets_max_length=16_000_000)
    updater = Updater(str(directory), BASE, fetcher=TufMemoryFetcher(repo), config=config, bootstrap=repo.root)
    t0 = time.perf_counter()
    updater.refresh()
    refresh = time.perf_counter() - t0
    t0 = time.perf_counter()
    for path in repo.sample.values():
        assert updater.get_targetinfo(path) is not None
    lookups = time.perf_counter() - t0
    memory = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return refresh * 1e3, lookups * 1e3, memory / 1e6


def row(label: str, unit: str, ours: float, theirs: float) -> None:
    print(f"{label:<48} {ours:>12.1f} {theirs:>12.1f} {unit:<3} {theirs / ours:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1024 bins instead of 16384")
    parser.add_argument("--targets-per-bin", type=int, default=4,
                        help="targets in each bin of the refresh/memory repository (default 4)")
    args = parser.parse_args()
    bits = 10 if args.quick else 14

    print(f"{'':<48} {'tufproxy':>12} {'python-tuf':>12}     {'ratio':>8}")
    row("per-bin verify, 600 targets", "µs", *bench_bin_verify(5 if args.quick else 20))
    row(f"lookup over {1 << bits} path_hash_prefixes roles", "µs", *bench_prefix_lookup(1 << bits))

    t0 = time.perf_counter()
    repo = Repo(bits, args.targets_per_bin)
    print(f"(built a {1 << bits}-bin repository, {args.targets_per_bin} targets/bin, "
          f"snapshot {len(repo.files['1.snapshot.json']) / 1e6:.2f} MB, in {time.perf_counter() - t0:.1f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        # Timings untraced; memory from a second, traced run (tracemalloc slows both).
        ours = asyncio.run(run_ours(repo, Path(tmp) / "ours", trace=False))
        theirs = run_tuf(repo, Path(tmp) / "tuf", trace=False)
        ours_mem = asyncio.run(run_ours(repo, Path(tmp) / "ours-traced", trace=True))[2]
        theirs_mem = run_tuf(repo, Path(tmp) / "tuf-traced", trace=True)[2]
    row(f"refresh, snapshot of {1 << bits} bins", "ms", ours[0], theirs[0])
    row(f"one lookup in each of {len(repo.sample)} bins (total)", "ms", ours[1], theirs[1])
    row("traced memory after touching all bins", "MB", ours_mem, theirs_mem)


if __name__ == "__main__":
    main()
