"""A signed repository behind a real upstream, and TrustedClients over one metadata dir."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.transport.upstream import AiohttpFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient
from tests.conftest import SampleRepo
from tests.support.tree import all_targets
from tests.support.upstream import Upstream


class Env:
    """A repository, its upstream, and TrustedClients over one metadata dir."""

    def __init__(self, sample: SampleRepo, up: Upstream, tmp: Path) -> None:
        self.repo: Repository = sample.repo
        self.up = up
        self.dir = tmp / "client"
        self.fetcher = AiohttpFetcher(connect_timeout=2, read_timeout=2, total_timeout=10)
        self.clients: list[TrustedClient] = []
        TrustedClient.initialize(self.dir, sample.root_bytes)

    @property
    def mirror(self) -> Mirror:
        return Mirror(f"{self.up.url}metadata/", self.up.url)

    def client(self, **config: object) -> TrustedClient:
        for c in self.clients:
            c.close()
        settings = {"refresh_interval": 3600.0, **config}
        c = TrustedClient(self.dir, [self.mirror], self.fetcher, TrustConfig(**settings))  # type: ignore[arg-type]
        self.clients.append(c)
        return c

    def meta(self, name: str) -> bytes:
        return (self.repo.metadata_dir / name).read_bytes()

    def version(self, role: str) -> int:
        """The repository's current version of a role, as its snapshot lists it."""
        ts = Metadata.from_bytes(self.meta("timestamp.json")).signed
        if role == "timestamp":
            return ts.version
        if role == "snapshot":
            return ts.snapshot_meta.version
        snap = Metadata.from_bytes(self.meta(f"{ts.snapshot_meta.version}.snapshot.json")).signed
        return snap.meta[f"{role}.json"].version

    def on_disk(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.dir.iterdir()) if p.is_file()}

    def publish(self, tmp: Path, name: str = "extra", version: str = "1.0") -> str:
        """Add a new distribution upstream; returns its target path."""
        wheel = build_wheel(tmp / "more", name, version)
        self.repo.add([wheel])
        return f"packages/{name}/{wheel.name}"


@pytest.fixture
async def env(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(sample_repo, upstream, tmp_path)
    yield e
    for c in e.clients:
        c.close()
    await e.fetcher.close()


def tampered(data: bytes, edit: Callable[[dict], None]) -> bytes:
    """The same metadata with its signed part edited (signatures now wrong)."""
    doc = json.loads(data)
    edit(doc["signed"])
    return json.dumps(doc).encode()


def bin_of(env: Env, target: str) -> str:
    return all_targets(env.repo)[target]["bin"]
