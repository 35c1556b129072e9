"""The gateway's own state, lost, damaged, truncated or restored (issue 27).

Real ``tufproxy gateway`` processes on 127.0.0.1 over a local index that
changes its answers between requests; edges are real ``tufproxy serve``
processes.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.gateway.files import FileSource
from proxy.gateway.ledger import Ledger, Pin
from proxy.gateway.listing import IndexClient
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.publisher import Publisher
from proxy.gateway.service import Gateway
from proxy.protocol import index
from proxy.protocol.errors import TrustError
from proxy.protocol.model import digest
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.storage.audit import AuditLog
from proxy.storage.downloads import Download
from proxy.storage.store import Blob
from proxy.transport.local import LocalFetcher
from proxy.trust.fetch import Want
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex


def http_status(url: str, timeout: float = 20) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# A gateway that refreshes pages every 0.4 s and signs batches at once.
FAST = ("--page-ttl", "0.4", "--batch-window", "0.05")


def with_wheels(dists: Path, *releases: tuple[str, str]) -> TestIndex:
    index = TestIndex()
    for name, version in releases:
        index.add(build_wheel(dists, name, version))
    return index


def gateway_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "gateway", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def fresh_gateway(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialised gateway directory; tests copy it."""
    directory = tmp_path_factory.mktemp("fresh") / "gw"
    gateway_init(directory)
    return directory


@pytest.fixture
def gw_dir(tmp_path: Path, fresh_gateway: Path) -> Path:
    """A copy of the initialised gateway directory, as ``tmp_path / "gw"``."""
    shutil.copytree(fresh_gateway, tmp_path / "gw")
    return tmp_path / "gw"


@pytest.mark.slow
@pytest.mark.parametrize("name, damage", [("timestamp.json", b""), ("timestamp.json", b"junk\n"),
                                          ("root.json", b'{"signed": 7}'), ("1.bin-3.json", b"junk\n")])
def test_a_damaged_metadata_file_at_start_up_is_named_in_one_line(tmp_path: Path, gw_dir: Path, name: str,
                                                                  damage: bytes) -> None:
    path = tmp_path / "gw" / "public" / "metadata" / name
    path.write_bytes(damage)
    r = gateway_cli("serve", str(tmp_path / "gw"), "--index-url", "http://127.0.0.1:9/simple/", "--listen", "127.0.0.1:0")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(path) in lines[0] and "damaged" in lines[0] and "internal" not in lines[0], lines[0]


# -- item 1: a cooldown the index's clock cannot fake ---------------------------------------

def _ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def signed_files(gw: GatewayProcess, project: str) -> set[str]:
    """The files of ``project``'s signed page, as the gateway serves it."""
    req = urllib.request.Request(f"{gw.base}simple/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return {f["filename"] for f in json.loads(r.read())["files"]}


def refreshed(index: TestIndex, project: str, times: int = 2) -> None:
    """Wait until the gateway has fetched ``project``'s page ``times`` more times (its refreshes)."""
    path = f"/simple/{project}/"
    start = index.requests.count(path)
    wait_for(lambda: index.requests.count(path) >= start + times, f"{times} refreshes of {project}", timeout=20)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["yes", "no", "all"])
