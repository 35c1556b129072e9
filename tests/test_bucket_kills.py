"""kill -9 of a gateway that copies its tree to a bucket (``gateway serve --store``), at random points of
publishes, round after round (issue 37: the bucket copy driven by the signer's journal).

The gateway publishes continuously (two threads POST the miss protocol's request for new projects), and is
killed at random moments: while it fetches a page, signs, appends to ``written.journal``, uploads to the
bucket, answers, or starts up again and walks its tree.  Throughout, a reader of the bucket refreshes every
few tens of milliseconds and fails the test if the bucket ever holds a timestamp whose snapshot, bins or
pages are missing or do not verify, or if any version goes back.  After every restart, the bucket is walked,
and a real edge reading only the bucket lists and serves every project published so far.

The kill moments come from a seeded RNG: the seed is printed, and ``TUFPROXY_TEST_SEED=N`` replays a run.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from proxy.protocol.profiles import GATEWAY
from proxy.repository.sample import build_wheel
from proxy.transport.upstream import AiohttpFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.seaweed import BUCKET, Seaweed
from tests.support.testindex import TestIndex
from tests.test_bucket import assert_no_secrets, bucket_store

if TYPE_CHECKING:
    from obstore.store import S3Store

ROUNDS = 20
PREFIX = "kill9-journal"
JSON = "application/vnd.pypi.simple.v1+json"


@dataclass
class Publishing:
    """What the publishing threads asked for and what the gateway confirmed (200)."""

    index: TestIndex
    dists: Path
    bucket: str  # the bucket's URL: a confirmed publish must already be there
    up: threading.Event = field(default_factory=threading.Event)  # a gateway is listening: POST to ``base``
    stop: threading.Event = field(default_factory=threading.Event)
    base: str = ""
    attempted: set[str] = field(default_factory=set)
    acknowledged: set[str] = field(default_factory=set)
    statuses: list[int | str] = field(default_factory=list)
    unpushed: list[tuple[str, int, int]] = field(default_factory=list)  # confirmed, but the bucket was older
    crashed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, thread: int) -> None:
        try:
            self._run(thread)
        except Exception as e:  # the test fails on it, with what it was
            with self.lock:
                self.statuses.append(f"{type(e).__name__}: {e}")
                self.crashed = True

    def _run(self, thread: int) -> None:
        """Publish p<thread>x0, p<thread>x1, ... one after another; a project not confirmed is asked again.
        A confirmation comes after the bucket push: the bucket then holds the timestamp it names."""
        for n in itertools.count():
            project = f"p{thread}x{n}"
            self.index.add(build_wheel(self.dists / project, project, "1.0"))
            while True:
                self.up.wait()
                if self.stop.is_set():
                    return
                with self.lock:
                    self.attempted.add(project)
                request = urllib.request.Request(f"{self.base}_tufproxy/publish/{project}", method="POST", data=b"")
                try:
                    with urllib.request.urlopen(request, timeout=30) as r:
                        status: int | str = r.status
                        answered = json.loads(r.read())["timestamp_version"]
                    with urllib.request.urlopen(f"{self.bucket}metadata/timestamp.json", timeout=30) as r:
                        there = json.loads(r.read())["signed"]["version"]
                    if there < answered:
                        self.unpushed.append((project, answered, there))
                except urllib.error.HTTPError as e:
                    status = e.code
                except OSError as e:  # the gateway died under this request, on purpose
                    status = type(e).__name__
                with self.lock:
                    self.statuses.append(status)
                    if status == 200:
                        self.acknowledged.add(project)
                if status == 200:
                    break


class BucketReader:
    """A TUF client of the bucket, refreshing in a loop: every timestamp it sees must verify whole."""

    def __init__(self, tmp: Path, base: str, root: bytes) -> None:
        self.base = base
        self.meta = tmp / "reader-meta"
        TrustedClient.initialize(self.meta, root)
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.versions: list[tuple[int, int]] = []  # (timestamp, snapshot) after each refresh
        self.pages: dict[str, str] = {}  # page target -> sha256, fetched from the bucket and checked
        self.thread = threading.Thread(target=lambda: asyncio.run(self._loop()), daemon=True)

    async def _loop(self) -> None:
        fetcher = AiohttpFetcher(connect_timeout=5, read_timeout=10)
        trust = TrustedClient(self.meta, [Mirror(f"{self.base}metadata/", self.base)], fetcher,
                              TrustConfig(refresh_interval=3600))
        try:
            while not self.stop.is_set():
                try:
                    await trust.refresh(force=True)  # refuses a rollback, a missing or torn snapshot or targets
                    versions = trust.timestamp_version or 0, trust.snapshot_versions().get("snapshot", 0)
                    assert trust.verified_targets is not None
                    if not self.versions or versions != self.versions[-1]:
                        listed = await trust.listed(GATEWAY.page_project)  # every bin, fetched and verified
                        for _, target in listed:
                            if target.path not in self.pages:
                                self.pages[target.path] = await asyncio.to_thread(self._page, trust.target_urls(target),
                                                                                  target.hashes["sha256"])
                    self.versions.append(versions)
                except Exception as e:  # every failure is the test's finding
                    self.errors.append(f"{type(e).__name__}: {e}"[:500])
                await asyncio.to_thread(self.stop.wait, 0.05)  # the reader's pace, not a synchronisation
        finally:
            trust.close()
            await fetcher.close()

    @staticmethod
    def _page(urls: list[str], sha256: str) -> str:
        try:
            with urllib.request.urlopen(urls[0], timeout=10) as r:
                got = hashlib.sha256(r.read()).hexdigest()
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{urls[0]}: {e.code}, a page the bucket's bins name") from None
        assert got == sha256, f"{urls[0]}: sha256 {got}, signed {sha256}"
        return got


def timestamp_version(where: Path | S3Store) -> int:
    """The version of the timestamp in a directory's file or in the bucket."""
    import obstore

    data = where.read_bytes() if isinstance(where, Path) else bytes(obstore.get(where, "metadata/timestamp.json").bytes())
    return int(json.loads(data)["signed"]["version"])


