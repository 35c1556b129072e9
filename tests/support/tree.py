"""Read a signed tree the way an auditor would: straight from its metadata files."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tuf.api.metadata import Metadata, MetaFile, Timestamp

from proxy.protocol import index
from proxy.repository import Repository
from proxy.repository.keys import ONLINE


def all_targets(repo: Repository) -> dict[str, dict]:
    """Every target in every bin of the current snapshot: bin, hashes, length."""
    snapshot_version = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes()).signed.snapshot_meta.version
    snapshot = Metadata.from_bytes((repo.metadata_dir / f"{snapshot_version}.snapshot.json").read_bytes()).signed
    found = {}
    for name, meta in snapshot.meta.items():
        if re.fullmatch(r"bins?-[0-9a-f]+\.json", name):
            md = Metadata.from_bytes((repo.metadata_dir / f"{meta.version}.{name}").read_bytes())
            for path, info in md.signed.targets.items():
                found[path] = {"bin": name[:-5], "hashes": info.hashes, "length": info.length}
    return found


def signed_timestamp(repo: Repository, *, snapshot_version: int | None = None, version_bump: int = 1,
                     expires_delta=None) -> bytes:
    """A timestamp signed with the repository's real online key, pointing where the test says.

    What a thief of the online key, or a replaying mirror, could serve.
    """
    current = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes()).signed
    expires = current.expires if expires_delta is None else current.expires + expires_delta
    ts = Metadata(Timestamp(
        version=current.version + version_bump, expires=expires,
        snapshot_meta=MetaFile(version=current.snapshot_meta.version if snapshot_version is None else snapshot_version),
    ))
    ts.sign(repo.keys.load(ONLINE))
    return ts.to_bytes()


def vouched_sha256s(repo: Repository) -> set[str]:
    """Every sha256 the repository vouches for: signed targets, and files its signed pages list."""
    found = set()
    for path, info in all_targets(repo).items():
        digest = next(iter(info["hashes"].values()))
        if "sha256" in info["hashes"]:
            found.add(info["hashes"]["sha256"])
        if path.startswith(("packages/", "simple/index.")):
            continue
        data = repo.served_path(path, digest).read_bytes()
        project = path.split("/")[1] if path.startswith("simple/") else path
        page = index.parse_project_json(data, project) if path.endswith(".json") else index.parse_project_html(data, project)
        for f in page.files:
            found.add(f.hashes["sha256"])
            if isinstance(f.core_metadata, dict):
                found.add(f.core_metadata["sha256"])
    return found


def assert_cache_clean(cache_dir: Path, repo: Repository) -> None:
    """Every blob in the proxy's cache is bytes the repository vouches for; no temp file is left."""
    signed = vouched_sha256s(repo)
    for p in (cache_dir / "blobs").rglob("*"):
        if p.is_file():
            assert hashlib.sha256(p.read_bytes()).hexdigest() == p.name, f"blob {p} is not what its name says"
            assert p.name in signed, f"blob {p} is not a signed target"
    tmp = cache_dir / "tmp"
    assert not tmp.exists() or not any(tmp.iterdir()), f"temp files left: {list(tmp.iterdir())}"