def test_cooldown_counts_from_first_sight_not_the_index_claim(tmp_path: Path, gw_dir: Path, mode: str) -> None:
    dists = tmp_path / "dists"
    with TestIndex() as index, GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--min-release-age", "7d",
                                              "--first-seen-cooldown", mode, "--page-ttl", "0.4",
                                              "--batch-window", "0.05") as gw:
        index.add(build_wheel(dists, "cool", "1.0"), upload_time=_ago(400))
        assert gw.publish("cool")[0] == 200
        # A project's first listing is the index's word, unless the site asked for 'all'.
        assert signed_files(gw, "cool") == (set() if mode == "all" else {"cool-1.0-py3-none-any.whl"})
        # A file the index adds now but claims was uploaded last year.
        index.add(build_wheel(dists, "cool", "2.0"), upload_time=_ago(300))
        # A file the index adds as new (hidden), then claims was uploaded last year.
        moved = index.add(build_wheel(dists, "cool", "3.0"), upload_time=_ago(0))
        refreshed(index, "cool")
        moved.upload_time = _ago(300)
        refreshed(index, "cool")
        files = signed_files(gw, "cool")
        assert "cool-3.0-py3-none-any.whl" not in files  # hidden when first seen: remembered, whatever the claim
        assert ("cool-2.0-py3-none-any.whl" in files) == (mode == "no"), files
        hidden = [r for r in gw.audit() if r.get("reason") == "policy-hidden"]
        assert hidden and "cool-3.0-py3-none-any.whl" in hidden[-1]["hidden_files"]
        if mode == "yes":
            assert hidden[-1]["rules"].get("first-seen") == 2, hidden[-1]
        policy = gateway_cli("policy", str(tmp_path / "gw")).stdout
        assert f"first-seen-cooldown: {mode} (" in policy
    # The ledger remembers every file listed, hidden ones included.
    seen = [e for e in json.loads(gateway_cli("ledger", str(tmp_path / "gw"), "--json").stdout) if e["kind"] == "seen"]
    assert {e["filename"] for e in seen} == {f"cool-{v}-py3-none-any.whl" for v in ("1.0", "2.0", "3.0")}


# -- item 2: the signed pages are a second record of every pin -------------------------------

def signed_hashes(gw: GatewayProcess, project: str) -> dict[str, str]:
    req = urllib.request.Request(f"{gw.base}simple/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return {f["filename"]: f["hashes"]["sha256"] for f in json.loads(r.read())["files"]}


def swap(index: TestIndex, filename: str, dists: Path) -> None:
    """The index serves other bytes under ``filename`` (and lists their hash)."""
    other = build_wheel(dists / "other", filename.split("-")[0], filename.split("-")[1], requires=["something-else"])
    index.file(filename).data = other.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "truncated", "junk"])
