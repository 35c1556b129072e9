"""The signer writes a PEP 458 repository that python-tuf's own client accepts."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api import exceptions as tuf_exc
from tuf.api.metadata import Metadata, Root

from proxy.protocol import index
from proxy.protocol.layout import PageFormat, consistent_name, core_metadata_target, file_target, project_page_target
from proxy.repository import Repository
from proxy.repository.keys import KeyStore
from tests.conftest import SampleRepo
from tests.support.net import free_port, wait_for_port
from tests.support.tree import all_targets, signed_timestamp
from tests.support.tufclient import reference_updater
from tests.support.upstream import Upstream


def expected_targets(dists: list[Path]) -> set[str]:
    paths = {"simple/index.html", "simple/index.json"}
    for d in dists:
        project = d.name.split("-")[0].replace("_", "-")
        paths.add(file_target(project, d.name))
        paths |= {project_page_target(project, f) for f in PageFormat}
        if d.name.endswith(".whl"):
            paths.add(core_metadata_target(project, d.name))
    return paths


@pytest.mark.slow
def test_reference_client_accepts_every_target(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    updater = reference_updater(tmp_path / "client", upstream.url, sample_repo.root_bytes)
    updater.refresh()
    targets = all_targets(sample_repo.repo)
    assert set(targets) == expected_targets(sample_repo.dists)
    for path in targets:
        info = updater.get_targetinfo(path)
        assert info is not None, path
        local = updater.download_target(info)
        assert Path(local).read_bytes() == (sample_repo.repo.public_dir / path).read_bytes()
    # Consistent snapshots: the reference client asked only for versioned metadata and hash-named targets.
    for p in upstream.requests:
        name = p.rsplit("/", 1)[1]
        assert name == "timestamp.json" or name.split(".", 1)[0].isdigit() or len(name.split(".", 1)[0]) == 64, p


def test_targets_carry_sha256_and_sha512_and_every_hash_name_exists(sample_repo: SampleRepo) -> None:
    for path, info in all_targets(sample_repo.repo).items():
        assert list(info["hashes"]) == ["sha256", "sha512"]
        data = (sample_repo.repo.public_dir / path).read_bytes()
        assert info["hashes"]["sha256"] == hashlib.sha256(data).hexdigest()
        for digest in info["hashes"].values():
            assert (sample_repo.repo.public_dir / consistent_name(path, digest)).read_bytes() == data


def test_bin_assignment_follows_tap15(sample_repo: SampleRepo) -> None:
    bits = int(math.log2(sample_repo.repo.settings.bins))
    width = math.ceil(bits / 4)
    for path, info in all_targets(sample_repo.repo).items():
        prefix = int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "big") >> (32 - bits)
        assert info["bin"] == f"bin-{prefix:0{width}x}", path


def test_pages_list_files_with_hashes_requires_python_and_core_metadata(sample_repo: SampleRepo) -> None:
    public = sample_repo.repo.public_dir
    page = index.parse_project_json((public / "simple/future-only/index.json").read_bytes(), "future-only")
    (f,) = page.files
    wheel = next(d for d in sample_repo.dists if d.name.startswith("future_only"))
    assert f.hashes["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f.requires_python == ">=4"
    assert f.size == wheel.stat().st_size
    meta = (public / core_metadata_target("future-only", wheel.name)).read_bytes()
    assert f.core_metadata == {"sha256": hashlib.sha256(meta).hexdigest()}
    assert b"Requires-Python: >=4" in meta
    html = (public / "simple/future-only/index.html").read_bytes()
    assert b'data-requires-python="&gt;=4"' in html
    assert f'href="../../packages/future-only/{wheel.name}#sha256='.encode() in html
    assert index.parse_project_list_json((public / "simple/index.json").read_bytes()).projects == (
        "app", "base", "future-only", "lib")
    assert index.parse_project_json((public / "simple/lib/index.json").read_bytes(), "lib").versions == ("1.0", "1.1")


def test_tampered_target_is_refused_by_reference_client(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    target = file_target("base", "base-2.0-py3-none-any.whl")
    updater = reference_updater(tmp_path / "client", upstream.url, sample_repo.root_bytes)
    info = updater.get_targetinfo(target)
    assert info is not None
    good = (sample_repo.repo.public_dir / target).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same length: only the hash check catches it
    upstream.replace(".*/[0-9a-f]{64}\\.base-2\\.0-py3-none-any\\.whl", bytes(bad))
    with pytest.raises(tuf_exc.LengthOrHashMismatchError):
        updater.download_target(info)


def test_rolled_back_snapshot_is_refused_by_reference_client(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    updater = reference_updater(tmp_path / "client", upstream.url, sample_repo.root_bytes)
    updater.refresh()
    current = Metadata.from_bytes((sample_repo.repo.metadata_dir / "timestamp.json").read_bytes()).signed.snapshot_meta.version
    upstream.replace("/metadata/timestamp.json", signed_timestamp(sample_repo.repo, snapshot_version=current - 1))
    again = reference_updater(tmp_path / "client", upstream.url, sample_repo.root_bytes)
    with pytest.raises(tuf_exc.BadVersionNumberError):
        again.refresh()


def test_expired_timestamp_is_refused_by_reference_client(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=4, now=datetime.now(UTC) - timedelta(days=2))
    with Upstream(repo.public_dir) as up:
        updater = reference_updater(tmp_path / "client", up.url, (repo.metadata_dir / "1.root.json").read_bytes())
        with pytest.raises(tuf_exc.ExpiredMetadataError, match="timestamp"):
            updater.refresh()


def test_plain_http_server_serves_a_tree_the_reference_client_accepts(sample_repo: SampleRepo, tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(sample_repo.repo.public_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for_port(port, server)
        updater = reference_updater(tmp_path / "client", url, sample_repo.root_bytes)
        updater.refresh()
        info = updater.get_targetinfo("simple/app/index.html")
        assert info is not None
        assert (
            Path(updater.download_target(info)).read_bytes()
            == (sample_repo.repo.public_dir / "simple/app/index.html").read_bytes()
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_batch_reads_the_online_key_once_however_many_roles_it_signs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repository.init(tmp_path / "g", bins=64, layout="gateway", clock_versions=True)
    reads: list[str] = []
    original = KeyStore.load_file

    def counting(self: KeyStore, name: str) -> CryptoSigner:
        reads.append(name)
        return original(self, name)

    monkeypatch.setattr(KeyStore, "load_file", counting)
    report = repo.publish_pages({f"p{i}": index.ProjectPage(name=f"p{i}", files=()) for i in range(8)})
    online = [role for role in report.signed if role in ("timestamp", "snapshot") or role.startswith("bin-")]
    assert len(online) > 4 and reads == ["online"]
    root = Metadata[Root].from_bytes((repo.metadata_dir / "1.root.json").read_bytes()).signed
    timestamp = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes())
    root.verify_delegate("timestamp", timestamp.signed_bytes, timestamp.signatures)


def test_a_signer_reusing_its_parsed_metadata_loses_no_other_writers_publish_and_keeps_no_failed_edit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway's batch takes the timestamp, snapshot and bins its last commit wrote as objects, not files
    (Repository._take); another process's publish in between, or a commit that failed half-way, must not
    leave a page out or put an edit in that no file holds."""
    from proxy.repository import signer
    from proxy.util.atomic import Batch

    gateway = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    other = Repository.open(tmp_path / "g")  # another process signing the same tree
    fmt = gateway.profile.signed_formats[0]
    change = signer._Change(gateway, datetime.now(UTC))
    by_bins: dict[tuple[str, ...], list[str]] = {}
    for n in range(2000):
        bins = tuple(change.bin_for(gateway.profile.page_target(f"p{n}", f)) for f in gateway.profile.signed_formats)
        by_bins.setdefault(bins, []).append(f"p{n}")
    a, b, c, d, e, f, g = next(names for names in by_bins.values() if len(names) >= 7)[:7]  # the same bins for all

    def page(name: str) -> index.ProjectPage:
        return index.ProjectPage(name=name, files=())

    gateway.publish_pages({a: page(a)})
    parsed: list[str] = []
    real_parse = Repository._parse
    monkeypatch.setattr(Repository, "_parse", lambda self, name: parsed.append(name) or real_parse(self, name))
    gateway.publish_pages({b: page(b)})
    assert gateway.publish_pages({b: page(b)}).unchanged == [b]  # nothing to sign: what it read is kept too
    gateway.publish_pages({g: page(g)})
    assert not [n for n in parsed if n.endswith((".snapshot.json", ".bins.json")) or ".bin-" in n], parsed
    other.publish_pages({c: page(c)})  # re-signs the bin, the snapshot and the timestamp
    gateway.publish_pages({d: page(d)})  # must start from the other's bin, not its own last one
    real_commit = Batch.commit

    def full_disk(batch: Batch, path: Path, data: bytes, *args: object, **kwargs: object) -> None:
        if path.name == "timestamp.json":
            raise OSError(28, "No space left on device")
        real_commit(batch, path, data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Batch, "commit", full_disk)
    with pytest.raises(OSError):
        gateway.publish_pages({e: page(e)})  # edits the bin and the snapshot in memory, commits nothing
    monkeypatch.setattr(Batch, "commit", real_commit)
    gateway.publish_pages({f: page(f)})
    signed = {path for path in all_targets(gateway) if path.startswith("simple/")}
    assert signed == {gateway.profile.page_target(p, f2) for p in (a, b, c, d, f, g)
                      for f2 in gateway.profile.signed_formats}
    with Upstream(gateway.public_dir) as up:
        client = reference_updater(tmp_path / "client", up.url, (gateway.metadata_dir / "1.root.json").read_bytes())
        client.refresh()
        for p in (a, b, c, d, f, g):
            assert client.get_targetinfo(gateway.profile.page_target(p, fmt)) is not None, p
        assert client.get_targetinfo(gateway.profile.page_target(e, fmt)) is None