def walk_bucket(store: S3Store) -> tuple[int, set[str]]:
    """The bucket's timestamp version and the projects its bins list, after checking that everything the
    timestamp reaches is there: its snapshot, every role the snapshot names, every page the bins name."""
    import obstore

    keys = {m["path"] for batch in obstore.list(store) for m in batch}

    def read(key: str) -> dict[str, Any]:
        assert key in keys, f"the bucket's timestamp reaches {key}, which the bucket does not hold"
        return json.loads(bytes(obstore.get(store, key).bytes()))

    timestamp = read("metadata/timestamp.json")["signed"]
    snapshot = read(f"metadata/{timestamp['meta']['snapshot.json']['version']}.snapshot.json")["signed"]
    projects = set()
    for name, meta in snapshot["meta"].items():
        role = read(f"metadata/{meta['version']}.{name}")["signed"]
        for path, target in role.get("targets", {}).items():
            page = GATEWAY.served_name(path, target["hashes"]["sha256"])
            assert page in keys, f"{name} v{meta['version']} names {path}; the bucket lacks {page}"
            if (project := GATEWAY.page_project(path)) is not None:
                projects.add(project)
    return timestamp["version"], projects


async def refresh_and_list(meta: Path, base: str) -> tuple[int, set[str]]:
    """One refresh of a long-lived client of the bucket (rollback protection across rounds) and its listing."""
    fetcher = AiohttpFetcher()
    trust = TrustedClient(meta, [Mirror(f"{base}metadata/", base)], fetcher, TrustConfig(refresh_interval=3600))
    try:
        await trust.refresh(force=True)
        assert trust.timestamp_version is not None
        return trust.timestamp_version, {p for p, _ in await trust.listed(GATEWAY.page_project)}
    finally:
        trust.close()
        await fetcher.close()


def edge_lists(edge: ProxyProcess) -> set[str]:
    request = urllib.request.Request(edge.url, headers={"Accept": JSON})
    with urllib.request.urlopen(request, timeout=30) as r:
        return {p["name"] for p in json.loads(r.read())["projects"]}