def test_a_lost_ledger_is_rebuilt_from_the_signed_pages_and_a_swap_is_refused(
        tmp_path: Path, gw_dir: Path, damage: str) -> None:
    dists = tmp_path / "dists"
    ledger = gw_dir / "gateway" / "ledger.jsonl"
    wheel = "pinned-1.0-py3-none-any.whl"
    with with_wheels(dists, ("pinned", "1.0"), ("other", "1.0")) as index:
        flags = ("--index-url", index.url, *FAST)
        with GatewayProcess(gw_dir, *flags) as gw:
            assert gw.publish("pinned")[0] == 200 and gw.publish("other")[0] == 200
            signed = signed_hashes(gw, "pinned")
        if damage == "deleted":
            ledger.unlink()
        elif damage == "truncated":
            ledger.write_bytes(ledger.read_bytes()[: len(ledger.read_bytes()) // 3])
        else:
            ledger.write_bytes(b"junk one\n" + ledger.read_bytes().replace(b'"kind": "pin"', b'"kind": 7') + b"\x00\xff\n")
        swap(index, wheel, dists)
        with GatewayProcess(tmp_path / "gw", *flags) as gw:
            refreshed(index, "pinned")
            # The pin was rebuilt from the signed page: the index's new bytes are refused, never signed.
            assert signed_hashes(gw, "pinned") == signed
            changed = [r for r in gw.audit() if r.get("reason") == "upstream-changed-file"]
            assert changed and changed[0]["target"] == f"packages/pinned/{wheel}"
            log = gw.log()
    warnings = [line for line in log.splitlines() if "ledger" in line and "WARNING" in line]
    if damage == "deleted":
        assert any("is missing: rebuilt 2 pin(s) of 2 project(s) from the signed pages" in w for w in warnings), log
    elif damage == "truncated":
        assert any("lacks" in w and "rebuilt them from the signed pages" in w for w in warnings), log
    else:
        assert any("4 line(s) are not records and were skipped: line 1 (b'junk one')" in w for w in warnings), log
        assert any("rebuilt them from the signed pages" in w for w in warnings), log


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["rewritten", "cut-short"])
def test_a_kept_file_is_checked_against_its_pin_before_it_is_served(tmp_path: Path, gw_dir: Path, damage: str) -> None:
    """A kept file altered or cut short on the volume is caught at the next process's first serve, refetched,
    and recorded as our storage's fault, not the index's."""
    dists = tmp_path / "dists"
    with TestIndex() as index:
        path = build_wheel(dists, "kept", "1.0")
        index.add(path)
        flags = ("--index-url", index.url, "--batch-window", "0.05")
        url_path = "packages/kept/kept-1.0-py3-none-any.whl"
        with GatewayProcess(tmp_path / "gw", *flags) as gw:
            assert gw.publish("kept")[0] == 200
            assert urllib.request.urlopen(gw.base + url_path, timeout=20).read() == path.read_bytes()
        kept = tmp_path / "gw" / "public" / url_path
        assert kept.read_bytes() == path.read_bytes()
        if damage == "rewritten":
            kept.write_bytes(b"rewritten on the volume" + path.read_bytes()[23:])
        else:
            kept.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
        with GatewayProcess(tmp_path / "gw", *flags) as gw:
            assert urllib.request.urlopen(gw.base + url_path, timeout=20).read() == path.read_bytes()
            records = [r for r in gw.audit() if r.get("reason") == "kept-file-changed" and r.get("target") == url_path]
            assert [r["fault"] for r in records] == ["ours"], records
    assert kept.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("algorithm", ["sha256", "sha384", "sha512", "blake2b-256"])
def test_a_kept_file_is_checked_whatever_hash_its_pin_names(tmp_path: Path, algorithm: str) -> None:
    """The first serve in a process re-checks a kept file, whichever accepted hash the index gave: a file cut to
    nothing or with a byte changed is removed, never served, and recorded as our storage's fault."""
    data = b"a wheel's bytes " * 1000
    pin = Pin("p", "p-1.0-py3-none-any.whl", {algorithm: digest(algorithm, data)}, len(data),
              "https://index.example/simple/", "https://files.index.example/p-1.0-py3-none-any.whl")
    target = "packages/p/p-1.0-py3-none-any.whl"
    path = tmp_path / target
    path.parent.mkdir(parents=True)
    audit = tmp_path / "audit.jsonl"
    log = AuditLog(audit)
    for damaged in (None, b"", data[:-1] + b"!"):
        # A process of its own each time (what it checked is per process): the first serve after a start.
        files = FileSource(tmp_path, None, None, log, GatewayMetrics(), 2**30)  # type: ignore[arg-type]
        path.write_bytes(data if damaged is None else damaged)
        assert asyncio.run(files._kept(path, target, pin, core=False)) is (damaged is None)
        assert path.exists() is (damaged is None)
    log.close()
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["reason"], r["fault"], r["target"]) for r in records] == [("kept-file-changed", "ours", target)] * 2


KEPT_TARGET = "packages/p/p-1.0-py3-none-any.whl"


def _index_of_one(tmp_path: Path, data: bytes) -> tuple[LocalFetcher, str, Path]:
    """A local index serving ``data`` as p-1.0's wheel: its fetcher, the file's URL, and where the gateway keeps it."""
    index = tmp_path / "index"
    index.mkdir()
    (index / "p-1.0-py3-none-any.whl").write_bytes(data)
    fetcher = LocalFetcher(index)
    return fetcher, f"{fetcher.base_url()}p-1.0-py3-none-any.whl", tmp_path / "public" / KEPT_TARGET


def _fetch_kept(files: FileSource, fetcher: LocalFetcher, url: str, path: Path,
                data: bytes) -> tuple[Download, asyncio.Future[Blob]]:
    """The gateway's fetch of :func:`_index_of_one`'s file, in flight as a request would start it."""
    download = Download(KEPT_TARGET, Want(KEPT_TARGET, {"sha256": digest("sha256", data)}, len(data), True, "pin"))
    task = asyncio.ensure_future(files._fetch(download, fetcher, [url], path, None, "test"))
    files._inflight.add(download, task)
    return download, task


