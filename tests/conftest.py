"""Shared fixtures: a small signed repository of real distributions, served on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.repository import Repository
from proxy.repository.sample import build_sdist, build_wheel
from tests.support.seaweed import Seaweed
from tests.support.upstream import Upstream


@dataclass
class SampleRepo:
    repo: Repository
    dists: list[Path]

    @property
    def root_bytes(self) -> bytes:
        return (self.repo.metadata_dir / "1.root.json").read_bytes()

    @property
    def metadata_prefix(self) -> str:
        """URL path of the metadata directory on the upstream, e.g. ``/metadata/``."""
        return "/" + self.repo.profile.metadata_path


def make_sample_dists(dest: Path) -> list[Path]:
    """A dependency chain (app → lib → base), an sdist, and a Requires-Python'd wheel."""
    return [
        build_wheel(dest, "app", "1.0", requires=["lib>=1.0"]),
        build_wheel(dest, "lib", "1.0", requires=["base"]),
        build_wheel(dest, "lib", "1.1", requires=["base"]),
        build_wheel(dest, "base", "2.0"),
        build_sdist(dest, "base", "2.0"),
        build_wheel(dest, "future-only", "1.0", requires_python=">=4"),
    ]


@pytest.fixture
def layout(request: pytest.FixtureRequest) -> str:
    """The repository layout (profile); parametrise indirectly to run a test in every layout."""
    return getattr(request, "param", "tufproxy")


@pytest.fixture
def sample_repo(tmp_path: Path, layout: str) -> SampleRepo:
    repo = Repository.init(tmp_path / "repo", bins=16, layout=layout)
    dists = make_sample_dists(tmp_path / "dists")
    repo.add(dists)
    return SampleRepo(repo, dists)


@pytest.fixture
def upstream(sample_repo: SampleRepo):
    with Upstream(sample_repo.repo.public_dir) as up:
        yield up


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    """One SeaweedFS per session (``weed`` from the test extra); each test uses its own prefix of the bucket."""
    server = Seaweed(tmp_path_factory.mktemp("seaweed")).start()
    try:
        yield server
    finally:
        server.stop()