@pytest.mark.slow
def test_kill_9_at_random_points_of_publishes_never_leaves_the_bucket_torn_or_rolled_back(
        seaweed: Seaweed, tmp_path: Path) -> None:
    seed = int(os.environ.get("TUFPROXY_TEST_SEED", "37"))
    rng = random.Random(seed)
    print(f"kill -9 rounds: seed {seed} (TUFPROXY_TEST_SEED={seed} replays it)")
    began = time.monotonic()
    store = bucket_store(seaweed, PREFIX)
    bucket_url = f"{seaweed.endpoint}/{BUCKET}/{PREFIX}/"
    gateway_init(tmp_path / "gw")
    root = (tmp_path / "gw" / "public" / "metadata" / "1.root.json").read_bytes()
    checker_meta = tmp_path / "checker-meta"
    TrustedClient.initialize(checker_meta, root)

    with TestIndex(separate_files_host=True) as index:
        args = ("--index-url", index.url, "--files-origin", index.files_url, "--batch-window", "0.05",
                "--prefetch-depth", "0", "--store", f"s3://{BUCKET}/{PREFIX}", "--s3-endpoint-url", seaweed.endpoint)

        def gateway() -> GatewayProcess:
            gw = GatewayProcess(tmp_path / "gw", *args)
            gw.env = seaweed.env()
            return gw

        publishing = Publishing(index, tmp_path / "dists", bucket_url)
        reader = BucketReader(tmp_path, bucket_url, root)
        publishers = [threading.Thread(target=publishing.run, args=(t,), daemon=True) for t in range(2)]
        gw = gateway()
        gw.start()
        edge = ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", bucket_url,
                            "--root", str(gw.root), "--workers", "1", "--refresh-interval", "0.2")
        seen: list[tuple[int, set[str]]] = []  # per round: the bucket's timestamp version and its projects
        edge_versions: list[float] = []
        early_kills = unpushed = 0
        try:
            edge.start()
            reader.thread.start()
            publishing.base = gw.base
            publishing.up.set()
            for t in publishers:
                t.start()
            for round_ in range(ROUNDS):
                # The kill lands at a random point of the publishes in flight: that is the test.
                time.sleep(rng.uniform(0.05, 0.45))
                publishing.up.clear()
                gw.kill()
                signed, pushed = timestamp_version(gw.directory / "public" / "metadata" / "timestamp.json"), \
                    timestamp_version(store)
                assert pushed <= signed, (round_, seed)
                unpushed += signed > pushed  # killed between a commit and its push's timestamp
                if rng.random() < 0.25:  # and sometimes during the start-up push (the whole tree walked)
                    early_kills += 1
                    starting = gateway()
                    with open(tmp_path / f"early-{round_}.log", "wb") as log:
                        proc = subprocess.Popen(starting.argv(), env={**os.environ, **seaweed.env()},
                                                stdout=log, stderr=subprocess.STDOUT)
                    time.sleep(rng.uniform(0.3, 1.5))
                    assert proc.poll() is None, (tmp_path / f"early-{round_}.log").read_text()
                    proc.kill()
                    proc.wait(10)
                t0 = time.monotonic()
                gw = gateway()
                gw.start()  # listening only once its first push brought the bucket up to date
                t1 = time.monotonic()
                with publishing.lock:
                    acknowledged, attempted = set(publishing.acknowledged), set(publishing.attempted)
                version, in_bucket = walk_bucket(store)
                trusted, listed = asyncio.run(refresh_and_list(checker_meta, bucket_url))
                assert (trusted, listed) == (version, in_bucket), (round_, seed)
                assert acknowledged <= listed <= attempted, (round_, seed, acknowledged - listed, listed - attempted)
                assert listed == gw.listed(), (round_, seed)  # the bucket holds what the gateway signed
                if seen:  # nothing published goes back, nothing confirmed is lost
                    assert version >= seen[-1][0] and listed >= seen[-1][1], (round_, seed, seen[-1][0], version)
                seen.append((version, listed))
                # A real edge of the bucket lists exactly that, and serves each new project's verified page.
                wait_for(lambda: edge_lists(edge), f"round {round_} (seed {seed}): the edge lists the bucket's projects",
                         timeout=30, done=listed.__eq__)
                for project in sorted(listed - (seen[-2][1] if len(seen) > 1 else set())):
                    with urllib.request.urlopen(f"{edge.url}{project}/", timeout=30) as r:
                        assert f"{project}-1.0-py3-none-any.whl".encode() in r.read()
                edge_versions.append(metric(edge.base, 'tufproxy_trusted_role_version{role="timestamp"}'))
                print(f"round {round_}: restarted in {t1 - t0:.2f} s, checked in {time.monotonic() - t1:.2f} s, "
                      f"{len(listed)} projects")
                publishing.base = gw.base
                publishing.up.set()
        finally:
            publishing.stop.set()
            publishing.up.set()
            for t in publishers:
                t.join(60)
            reader.stop.set()
            reader.thread.join(60)
            edge.stop()
            if gw.proc is not None:
                gw.stop()
        assert_no_secrets(gw.log(), edge.log())

    took = time.monotonic() - began
    statuses = {s: publishing.statuses.count(s) for s in set(publishing.statuses)}
    print(f"{ROUNDS} kill -9 ({early_kills} during start-up, {unpushed} between a commit and its push) in {took:.1f} s: "
          f"{len(seen[-1][1])} projects published, bucket timestamp v{seen[0][0]} -> v{seen[-1][0]}; "
          f"the reader refreshed {len(reader.versions)} times, checked {len(reader.pages)} pages; "
          f"publish answers {statuses}")
    assert not reader.errors, (seed, reader.errors[:5])
    assert not publishing.unpushed, (seed, publishing.unpushed[:5])
    assert not publishing.crashed, statuses
    assert unpushed > 0, "no kill landed between a commit and its push: the rounds did not test the journal's push"
    assert len(reader.versions) > ROUNDS and reader.versions == sorted(reader.versions), seed
    assert {GATEWAY.page_project(p) for p in reader.pages} >= seen[-1][1]
    assert edge_versions == sorted(edge_versions) and edge_versions[-1] > edge_versions[0], edge_versions
    assert len(seen[-1][1]) >= ROUNDS  # the rounds published: each kill interrupted real work
    assert "rollback" not in edge.log().lower() and "refus" not in edge.log().lower(), edge.log()[-3000:]