def test_a_kept_file_is_on_disk_before_its_name_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's bucket copy (``--store``) uploads kept files from disk without checking them against their
    pins, so each is fsynced before the rename that names it (files.py); the edge's blobs need not be."""
    data = b"a kept wheel's bytes " * 4000
    fetcher, url, path = _index_of_one(tmp_path, data)
    target = KEPT_TARGET
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real(fd))[1])
    log = AuditLog(tmp_path / "audit.jsonl")
    files = FileSource(tmp_path / "public", None, None, log, GatewayMetrics(), 2**30)  # type: ignore[arg-type]

    async def keep() -> None:
        want = Want(target, {"sha256": digest("sha256", data)}, len(data), True, "pin")
        await files._fetch(Download(target, want), fetcher, [url], path,
                           None, "test")
    asyncio.run(keep())
    log.close()
    assert path.read_bytes() == data and os.stat(path).st_ino in synced
    assert not [p for p in path.parent.iterdir() if p != path]  # no temp file left


@pytest.mark.parametrize("fsync", ["slow", "failing"])
def test_a_verified_files_readers_do_not_wait_for_its_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             fsync: str) -> None:
    """The last bytes go out once the body verified; the fsync and rename that keep it follow. Kept, the file
    is taken for checked (it holds what was just verified); not kept (the fsync failed), the answer stands and
    the next request fetches again."""
    data = b"a big wheel's bytes " * 50_000
    fetcher, url, path = _index_of_one(tmp_path, data)
    target = KEPT_TARGET
    pin = Pin("p", "p-1.0-py3-none-any.whl", {"sha256": digest("sha256", data)}, len(data),
              "https://index.example/simple/", "https://files.index.example/p-1.0-py3-none-any.whl")
    gate = threading.Event()
    real = os.fsync

    def held_fsync(fd: int) -> None:
        if not gate.wait(20):
            raise AssertionError("the test never released the fsync")
        if fsync == "failing":
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    log = AuditLog(tmp_path / "audit.jsonl")
    files = FileSource(tmp_path / "public", None, None, log, GatewayMetrics(), 2**30)  # type: ignore[arg-type]

    async def scenario() -> None:
        download = Download(target, Want(target, dict(pin.hashes), len(data), True, "pin"))
        task = asyncio.ensure_future(files._fetch(download, fetcher, [url],
                                                  path, None, "test"))
        files._inflight.add(download, task)
        blob = await asyncio.wait_for(asyncio.shield(download.result), 20)
        assert (blob.size, blob.path) == (len(data), path)
        assert not task.done() and not path.exists()  # answered while the fsync is still held
        fd = download.open()
        assert fd is not None
        try:
            assert os.pread(fd, len(data) + 1, 0) == data  # what a reader sends: every byte, verified
        finally:
            os.close(fd)
        gate.set()
        await files.close()  # what a stopping gateway waits for: the keep of what it answered
        assert path.exists() is (fsync == "slow")
        failed = (await asyncio.gather(task, return_exceptions=True))[0]
        assert isinstance(failed, OSError) is (fsync == "failing")
        assert download.result.result() is blob  # a failure after it does not take the answer back

    asyncio.run(scenario())
    log.close()
    assert not [p for p in path.parent.iterdir() if p != path]  # no temp file left
    if fsync == "slow":
        assert path.read_bytes() == data
        monkeypatch.setattr("proxy.gateway.files.file_digest", lambda *a: pytest.fail("hashed again"))
        assert asyncio.run(files._kept(path, target, pin, core=False))
    else:
        assert not path.exists()


