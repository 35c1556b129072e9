"""The bucket tier (``serve --store s3://...``) against a real SeaweedFS, with real replicas and pip.

SeaweedFS starts once per session (``weed`` from the test extra; a missing
binary fails the tests with a clear message, it is never skipped).  Each
test uses its own prefix in the one bucket.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import make_sample_dists
from tests.support.clients import install
from tests.support.faults import Fault, FaultyUpstream, sized_wheel
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.s3relay import S3Relay
from tests.support.seaweed import ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed
from tests.support.testindex import TestIndex

BIG = 24 * 2**20


@dataclass
class World:
    public: Path  # the signed tree the upstream serves
    root: Path
    upstream: FaultyUpstream
    big: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("bucket")
    repo = Repository.init(tmp / "repo", bins=16)
    big = sized_wheel(tmp / "dists", "heavy", "1.0", BIG)
    repo.add([*make_sample_dists(tmp / "dists"), big])
    root = tmp / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with FaultyUpstream(repo.public_dir) as upstream:
        yield World(repo.public_dir, root, upstream, big)


def target_of(world: World, filename: str) -> tuple[str, bytes]:
    """(the proxy path, the exact bytes) of a distribution file."""
    project = filename.split("-")[0]
    path = next(p for p in (world.public / "packages" / project).iterdir() if p.name.endswith("." + filename))
    return f"/packages/{project}/{filename}", path.read_bytes()


def upstream_pattern(filename: str) -> str:
    return rf"/packages/[^/]+/[0-9a-f]+\.{re.escape(filename)}"


def replica(world: World, seaweed: Seaweed, tmp: Path, prefix: str, *extra: str,
            endpoint: str | None = None, upstream: str | None = None) -> ProxyProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    return ProxyProcess(tmp / "cache", "--upstream", upstream or world.upstream.url, "--root", str(world.root), "--workers", "1",
                        "--store", f"s3://{BUCKET}/{prefix}", "--s3-endpoint-url", endpoint or seaweed.endpoint,
                        "--audit-log", str(tmp / "audit.jsonl"), *extra, env=seaweed.env())


def fetch(proxy: ProxyProcess, path: str, timeout: float = 60) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(proxy.base.rstrip("/") + path, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def fetch_cut_off(proxy: ProxyProcess, path: str) -> None:
    """A client whose transfer is cut when its replica is killed."""
    with contextlib.suppress(OSError, http.client.HTTPException):
        fetch(proxy, path)


def bucket_store(seaweed: Seaweed, prefix: str):  # type: ignore[no-untyped-def]
    from obstore.store import S3Store
    return S3Store(BUCKET, prefix=prefix, endpoint=seaweed.endpoint, access_key_id=ACCESS_KEY,
                   secret_access_key=SECRET_KEY, region="us-east-1", client_options={"allow_http": True},
                   virtual_hosted_style_request=False)


def blob_key(data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    return f"blobs/{sha[:2]}/{sha}"


def audit_records(tmp: Path) -> list[dict[str, object]]:
    path = tmp / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        assert SECRET_KEY not in text
        assert ACCESS_KEY not in text


@pytest.mark.slow
def test_three_replicas_share_one_bucket_one_upstream_fetch_per_file(world: World, seaweed: Seaweed,
                                                                       tmp_path: Path) -> None:
    replicas = [replica(world, seaweed, tmp_path / f"r{i}", "fleet") for i in range(3)]
    try:
        for i, r in enumerate(replicas):
            r.start()
            result = install("pip", r.url, tmp_path / f"target{i}", "app")
            assert result.returncode == 0, result.stdout + result.stderr + r.log()
        for name in ("app-1.0-py3-none-any.whl", "lib-1.1-py3-none-any.whl", "base-2.0-py3-none-any.whl"):
            assert world.upstream.count(upstream_pattern(name)) == 1, name
        # Pages too: each project's signed page was fetched upstream once for the fleet.
        assert world.upstream.count(r"/simple/app/[0-9a-f]+\.index\.(json|html)") == 1
        metrics = urllib.request.urlopen(replicas[2].base + "metrics", timeout=10).read().decode()
        assert re.search(r'tufproxy_bucket_requests_total\{op="get"\} [1-9]', metrics)
        assert_no_secrets(metrics, *(r.log() for r in replicas), (tmp_path / "r0" / "audit.jsonl").read_text()
                          if (tmp_path / "r0" / "audit.jsonl").exists() else "")
    finally:
        for r in replicas:
            r.stop()


def test_a_file_neither_the_bucket_nor_any_upstream_has_is_a_typed_404(world: World, seaweed: Seaweed,
                                                                        tmp_path: Path) -> None:
    # The bucket is asked first, as a mirror: its 404 and the upstream's together mean "not found",
    # the upstream withholding a signed file, not "unreachable".
    path, _ = target_of(world, "base-2.0.tar.gz")
    world.upstream.inject(upstream_pattern("base-2.0.tar.gz"), Fault.STATUS, status=404)
    try:
        with replica(world, seaweed, tmp_path / "r", "missing").start() as r:
            status, body, headers = fetch(r, path)
    finally:
        world.upstream.clear()
    assert status == 404, body
    assert headers.get("X-Tufproxy-Reason") == "missing-upstream", (headers, body)


@pytest.mark.slow
def test_tampered_file_and_page_objects_are_refused_evicted_refetched_and_audited_alike(
        world: World, seaweed: Seaweed, tmp_path: Path) -> None:
    import obstore

    path, good = target_of(world, "base-2.0-py3-none-any.whl")
    page_pattern = r"/simple/base/[0-9a-f]+\.index\.(json|html)"
    before = world.upstream.count(upstream_pattern("base-2.0-py3-none-any.whl")), world.upstream.count(page_pattern)
    store = bucket_store(seaweed, "tamper")
    with replica(world, seaweed, tmp_path / "a", "tamper") as a:
        status, body, _ = fetch(a, path)
        assert (status, body) == (200, good)
        status, page, _ = fetch(a, "/simple/base/")
        assert status == 200
    [page_key] = [m["path"] for batch in obstore.list(store, "pages/") for m in batch]
    objects = {blob_key(good): good, page_key: bytes(obstore.get(store, page_key).bytes())}
    assert bytes(obstore.get(store, blob_key(good)).bytes()) == good
    for key, data in objects.items():
        evil = bytearray(data)
        evil[len(evil) // 2] ^= 0xFF
        obstore.put(store, key, bytes(evil))
    with replica(world, seaweed, tmp_path / "b", "tamper") as b:
        assert fetch(b, path)[:2] == (200, good)
        assert fetch(b, "/simple/base/")[:2] == (200, page)
        assert (world.upstream.count(upstream_pattern("base-2.0-py3-none-any.whl")),
                world.upstream.count(page_pattern)) == (before[0] + 2, before[1] + 2)
        refused = [r for r in audit_records(tmp_path / "b") if r["event"] == "refused"]
        assert [r["upstream_url"] for r in refused] == [f"s3://{BUCKET}/tamper/{k}" for k in objects], refused
        assert all(r["reason"] == "hash-mismatch" for r in refused), refused
        # One record shape for both, the shape of any lying mirror's.
        assert set(refused[0]) == set(refused[1]), refused
        assert_no_secrets(b.log(), (tmp_path / "b" / "audit.jsonl").read_text())
    # The bad objects were evicted and replaced by the verified bytes.
    for key, data in objects.items():
        assert bytes(obstore.get(store, key).bytes()) == data


@pytest.mark.slow
def test_replica_killed_mid_upload_leaves_nothing_served(world: World, seaweed: Seaweed, tmp_path: Path) -> None:
    import obstore

    path, good = target_of(world, world.big.name)
    store = bucket_store(seaweed, "killed")
    key = blob_key(good)
    lease = ("--s3-lease-seconds", "3")
    got: dict[str, tuple[int, bytes, dict[str, str]]] = {}
    # Replica a reaches the bucket through a relay that lets its PUT of the file start, then holds it.
    with S3Relay(seaweed.ports["s3"], f"/{BUCKET}/killed/{key}") as relay, \
            replica(world, seaweed, tmp_path / "c", "killed", *lease) as c:
        a = replica(world, seaweed, tmp_path / "a", "killed", *lease, endpoint=relay.endpoint).start()
        try:
            threading.Thread(target=fetch_cut_off, args=(a, path), daemon=True).start()
            assert relay.put_began.wait(60), relay.error or a.log()
            assert relay.body_forwarded > 0 and b"content-length: %d" % len(good) in relay.head.lower()
            # Replica c asks while a's upload hangs: it must wait or fetch for itself, never read a partial object.
            waiter = threading.Thread(target=lambda: got.setdefault("c", fetch(c, path, timeout=120)), daemon=True)
            waiter.start()
            os.kill(a.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            a.proc.wait(20)  # type: ignore[union-attr]
        finally:
            a.stop()
            relay.close()  # the store sees the PUT's body end early
        # Nothing partial is in the bucket: the object is absent, or whole (c may have published it by now).
        try:
            assert bytes(obstore.get(store, key).bytes()) == good
        except FileNotFoundError:
            pass
        with replica(world, seaweed, tmp_path / "b", "killed", *lease) as b:
            got["b"] = fetch(b, path, timeout=120)
        waiter.join(120)
    for name in ("b", "c"):
        status, body, _ = got[name]
        assert status == 200 and len(body) == len(good) and body == good, name
    assert bytes(obstore.get(store, key).bytes()) == good


def first_bytes(proxy: ProxyProcess, path: str, n: int) -> tuple[float, bytes]:
    """Seconds until the first body byte of ``path`` arrived, and the first ``n`` bytes."""
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200, response.read()
        first = response.read(1)
        seconds = time.monotonic() - began
        return seconds, first + response.read(n - 1)
    finally:
        conn.close()


@pytest.mark.slow
def test_a_waiting_replica_fetches_for_itself_after_the_wait(world: World, seaweed: Seaweed, tmp_path: Path) -> None:
    import obstore

    path, good = target_of(world, world.big.name)
    store = bucket_store(seaweed, "waiting")
    wait = 2.0
    # An upstream that drips every answer at 64 KiB/s: the big file takes minutes, so a's lease outlives the wait.
    with FaultyUpstream(world.public, rate=64 * 1024) as slow:
        args = ("--s3-wait", str(wait))
        with replica(world, seaweed, tmp_path / "a", "waiting", *args, upstream=slow.url) as a, \
                replica(world, seaweed, tmp_path / "b", "waiting", *args, upstream=slow.url) as b:
            threading.Thread(target=fetch_cut_off, args=(a, path), daemon=True).start()
            wait_for(lambda: obstore.list(store, "leases/").collect(), "replica a's lease", timeout=60)

            assert slow.count(upstream_pattern(world.big.name)) == 1
            seconds, head = first_bytes(b, path, 64 * 1024)
            # b waited for a (the fetch a small file needs), then fetched too: first byte within the bound.
            assert wait * 0.9 <= seconds < wait + 4, seconds
            assert head == good[:len(head)] and len(head) == 64 * 1024
            assert slow.count(upstream_pattern(world.big.name)) == 2
            assert "still fetching" in b.log()
            slow.stop()  # the replicas' downloads end now, so they stop without draining them


@pytest.mark.slow
def test_bucket_down_gives_503s_then_recovers_without_restart(world: World, seaweed: Seaweed,
                                                              tmp_path: Path) -> None:
    warm_path, warm = target_of(world, "lib-1.0-py3-none-any.whl")
    cold_path, cold = target_of(world, "lib-1.1-py3-none-any.whl")
    with replica(world, seaweed, tmp_path / "a", "outage", "--s3-timeout", "1.5") as a:
        assert fetch(a, warm_path)[:2] == (200, warm)
        seaweed.pause()
        try:
            status, body, headers = fetch(a, cold_path)
            assert status == 503, body
            assert headers.get("X-Tufproxy-Reason") == "bucket-unavailable"
            assert body != cold
            # What the local tier verified is still served.
            assert fetch(a, warm_path)[:2] == (200, warm)
            status, body, _ = fetch(a, "/readyz")
            assert status == 503 and b"shared bucket unreachable" in body
        finally:
            seaweed.resume()
        deadline = time.monotonic() + 60
        while (got := fetch(a, cold_path))[0] != 200:
            assert got[0] == 503 and time.monotonic() < deadline, got
            time.sleep(0.2)
        assert got[1] == cold
        assert fetch(a, "/readyz")[0] == 200
        assert_no_secrets(a.log())


@contextlib.contextmanager
def gateway_to_bucket(seaweed: Seaweed, tmp_path: Path, prefix: str, *extra: str) -> Iterator[GatewayProcess]:
    """A gateway (over a test index of app -> lib -> base) that pushes to ``prefix`` of the bucket."""
    index = TestIndex(separate_files_host=True)
    dists = tmp_path / "dists"
    for dist in (build_wheel(dists, "app", "1.0", requires=["lib>=1.0"]), build_wheel(dists, "lib", "1.0", requires=["base"]),
                 build_wheel(dists, "base", "2.0")):
        index.add(dist)
    gateway_init(tmp_path / "gw")
    with index:
        gw = GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--files-origin", index.files_url,
                            "--batch-window", "0.1", "--store", f"s3://{BUCKET}/{prefix}", "--s3-endpoint-url",
                            seaweed.endpoint, *extra)
        gw.env = seaweed.env()
        with gw:
            yield gw
        assert_no_secrets(gw.log())


def bucket_edge(seaweed: Seaweed, tmp_path: Path, gw: GatewayProcess, prefix: str, *extra: str) -> ProxyProcess:
    """An edge that reads the repository from the bucket, anonymously (as through a CDN)."""
    return ProxyProcess(tmp_path / "edge2", "--profile", "gateway", "--upstream", f"{seaweed.endpoint}/{BUCKET}/{prefix}/",
                        "--root", str(gw.root), "--workers", "1", *extra)


@pytest.mark.slow
@pytest.mark.parametrize("cache_dir", [False, True], ids=["files-in-public", "files-in-cache-dir"])
def test_gateway_publishes_to_a_bucket_and_an_edge_installs_from_it(seaweed: Seaweed, tmp_path: Path,
                                                                     cache_dir: bool) -> None:
    import obstore

    prefix = f"gw-{cache_dir}"
    store = bucket_store(seaweed, prefix)
    cache = ("--cache-dir", str(tmp_path / "gwcache")) if cache_dir else ()
    with gateway_to_bucket(seaweed, tmp_path, prefix, *cache) as gw:
        # An edge of the gateway publishes the projects and makes it fetch their files.
        with edge_for(tmp_path, gw) as edge:
            r = install("pip", edge.url, tmp_path / "t1", "app")
            assert r.returncode == 0, r.stdout + r.stderr + gw.log()

        def pushed() -> bool:
            names = {m["path"] for batch in obstore.list(store, "packages/") for m in batch}
            return sum(n.endswith(".whl") for n in names) == 3
        wait_for(pushed, "the files in the bucket", timeout=30)
        wheels = {p.name for p in (tmp_path / ("gwcache" if cache_dir else "gw/public")).glob("packages/*/*.whl")}
        assert len(wheels) == 3, wheels  # the gateway kept its files where the test says
        # An edge that reads only the bucket verifies and installs.
        with bucket_edge(seaweed, tmp_path, gw, prefix) as reader:
            r = install("pip", reader.url, tmp_path / "t2", "app")
            assert r.returncode == 0, r.stdout + r.stderr + reader.log()
        assert {p.name for p in (tmp_path / "t2").iterdir()} >= {"app", "lib", "base"}


@pytest.mark.slow
def test_an_edge_reading_the_bucket_asks_the_gateway_for_what_is_not_there_yet(seaweed: Seaweed,
                                                                               tmp_path: Path) -> None:
    import obstore

    store = bucket_store(seaweed, "gw-miss")
    with gateway_to_bucket(seaweed, tmp_path, "gw-miss") as gw:
        assert not obstore.list(store, "simple/app/").collect()  # no project published yet
        # Pages and metadata from the bucket; the miss protocol asks the gateway to publish each project,
        # and files the gateway has not fetched yet come from it as the second upstream.
        with bucket_edge(seaweed, tmp_path, gw, "gw-miss", "--upstream", gw.base, "--gateway-url", gw.base,
                         "--refresh-interval", "0.5") as edge:
            r = install("pip", edge.url, tmp_path / "t", "app")
            assert r.returncode == 0, r.stdout + r.stderr + edge.log() + gw.log()
            metrics = fetch(edge, "/metrics")[1].decode()
        fetched = {(m, o): float(n) for m, o, n in
                   re.findall(r'tufproxy_upstream_fetches_total\{mirror="(\d)",outcome="(\w+)"\} (\S+)', metrics)}
        # Three pages from the bucket; three files (not in it yet) from the gateway after the bucket's 404.
        assert fetched.get(("0", "ok"), 0) >= 3 and fetched.get(("1", "ok"), 0) >= 3, fetched
        assert {p.name for p in (tmp_path / "t").iterdir()} >= {"app", "lib", "base"}
        pages = {m["path"].split("/")[1] for batch in obstore.list(store, "simple/") for m in batch}
        assert pages >= {"app", "lib", "base"}, pages


def test_push_order_never_exposes_a_timestamp_before_its_snapshot_and_bins(tmp_path: Path) -> None:
    from proxy.storage.treepush import TreePush

    tree = tmp_path / "public"
    names = ["metadata/timestamp.json", "metadata/7.snapshot.json", "metadata/7.bin-3.json", "metadata/2.root.json",
             "metadata/1.bins.json", "simple/app/ab12.index.json", "packages/app/cd34.app-1.0-py3-none-any.whl",
             "metadata/.timestamp.json.x1.tmp"]
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(name.encode())
    cache = tmp_path / "cache"  # --cache-dir: files fetched on demand, worker state beside them
    for name in ["packages/app/ef56.app-2.0-py3-none-any.whl", "run/metrics/1.db", "packages/app/.ef56.x.tmp"]:
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(name.encode())
    push = TreePush(None, tree, tmp_path / "push.lock", {"packages": cache / "packages"})  # type: ignore[arg-type]
    changed, gone = push._changed()
    assert gone == []
    order = [relative for relative, _, _ in changed]
    assert order[:3] == ["packages/app/cd34.app-1.0-py3-none-any.whl", "packages/app/ef56.app-2.0-py3-none-any.whl",
                         "simple/app/ab12.index.json"]
    assert changed[1][1] == cache / "packages/app/ef56.app-2.0-py3-none-any.whl"
    assert not any("run/" in n or ".x.tmp" in n for n in order)
    assert order.index("metadata/timestamp.json") == len(order) - 1
    assert order.index("metadata/7.snapshot.json") == len(order) - 2
    assert max(order.index(n) for n in names[:6] if "metadata/" not in n) < order.index("metadata/7.bin-3.json")
    assert "metadata/.timestamp.json.x1.tmp" not in order


def test_a_push_deletes_what_the_gateway_collected_but_never_files(seaweed: Seaweed, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import obstore
    from prometheus_client import CollectorRegistry

    from proxy.storage.treepush import TreePush
    from proxy.transport.bucket import Bucket
    from proxy.util.metrics import BucketMetrics

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    tree, cache = tmp_path / "public", tmp_path / "cache"
    names = {tree: ["metadata/timestamp.json", "metadata/6.snapshot.json", "metadata/7.snapshot.json",
                    "simple/app/ab12.index.json", "simple/app/index.json"],
             cache: ["packages/app/cd34.app-1.0-py3-none-any.whl"]}
    for directory, files in names.items():
        for name in files:
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(name.encode())
    store = bucket_store(seaweed, "collect")
    obstore.put(store, "simple/app/ef56.index.json", b"put by someone else")
    push = TreePush(Bucket(f"s3://{BUCKET}/collect", BucketMetrics(CollectorRegistry()), seaweed.endpoint), tree,
                    tmp_path / "push.lock", {"packages": cache / "packages"})
    assert asyncio.run(push.push()) == 6

    def listed() -> set[str]:
        return {m["path"] for batch in obstore.list(store) for m in batch}
    assert listed() == {*names[tree], *names[cache], "simple/app/ef56.index.json"}
    # The gateway collects an old snapshot and an old page; a lost cache dir takes the file with it.
    for gone in (tree / "metadata/6.snapshot.json", tree / "simple/app/ab12.index.json",
                 cache / "packages/app/cd34.app-1.0-py3-none-any.whl"):
        gone.unlink()
    asyncio.run(push.push())
    assert listed() == {"metadata/timestamp.json", "metadata/7.snapshot.json", "simple/app/index.json",
                        *names[cache], "simple/app/ef56.index.json"}


def aws_files(monkeypatch: pytest.MonkeyPatch, tmp: Path, credentials: str, config: str = "") -> dict[str, str]:
    """A process environment whose only AWS settings are the shared files under ``tmp/home/.aws``."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    aws = tmp / "home" / ".aws"
    aws.mkdir(parents=True)
    (aws / "credentials").write_text(credentials)
    (aws / "config").write_text(config)
    # Were the files ignored, object_store would ask the instance metadata service: keep that on 127.0.0.1.
    return {"HOME": str(tmp / "home"), "AWS_METADATA_ENDPOINT": "http://127.0.0.1:9"}


@pytest.mark.slow
def test_keys_region_and_endpoint_from_the_shared_files_of_a_profile(world: World, seaweed: Seaweed, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    env = aws_files(monkeypatch, tmp_path, f"[fleet]\naws_access_key_id = {ACCESS_KEY}\n"
                    f"aws_secret_access_key = {SECRET_KEY}\n",
                    f"[profile fleet]\nregion = us-east-1\nendpoint_url = {seaweed.endpoint}\n")
    env["AWS_PROFILE"] = "fleet"
    # No --s3-endpoint-url: the profile names the endpoint.
    proxy = ProxyProcess(tmp_path / "cache", "--upstream", world.upstream.url, "--root", str(world.root),
                         "--workers", "1", "--store", f"s3://{BUCKET}/profile",
                         "--audit-log", str(tmp_path / "audit.jsonl"), env=env)
    with proxy:
        result = install("pip", proxy.url, tmp_path / "target", "app")
        assert result.returncode == 0, result.stdout + result.stderr + proxy.log()
        metrics = fetch(proxy, "/metrics")[1].decode()
        assert re.search(r'tufproxy_bucket_requests_total\{op="put"\} [1-9]', metrics)
        assert f"profile 'fleet' in {tmp_path / 'home' / '.aws' / 'credentials'}" in proxy.log()
        assert_no_secrets(metrics, proxy.log(), (tmp_path / "audit.jsonl").read_text())
    _, app = target_of(world, "app-1.0-py3-none-any.whl")
    import obstore
    assert bytes(obstore.get(bucket_store(seaweed, "profile"), blob_key(app)).bytes()) == app


@pytest.mark.parametrize("where", ["shared-file", "environment"])
def test_refused_credentials_end_start_up_with_one_line_and_are_never_printed(
        world: World, seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    wrong = "wrong-secret-0123456789-abcdefghij"
    env = aws_files(monkeypatch, tmp_path, "")
    if where == "shared-file":
        (tmp_path / "keys").write_text(f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {wrong}\n")
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "keys")
        source = f"profile 'default' in {tmp_path / 'keys'}"
    else:
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=wrong)
        source = "AWS_ACCESS_KEY_ID in the environment"
    proxy = replica(world, seaweed, tmp_path / "a", "creds", "--s3-timeout", "5")
    r = subprocess.run(proxy.argv(), env={**os.environ, **env, "AWS_REGION": "us-east-1"}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    [line] = r.stderr.strip().splitlines()
    assert f"bucket s3://{BUCKET}/creds/ refused the credentials of {source}" in line and "403" in line, line
    assert wrong not in r.stderr + r.stdout and ACCESS_KEY not in r.stderr + r.stdout


@pytest.mark.slow
def test_a_restore_without_its_high_water_mark_is_detected_from_the_bucket(seaweed: Seaweed, tmp_path: Path) -> None:
    """Issue 27, item 4: a backup restored on a new host (no run/ left) is older than the bucket's timestamp."""
    import shutil

    with gateway_to_bucket(seaweed, tmp_path, "restored") as gw:
        assert gw.publish("base")[0] == 200
        shutil.copytree(gw.directory / "public", tmp_path / "backup", ignore=shutil.ignore_patterns(".*.tmp"))
        assert gw.publish("lib")[0] == 200  # pushed before the answer: the bucket holds the newer timestamp
        gw.stop()
        shutil.rmtree(gw.directory / "public")
        shutil.copytree(tmp_path / "backup", gw.directory / "public")
        (gw.directory / "gateway" / "run" / "high-water.json").unlink()
        gw.start()
        restored = [line for line in gw.log().splitlines() if "restored from an older copy" in line]
        assert len(restored) == 1 and "re-signed every online role" in restored[0], gw.log()
        assert gw.publish("app")[0] == 200


def test_after_its_first_walk_a_push_takes_the_journal(seaweed: Seaweed, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import obstore
    from prometheus_client import CollectorRegistry

    from proxy.storage.treepush import TreePush
    from proxy.transport.bucket import Bucket
    from proxy.util.journal import Journal
    from proxy.util.metrics import BucketMetrics

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    tree = tmp_path / "public"
    for name in ("metadata/timestamp.json", "metadata/7.snapshot.json", "simple/app/ab12.index.json"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(name.encode())
    journal = Journal(tmp_path / "written.journal")
    journal.wrote(["simple/app/ab12.index.json"])  # before the walk: covered by it
    store = bucket_store(seaweed, "journal")
    push = TreePush(Bucket(f"s3://{BUCKET}/journal", BucketMetrics(CollectorRegistry()), seaweed.endpoint), tree,
                    tmp_path / "push.lock", journal=journal)
    assert asyncio.run(push.push()) == 3

    def listed() -> set[str]:
        return {m["path"] for batch in obstore.list(store) for m in batch}
    # Written but not told: no walk finds it.  Told: pushed, the timestamp as it was before the journal was read.
    (tree / "simple/app/untold.index.json").write_bytes(b"x")
    (tree / "metadata/8.snapshot.json").write_bytes(b"8")
    (tree / "simple/app/ab12.index.json").unlink()
    journal.wrote(["metadata/8.snapshot.json", "metadata/timestamp.json"])
    journal.removed(["simple/app/ab12.index.json", "metadata/.timestamp.json.1.tmp", "../escape"])
    (tree / "metadata/timestamp.json").write_bytes(b"v8")
    assert asyncio.run(push.push()) == 2
    assert listed() == {"metadata/timestamp.json", "metadata/7.snapshot.json", "metadata/8.snapshot.json"}
    assert obstore.get(store, "metadata/timestamp.json").bytes().to_bytes() == b"v8"
    assert asyncio.run(push.push()) == 0  # nothing told since
    # A push between a commit's journal lines and its timestamp write takes the timestamp's line with the old
    # bytes (another worker's push, the 5 s one, a revoke in another process): the next push still sends the
    # new timestamp, which no journal line names any more.
    (tree / "metadata/9.snapshot.json").write_bytes(b"9")
    journal.wrote(["metadata/9.snapshot.json", "metadata/timestamp.json"])
    asyncio.run(push.push())
    assert obstore.get(store, "metadata/timestamp.json").bytes().to_bytes() == b"v8"
    (tree / "metadata/timestamp.json").write_bytes(b"v9")  # the commit point
    journal.wrote(["simple/app/index.json"])  # the plain names, told after it
    asyncio.run(push.push())
    assert obstore.get(store, "metadata/timestamp.json").bytes().to_bytes() == b"v9"


def test_a_restarted_pusher_uploads_what_changed_not_the_whole_tree(seaweed: Seaweed, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import obstore
    from prometheus_client import CollectorRegistry

    from proxy.storage.treepush import TreePush
    from proxy.transport.bucket import Bucket
    from proxy.util.journal import Journal
    from proxy.util.metrics import BucketMetrics

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    tree = tmp_path / "public"
    names = ["metadata/timestamp.json", "metadata/7.snapshot.json", "simple/app/index.json",
             f"simple/app/{'ab' * 32}.index.json", "packages/app/app-1.0-py3-none-any.whl"]
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(name.encode())
    store = bucket_store(seaweed, "restart")

    def pusher() -> TreePush:  # a process starting: nothing pushed by it yet, the tree walked once
        return TreePush(Bucket(f"s3://{BUCKET}/restart", BucketMetrics(CollectorRegistry()), seaweed.endpoint), tree,
                        tmp_path / "push.lock", journal=Journal(tmp_path / "written.journal"))
    assert asyncio.run(pusher().push()) == len(names)
    assert asyncio.run(pusher().push()) == 0  # everything is there, with the same bytes
    # While it was down: a plain page rewritten at the same size, a new page, a versioned role damaged in the
    # bucket to another size (pushed again).
    (tree / "simple/app/index.json").write_bytes(b"simple/app/INDEX.json")
    (tree / f"simple/app/{'cd' * 32}.index.json").write_bytes(b"new")
    obstore.put(store, "metadata/7.snapshot.json", b"torn")
    assert asyncio.run(pusher().push()) == 3
    assert obstore.get(store, "simple/app/index.json").bytes().to_bytes() == b"simple/app/INDEX.json"
    assert obstore.get(store, "metadata/7.snapshot.json").bytes().to_bytes() == b"metadata/7.snapshot.json"
    # A kept file damaged on this disk since, to another size: the bytes under its name never change, so the
    # bucket's copy (pushed from a checked, fsynced file) stays; the gateway re-checks its own at first serve.
    wheel = "packages/app/app-1.0-py3-none-any.whl"
    (tree / wheel).write_bytes(b"cut")
    assert asyncio.run(pusher().push()) == 0
    assert obstore.get(store, wheel).bytes().to_bytes() == wheel.encode()