def test_a_write_the_filesystem_reports_failed_is_never_answered(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A network filesystem reports a failed write at a close (and may drop its pages): the gateway asks for that
    before any reader is told the file verified, so none completes it, and nothing is kept."""
    data = b"a kept wheel's bytes " * 4000
    fetcher, url, path = _index_of_one(tmp_path, data)

    def failed(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("proxy.gateway.files._written", failed)
    log = AuditLog(tmp_path / "audit.jsonl")
    files = FileSource(tmp_path / "public", None, None, log, GatewayMetrics(), 2**30)  # type: ignore[arg-type]

    async def scenario() -> None:
        download, task = _fetch_kept(files, fetcher, url, path, data)
        with pytest.raises(OSError):
            await task
        with pytest.raises(OSError):  # what a reader hears: never the whole file
            await asyncio.wait_for(asyncio.shield(download.result), 20)

    asyncio.run(scenario())
    log.close()
    assert not path.parent.exists() or not list(path.parent.iterdir())  # nothing kept, no temp file left


def test_an_fsync_that_never_returns_holds_a_stop_no_longer_than_its_bound(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that hangs the keep's fsync: close() gives up after CLOSE_WAIT and the event loop's run ends,
    since the fsync runs in a thread of its own that nothing joins (asyncio's default executor would be)."""
    data = b"a kept wheel's bytes " * 4000
    fetcher, url, path = _index_of_one(tmp_path, data)
    hung = threading.Event()
    monkeypatch.setattr(os, "fsync", lambda fd: hung.wait())
    monkeypatch.setattr("proxy.gateway.files.CLOSE_WAIT", 0.2)
    log = AuditLog(tmp_path / "audit.jsonl")
    files = FileSource(tmp_path / "public", None, None, log, GatewayMetrics(), 2**30)  # type: ignore[arg-type]

    async def stop_while_hung() -> None:
        download, _ = _fetch_kept(files, fetcher, url, path, data)
        await asyncio.wait_for(asyncio.shield(download.result), 20)  # answered: the keep's fsync now hangs
        await files.close()

    stopped = threading.Thread(target=asyncio.run, args=(stop_while_hung(),))
    try:
        stopped.start()
        stopped.join(20)
        assert not stopped.is_alive() and not hung.is_set()
    finally:
        hung.set()
        log.close()
    assert not path.exists()  # never named: its fsync did not return


def test_a_fetch_started_while_a_keep_runs_never_writes_into_its_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A verified file still being kept (its fsync slow) and a new fetch of the same file whose index now lies:
    each writes a temp file of its own, so the first one's readers still send the verified bytes, the lie is
    refused, and what is kept is the verified file."""
    data = b"a kept wheel's bytes " * 20_000
    fetcher, url, path = _index_of_one(tmp_path, data)
    target = KEPT_TARGET
    gate = threading.Event()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (gate.wait(20), real(fd))[1])
    log = AuditLog(tmp_path / "audit.jsonl")
    files = FileSource(tmp_path / "public", None, None, log, GatewayMetrics(), 2**30)  # type: ignore[arg-type]
    want = Want(target, {"sha256": digest("sha256", data)}, len(data), True, "pin")

    async def scenario() -> None:
        first = Download(target, want)
        task = asyncio.ensure_future(files._fetch(first, fetcher, [url], path, None, "test"))
        await asyncio.wait_for(asyncio.shield(first.result), 20)
        (tmp_path / "index" / "p-1.0-py3-none-any.whl").write_bytes(b"X" * len(data))  # the index lies from now on
        with pytest.raises(TrustError):
            await files._fetch(Download(target, want), fetcher, [url], path, None, "test")
        fd = first.open()
        assert fd is not None
        try:
            assert os.pread(fd, len(data) + 1, 0) == data
        finally:
            os.close(fd)
        gate.set()
        await task

    asyncio.run(scenario())
    log.close()
    assert path.read_bytes() == data
    assert not [p for p in path.parent.iterdir() if p != path]  # no temp file left


def test_a_pages_pins_are_on_disk_before_the_timestamp_that_publishes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A miss appends its page's pins without an fsync of their own (on the loop, one per page); the signing batch
    that publishes the page flushes the ledger with its files, before its commit point."""
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    ledger = Ledger(tmp_path / "ledger")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    ledger_file = lambda: ledger.path.exists() and os.stat(ledger.path).st_ino  # noqa: E731 - made below
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(
        "ledger fsync" if os.fstat(fd).st_ino == ledger_file() else "fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(f"replace {Path(b).name}"), real_replace(a, b))[1])
    ledger.append([{"kind": "pin", "project": "p", "filename": "p-1.0-py3-none-any.whl", "hashes": {"sha256": "a" * 64},
                    "size": 1, "core_metadata": None, "index": "https://index.example/simple/", "url": None}],
                  durable=False)
    assert "ledger fsync" not in events
    publisher = Publisher(repo, window=0.01, flush_also=(ledger.path,))

    async def publish(project: str = "p") -> None:
        publisher.start()
        try:
            await publisher.publish({project: index.ProjectPage(name=project, files=())})
        finally:
            await publisher.stop()
    asyncio.run(publish())
    assert events.index("ledger fsync") < events.index("replace timestamp.json")
    pin = ledger.pins.get(("p", "p-1.0-py3-none-any.whl"))
    assert pin is not None and pin.hashes == {"sha256": "a" * 64}
    # A batch that signs nothing (the page unchanged) still makes what was appended for it durable.
    events.clear()
    asyncio.run(publish())
    assert "ledger fsync" in events and "replace timestamp.json" not in events
    # A ledger that is not there (nothing appended yet, or removed) fails no batch.
    ledger.path.unlink()
    publisher = Publisher(repo, window=0.01, flush_also=(ledger.path,))
    events.clear()
    asyncio.run(publish("q"))
    assert "replace timestamp.json" in events


def test_a_gateway_has_its_publisher_flush_the_ledger_it_appends_pins_to_unsynced(tmp_path: Path) -> None:
    """The wiring of the test above: whoever builds a Gateway, its publisher's batches flush its ledger."""
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    ledger = Ledger(tmp_path / "ledger")
    publisher = Publisher(repo, window=0.01)
    log = AuditLog(tmp_path / "audit.jsonl")
    Gateway(IndexClient(None), ledger, publisher, log, GatewayMetrics())  # type: ignore[arg-type]
    Gateway(IndexClient(None), ledger, publisher, log, GatewayMetrics())  # type: ignore[arg-type]
    log.close()
    assert publisher.flush_also == (ledger.path,)


# -- item 4: a restore from an older backup under running edges ------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("when", ["at-start-up", "while-serving"])
def test_a_restore_from_backup_under_running_edges_keeps_them_serving(tmp_path: Path, gw_dir: Path, when: str) -> None:
    dists = tmp_path / "dists"
    directory = gw_dir
    with TestIndex() as index:
        for name in ("early", "late", "after"):
            index.add(build_wheel(dists, name, "1.0"))
        flags = ("--index-url", index.url, "--batch-window", "0.05", "--page-ttl", "2")
        gw = GatewayProcess(directory, *flags).start()
        edge = ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                            "--workers", "1", "--refresh-interval", "0.5")
        with edge:
            try:
                assert http_status(f"{edge.url}early/") == 200
                # The backup: what an operator copies (README's table), taken now.
                backup = tmp_path / "backup"
                # A running gateway's tree: its atomic writes' temp files may vanish mid-copy and are no state.
                shutil.copytree(directory / "public", backup / "public", ignore=shutil.ignore_patterns(".*.tmp"))
                shutil.copy2(directory / "gateway" / "ledger.jsonl", backup / "ledger.jsonl")
                assert http_status(f"{edge.url}late/") == 200  # signed after the backup; the edge trusts its bins
                if when == "at-start-up":
                    gw.stop()
                shutil.copytree(backup / "public", tmp_path / "restoring")
                (directory / "public").rename(tmp_path / "replaced")
                (tmp_path / "restoring").rename(directory / "public")
                shutil.copy2(backup / "ledger.jsonl", directory / "gateway" / "ledger.jsonl")
                if when == "at-start-up":
                    port, gw = gw.port, GatewayProcess(directory, *flags)
                    gw.port = port  # where the edges look for it
                    gw.start()
                # The edges keep serving what they had, and what the restored gateway publishes next.
                assert http_status(f"{edge.url}early/") == 200
                wait_for(lambda: http_status(f"{edge.url}after/") == 200, "the edge serving a new project", timeout=20)
                assert http_status(f"{edge.url}late/") == 200
                assert "rollback" not in edge.log() or when == "while-serving"
            finally:
                gw.stop()
    restored = [line for line in gw.log().splitlines() if "restored from an older copy" in line]
    assert len(restored) == 1 and "every online role, " in restored[0], gw.log()


# -- item 3: a revocation after the ledger was truncated or replaced -------------------------

@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_revocation_after_the_ledger_was_truncated_is_applied_and_confirmed(
        tmp_path: Path, gw_dir: Path, damage: str) -> None:
    ledger = gw_dir / "gateway" / "ledger.jsonl"
    bad = "bad-1.0-py3-none-any.whl"
    with with_wheels(tmp_path / "dists", ("bad", "1.0"), ("bad", "0.9")) as index, \
            GatewayProcess(gw_dir, "--index-url", index.url, *FAST) as gw:
        assert gw.publish("bad")[0] == 200
        assert bad in signed_files(gw, "bad")
        if damage == "truncated":
            with open(ledger, "r+b") as f:
                f.truncate(0)
        else:
            ledger.with_name("new.jsonl").write_bytes(b"")
            ledger.with_name("new.jsonl").replace(ledger)
        r = gateway_cli("revoke", str(tmp_path / "gw"), "bad", bad, "--reason", "malware", "--wait", "20")
        assert r.returncode == 0, r.stderr
        assert "published by the running gateway in timestamp v" in r.stdout, r.stdout
        # Later refreshes keep it out: the running gateway saw the revocation.
        refreshed(index, "bad", 3)
        assert signed_files(gw, "bad") == {"bad-0.9-py3-none-any.whl"}
        log = gw.log()
    assert f"revocation applied: bad {bad}" in log
    assert "reading all of it again" in log


@pytest.mark.slow
def test_revoke_says_so_when_the_running_gateway_does_not_apply_it(tmp_path: Path, gw_dir: Path) -> None:
    """A gateway that never publishes without the file: the command waits, then says it was not applied."""
    dists = tmp_path / "dists"
    with TestIndex() as index:
        index.add(build_wheel(dists, "kept", "1.0"))
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--batch-window", "0.05") as gw:
            assert gw.publish("kept")[0] == 200
            gw.proc.send_signal(signal.SIGSTOP)  # alive (holding its lock) but applying nothing
            try:
                r = gateway_cli("revoke", str(tmp_path / "gw"), "kept", "kept-1.0-py3-none-any.whl", "--wait", "1.5")
            finally:
                gw.proc.send_signal(signal.SIGCONT)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "did not publish a timestamp without it within 1.5s" in r.stderr, r.stderr


def test_counts_from_takes_the_later_of_claim_and_first_sight_where_the_mode_says() -> None:
    from proxy.gateway.policy import Policy, parse_age
    from proxy.protocol.index import DistFile, ProjectPage

    seen = datetime(2026, 1, 10, tzinfo=UTC)
    old = "2025-01-01T00:00:00Z"
    for mode, first_listing, later_listing in (("yes", "claim", seen), ("all", seen, seen), ("no", "claim", "claim")):
        policy = Policy(min_release_age=parse_age("7d"), first_seen_cooldown=mode)
        claim = datetime(2025, 1, 1, tzinfo=UTC)
        assert policy.counts_from(old, seen, listed_before=False) == (claim if first_listing == "claim" else seen)
        assert policy.counts_from(old, seen, listed_before=True) == (claim if later_listing == "claim" else seen)
    # A claim moved back later changes nothing: the time fixed at first sight wins.
    policy = Policy(min_release_age=parse_age("7d"))
    page = ProjectPage(name="p", files=(DistFile(filename="p-1.0.tar.gz", url="u", hashes={}, upload_time=old),))
    trimmed = policy.apply(page, seen + timedelta(days=1), {"p-1.0.tar.gz": seen})
    assert trimmed.page.files == () and trimmed.hidden[0].rule == "first-seen"
    assert policy.apply(page, seen + timedelta(days=8), {"p-1.0.tar.gz": seen}).page.files == page.files
