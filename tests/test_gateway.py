"""``tufproxy gateway`` end to end: test index -> gateway -> edge (``serve --profile gateway``) -> pip and uv.

Everything is real: the index is an aiohttp server on 127.0.0.1 serving
wheels and sdists built here, the gateway and the edge are ``tufproxy``
subprocesses, pip and uv run as users run them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository.sample import build_sdist, build_wheel
from tests.support.clients import install, uv_path
from tests.support.gatewayproc import GatewayProcess, install_chain_first_try
from tests.support.gatewayproc import edge_for as _edge
from tests.support.gatewayproc import gateway_init as _gateway_init
from tests.support.gatewayproc import metric as _metric
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

CLIENTS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(uv_path() is None, reason="uv not installed"))]
CHAIN = ("app", "lib", "base")


@pytest.fixture
def test_index(tmp_path: Path) -> Iterator[TestIndex]:
    dists = tmp_path / "dists"
    index = TestIndex(separate_files_host=True)
    for path in (build_wheel(dists, "app", "1.0", requires=["lib>=1.0"]), build_wheel(dists, "lib", "1.0", requires=["base"]),
                 build_wheel(dists, "base", "2.0"), build_sdist(dists, "base", "2.0")):
        index.add(path)
    index.add(build_wheel(dists, "future-only", "1.0", requires_python=">=4"), requires_python=">=4")
    with index:
        yield index


@pytest.fixture
def gateway(tmp_path: Path, test_index: TestIndex) -> Iterator[GatewayProcess]:
    _gateway_init(tmp_path / "gw")
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url,
                        "--page-ttl", "1", "--batch-window", "0.1") as gw:
        yield gw


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_chain_installs_through_edge_and_gateway_on_first_try(tmp_path: Path, gateway: GatewayProcess, client: str) -> None:
    """Nothing is published yet: the edge's misses ask the gateway (the miss protocol), pip and uv never retry."""
    install_chain_first_try(tmp_path, gateway, client)
    # The gateway pinned what it published and fetched each installed file once.
    ledger = json.loads(subprocess.run([sys.executable, "-m", "proxy", "gateway", "ledger", str(gateway.directory), "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    pinned = {e["filename"] for e in ledger if e["kind"] == "pin"}
    assert {"app-1.0-py3-none-any.whl", "base-2.0.tar.gz"} <= pinned
    assert all(e["index"] == gateway_index(ledger) for e in ledger if e["kind"] == "pin")


def gateway_index(ledger: list[dict]) -> str:  # type: ignore[type-arg]
    return next(e["index"] for e in ledger if e["kind"] == "project")


@pytest.mark.slow
def test_publish_answers_404_and_page_is_signed_with_fields(
    tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex
) -> None:
    status, answer = gateway.publish("no-such-project")
    assert status == 404 and answer["reason"] == "not-found"
    test_index.file("lib-1.0-py3-none-any.whl").yanked = "broken"
    status, answer = gateway.publish("Lib")
    assert status == 200 and answer["project"] == "lib"
    page = json.loads((gateway.directory / "public" / "simple" / "lib" / "index.json").read_bytes())
    (entry,) = page["files"]
    assert entry["url"] == "../../packages/lib/lib-1.0-py3-none-any.whl"
    assert entry["yanked"] == "broken" and entry["upload-time"].startswith("2024-01-01")
    assert entry["size"] == len(test_index.file("lib-1.0-py3-none-any.whl").data)
    assert set(entry["core-metadata"]) == {"sha256"} and page["versions"] == ["1.0"]
    assert gateway.publish("future-only")[0] == 200
    page = json.loads((gateway.directory / "public" / "simple" / "future-only" / "index.json").read_bytes())
    assert [f["requires-python"] for f in page["files"]] == [">=4"]


@pytest.mark.slow
def test_concurrent_cold_projects_cost_few_signatures(tmp_path: Path, test_index: TestIndex) -> None:
    for i in range(50):
        test_index.add(build_wheel(tmp_path / "many", f"proj{i}", "1.0"))
    _gateway_init(tmp_path / "gw")
    with GatewayProcess(
        tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url, "--batch-window", "0.5"
    ) as gw:
        before = _metric(gw.base, "tufproxy_gateway_publishes_total")
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(gw.publish, [f"proj{i}" for i in range(50)]))
        assert all(status == 200 for status, _ in answers)
        batches = _metric(gw.base, "tufproxy_gateway_publishes_total") - before
        print(f"50 concurrent cold projects: {batches:.0f} publishes (snapshot + timestamp signatures)")
        assert 1 <= batches <= 5
        assert gw.listed() >= {f"proj{i}" for i in range(50)}


@pytest.mark.slow
def test_changed_file_is_refused_and_pinned_one_still_installs(
    tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex
) -> None:
    for project in CHAIN:
        assert gateway.publish(project)[0] == 200
    with _edge(tmp_path, gateway) as edge:
        assert install("pip", edge.url, tmp_path / "t1", "app").returncode == 0
    # The index now serves other bytes under the pinned name, and lists their hash.
    swapped = build_wheel(tmp_path / "evil", "base", "2.0", payload=b"evil")
    test_index.file("base-2.0-py3-none-any.whl").data = swapped.read_bytes()
    wait_for(lambda: any(a.get("reason") == "upstream-changed-file" for a in gateway.audit()), what="upstream-changed-file")
    assert _metric(gateway.base, "tufproxy_gateway_pins_refused_total") >= 1
    with _edge(tmp_path, gateway, "edge2") as edge:
        r = install("pip", edge.url, tmp_path / "t2", "app")
        assert r.returncode == 0, r.stdout + r.stderr
    assert b"evil" not in (tmp_path / "t2" / "base" / "__init__.py").read_bytes()


@pytest.mark.slow
def test_file_differing_from_its_pin_is_a_502_and_never_published(
    tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex
) -> None:
    assert gateway.publish("lib")[0] == 200
    entry = test_index.file("lib-1.0-py3-none-any.whl")
    # Same length, other bytes: the page still names the pinned hash (it is re-fetched only after the ttl).
    entry.data = entry.data[:-1] + bytes([entry.data[-1] ^ 1])
    url = f"{gateway.base}packages/lib/lib-1.0-py3-none-any.whl"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10).read()
    assert refused.value.code == 502
    # The whole file fits in the held-back tail, so the refusal comes before any byte.
    assert refused.value.reason.startswith("hash-mismatch: ")
    assert refused.value.headers["X-Tufproxy-Reason"] == "hash-mismatch"
    body = json.loads(refused.value.read())
    assert body["reason"] == "hash-mismatch"
    assert not (gateway.directory / "public" / "packages" / "lib" / "lib-1.0-py3-none-any.whl").exists()
    # The index lied: the same fault on the answer, the audit record and the metric.
    assert body["fault"] == "repository"
    assert any(a.get("reason") == "hash-mismatch" and a.get("fault") == "repository" for a in gateway.audit())
    assert _metric(gateway.base, 'tufproxy_gateway_refusals_total{kind="repository",reason="hash-mismatch"}') >= 1


@pytest.mark.slow
def test_new_release_and_yank_propagate_within_ttl(tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex) -> None:
    for project in CHAIN:
        assert gateway.publish(project)[0] == 200
    with _edge(tmp_path, gateway) as edge:
        test_index.add(build_wheel(tmp_path / "new", "lib", "1.1", requires=["base"]))
        test_index.file("lib-1.0-py3-none-any.whl").yanked = "bad"
        page = gateway.directory / "public" / "simple" / "lib" / "index.json"
        wait_for(lambda: b"lib-1.1" in page.read_bytes(), what="new release signed")
        wait_for(
            lambda: (
                install("pip", edge.url, tmp_path / "t", "lib").returncode == 0
                and (tmp_path / "t" / "lib-1.1.dist-info").is_dir()
            ),
            what="pip sees lib 1.1",
        )
        yanked = json.loads(page.read_bytes())["files"][0]
        assert yanked["filename"] == "lib-1.0-py3-none-any.whl" and yanked["yanked"] == "bad"


@pytest.mark.slow
def test_revoked_file_is_gone_after_one_publish(tmp_path: Path, gateway: GatewayProcess,
                                                test_index: TestIndex) -> None:
    for project in CHAIN:
        assert gateway.publish(project)[0] == 200
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "gateway",
            "revoke",
            str(gateway.directory),
            "base",
            "base-2.0-py3-none-any.whl",
            "--reason",
            "malware",
            "--audit-log",
            str(tmp_path / "revoke.audit"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "published" in r.stdout
    assert json.loads((tmp_path / "revoke.audit").read_text())["reason"] == "revoked"
    with _edge(tmp_path, gateway) as edge:
        r = install("pip", edge.url, tmp_path / "t", "--only-binary", ":all:", "base")
        assert r.returncode != 0  # only the sdist is left, and binaries were asked for
        seen = urllib.request.urlopen(f"{edge.url}base/", timeout=10).read().decode()
        assert "base-2.0.tar.gz" in seen and "base-2.0-py3-none-any.whl" not in seen
    # Later refreshes (ttl 1 s) keep it out.
    fetched = test_index.requests.count("/simple/base/")
    wait_for(lambda: test_index.requests.count("/simple/base/") >= fetched + 2, what="two refreshes")
    page = json.loads((gateway.directory / "public" / "simple" / "base" / "index.json").read_bytes())
    assert [f["filename"] for f in page["files"]] == ["base-2.0.tar.gz"]


@pytest.mark.slow
def test_page_linking_to_disallowed_origin_is_refused(tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex) -> None:
    test_index.raw_pages["intruder"] = (
        b'<html><body><a href="http://10.0.0.1/x/intruder-1.0-py3-none-any.whl#sha256=' + b"a" * 64 + b'">'
        b"intruder-1.0-py3-none-any.whl</a></body></html>"
    )
    status, answer = gateway.publish("intruder")
    assert status == 502 and answer["reason"] == "foreign-origin"
    assert any(a.get("reason") == "foreign-origin" for a in gateway.audit())
    assert not (gateway.directory / "public" / "simple" / "intruder").exists()
    assert gateway.publish("lib")[0] == 200  # the gateway keeps serving


@pytest.mark.slow
def test_credentials_never_reach_logs(tmp_path: Path, test_index: TestIndex) -> None:
    _gateway_init(tmp_path / "gw")
    secret = "s3cr3t-pass"
    url = test_index.url.replace("http://", f"http://user:{secret}@")
    # An index with credentials makes its projects private; this test reads them anonymously, knowingly.
    with GatewayProcess(tmp_path / "gw", "--index-url", url, "--files-origin", test_index.files_url,
                        "--allow-anonymous-private", "yes") as gw:
        test_index.raw_pages["intruder"] = b'<a href="http://10.0.0.1/intruder-1.0.tar.gz#sha256=' + b"b" * 64 + b'">x</a>'
        assert gw.publish("lib")[0] == 200
        assert gw.publish("intruder")[0] == 502
        urllib.request.urlopen(f"{gw.base}packages/lib/lib-1.0-py3-none-any.whl", timeout=10).read()
        metrics = urllib.request.urlopen(f"{gw.base}metrics", timeout=10).read().decode()
    ledger = (tmp_path / "gw" / "gateway" / "ledger.jsonl").read_text()
    for text in (gw.log(), gw.audit_path.read_text(), metrics, ledger):
        assert secret not in text


@pytest.mark.slow
def test_restore_from_older_backup_keeps_versions_increasing(tmp_path: Path, test_index: TestIndex) -> None:
    import shutil

    from proxy.repository import Repository

    _gateway_init(tmp_path / "gw")
    # No prefetch: the backup is taken of a quiet gateway (a copy taken mid-publish is the restore tests' matter).
    quiet = ("--prefetch-depth", "0")
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url,
                        *quiet) as gw:
        assert gw.publish("lib")[0] == 200
        # A copy of a running gateway: its atomic writes' temp files may vanish mid-copy and are no state.
        shutil.copytree(tmp_path / "gw", tmp_path / "backup", ignore=shutil.ignore_patterns(".*.tmp"))
        seen = max(gw.publish(p)[1]["timestamp_version"] for p in ("app", "base"))
    shutil.rmtree(tmp_path / "gw")
    shutil.copytree(tmp_path / "backup", tmp_path / "gw")
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url) as gw:
        assert gw.publish("app")[1]["timestamp_version"] > seen
    repo = Repository.open(tmp_path / "gw")
    assert repo.status()["roles"]["snapshot"]["version"] > 1  # type: ignore[index]


@pytest.mark.slow
def test_edge_miss_protocol_publishes_then_trusts(tmp_path: Path, gateway: GatewayProcess) -> None:
    """proxy.serving.edge against the real gateway, with the edge's real trust core and store."""
    import asyncio

    from proxy.protocol.errors import UnknownTarget
    from proxy.serving.edge import MissProtocol
    from proxy.transport.upstream import AiohttpFetcher
    from proxy.trust import Mirror, TrustConfig, TrustedClient
    from proxy.util.locks import FetchLocks

    async def run() -> None:
        TrustedClient.initialize(tmp_path / "meta", gateway.root.read_bytes())
        fetcher = AiohttpFetcher()
        trust = TrustedClient(
            tmp_path / "meta", [Mirror(f"{gateway.base}metadata/", gateway.base)], fetcher, TrustConfig(refresh_interval=3600)
        )
        miss = MissProtocol([gateway.base], trust, FetchLocks(tmp_path / "locks"))
        try:
            await trust.refresh(force=True)
            with pytest.raises(UnknownTarget):
                await trust.get_target("simple/lib/index.json")
            start = time.monotonic()
            assert await asyncio.gather(miss.on_miss("lib"), miss.on_miss("lib")) == [True, True]
            print(f"edge miss -> publish -> trusted: {time.monotonic() - start:.2f}s")
            target = await trust.get_target("simple/lib/index.json")
            assert target.length > 0
            with pytest.raises(UnknownTarget) as missing:
                await miss.on_miss("no-such-project")
            assert missing.value.detail == "gateway: no-such-project: no index lists it"
        finally:
            trust.close()
            await fetcher.close()

    asyncio.run(run())


def _publish_until_killed(gw: GatewayProcess, project: str) -> None:
    with contextlib.suppress(OSError):  # the gateway dies under this request on purpose
        gw.publish(project, timeout=5)


@pytest.mark.slow
def test_kill_9_loop_never_shows_an_edge_a_rollback(tmp_path: Path, test_index: TestIndex) -> None:
    """kill -9 the gateway mid-publish again and again: every restart offers an edge only newer, verifiable metadata."""
    import asyncio

    from proxy.protocol.errors import UnknownTarget
    from proxy.transport.upstream import AiohttpFetcher
    from proxy.trust import Mirror, TrustConfig, TrustedClient

    for i in range(40):
        test_index.add(build_wheel(tmp_path / "many", f"crash{i}", "1.0"))
    _gateway_init(tmp_path / "gw")
    TrustedClient.initialize(tmp_path / "edge-meta", (tmp_path / "gw" / "public" / "metadata" / "1.root.json").read_bytes())
    rng = random.Random(19)
    trusted: list[int] = []

    async def edge_refresh(base: str) -> int:
        fetcher = AiohttpFetcher()
        trust = TrustedClient(
            tmp_path / "edge-meta", [Mirror(f"{base}metadata/", base)], fetcher, TrustConfig(refresh_interval=3600)
        )
        try:
            await trust.refresh(force=True)  # raises on rollback, bad signature, torn metadata
            for project in ("crash0",):
                with contextlib.suppress(UnknownTarget):
                    await trust.get_target(f"simple/{project}/index.json")
            assert trust.timestamp_version is not None
            return trust.timestamp_version
        finally:
            trust.close()
            await fetcher.close()

    args = ("--index-url", test_index.url, "--files-origin", test_index.files_url, "--batch-window", "0.05")
    next_project = 0
    for _round in range(8):
        gw = GatewayProcess(tmp_path / "gw", *args).start()
        trusted.append(asyncio.run(edge_refresh(gw.base)))
        names = [f"crash{(next_project + k) % 40}" for k in range(5)]
        next_project += 5
        threads = [threading.Thread(target=_publish_until_killed, args=(gw, n)) for n in names]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.05, 0.4))  # the kill lands at a random point of the publish: that is the test
        gw.kill()
        for t in threads:
            t.join(10)
    gw = GatewayProcess(tmp_path / "gw", *args).start()
    try:
        trusted.append(asyncio.run(edge_refresh(gw.base)))
        assert gw.publish("crash1")[0] == 200
        trusted.append(asyncio.run(edge_refresh(gw.base)))
    finally:
        gw.stop()
    print(f"timestamp versions an edge trusted across 8 kill -9: {trusted}")
    assert trusted == sorted(trusted) and trusted[-1] > trusted[0]


@pytest.mark.slow
def test_metadata_headers_and_gc(tmp_path: Path, gateway: GatewayProcess) -> None:
    import gzip

    from proxy.gateway.freshness import Collector
    from proxy.repository import Repository

    for project in CHAIN:
        assert gateway.publish(project)[0] == 200
    with urllib.request.urlopen(f"{gateway.base}metadata/timestamp.json", timeout=10) as r:
        assert r.headers["Cache-Control"] == "no-cache"
        version = json.loads(r.read())["signed"]["meta"]["snapshot.json"]["version"]
    req = urllib.request.Request(f"{gateway.base}metadata/{version}.snapshot.json", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip" and "immutable" in r.headers["Cache-Control"]
        snapshot = json.loads(gzip.decompress(r.read()))["signed"]
        assert snapshot["_type"] == "snapshot"
    bin_n = next(f"{m['version']}.{role}" for role, m in snapshot["meta"].items() if role.startswith("bin-"))
    req = urllib.request.Request(f"{gateway.base}metadata/{bin_n}", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as r:  # what each new project costs an edge, compressed too
        assert r.headers["Content-Encoding"] == "gzip" and "immutable" in r.headers["Cache-Control"]
        assert json.loads(gzip.decompress(r.read()))["signed"]["_type"] == "targets"
    for name in ("healthz", "readyz"):
        assert urllib.request.urlopen(f"{gateway.base}{name}", timeout=10).status == 200
    repo = Repository.open(gateway.directory)
    snapshots = lambda: sorted(repo.metadata_dir.glob("*.snapshot.json"))  # noqa: E731
    assert len(snapshots()) >= 3
    assert Collector(repo, grace=0).collect(()) >= 1
    # The current snapshot and the one before it stay; the edge still refreshes.
    assert len(snapshots()) == 2
    with _edge(tmp_path, gateway) as edge:
        assert install("pip", edge.url, tmp_path / "t", "app").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("tamper", [False, True], ids=["intact", "tampered-tail"])
def test_cold_file_streams_before_the_index_finishes(
    tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex, tamper: bool
) -> None:
    """The client gets bytes while the index still holds the rest; the last byte only after the hash matched."""
    import http.client

    # Incompressible, so the first half the index sends before holding is more than one fetch batch (1 MiB).
    big = build_wheel(tmp_path / "big", "bigpkg", "1.0", payload=random.Random(1).randbytes(4 << 20))
    entry = test_index.add(big)
    assert gateway.publish("bigpkg")[0] == 200
    if tamper:  # same length, the second half differs from the pinned hash
        half = len(entry.data) // 2
        entry.data = entry.data[:half] + bytes(b ^ 0xFF for b in entry.data[half:])
    gate = test_index.hold[big.name] = threading.Event()
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    conn.request("GET", f"/packages/bigpkg/{big.name}")
    response = conn.getresponse()
    assert response.status == 200 and int(response.headers["Content-Length"]) == len(entry.data)
    first = response.read(64 * 1024)  # arrives while the index is still holding the second half
    assert len(first) == 64 * 1024 and not gate.is_set()
    gate.set()
    if tamper:
        with pytest.raises((http.client.IncompleteRead, ConnectionError)):
            response.read()
        assert not (gateway.directory / "public" / "packages" / "bigpkg" / big.name).exists()
        wait_for(lambda: any(a.get("reason") == "hash-mismatch" for a in gateway.audit()), what="audit record")
        # The client resuming the cut body is refused at once; a new request asks the index again.
        asked = lambda: sum(r.endswith(big.name) for r in test_index.requests)  # noqa: E731
        before = asked()
        for headers, fetched in (({"Range": f"bytes={len(first)}-"}, 0), ({}, 1)):
            again = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
            again.request("GET", f"/packages/bigpkg/{big.name}", headers=headers)
            answer = again.getresponse()
            with contextlib.suppress(http.client.IncompleteRead, ConnectionError):
                answer.read()
            again.close()
            assert asked() == before + fetched and (fetched or answer.status == 502)
    else:
        assert first + response.read() == big.read_bytes()
        kept = gateway.directory / "public" / "packages" / "bigpkg" / big.name  # kept behind the answer
        wait_for(lambda: kept.exists() and kept.read_bytes() == big.read_bytes(), what="the kept file")
    conn.close()


@pytest.mark.slow
def test_joined_clients_stream_one_cold_fetch(tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex) -> None:
    """A second request for a file in flight streams the same body before the index finishes; one index fetch."""
    import http.client

    big = build_wheel(tmp_path / "big", "joinpkg", "1.0", payload=random.Random(2).randbytes(4 << 20))
    test_index.add(big)
    assert gateway.publish("joinpkg")[0] == 200
    gate = test_index.hold[big.name] = threading.Event()
    responses = []
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
        conn.request("GET", f"/packages/joinpkg/{big.name}")
        responses.append(conn.getresponse())
    # Every client has bytes while the index still holds the second half.
    firsts = [r.read(64 * 1024) for r in responses]
    assert all(len(f) == 64 * 1024 for f in firsts) and not gate.is_set()
    gate.set()
    assert all(f + r.read() == big.read_bytes() for f, r in zip(firsts, responses, strict=True))
    assert sum(p.endswith(big.name) for p in test_index.requests) == 1  # (the prefetch reads its .metadata)


@pytest.mark.slow
def test_cold_big_wheel_through_edge_and_gateway_beats_pips_timeout(
    tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex
) -> None:
    """Issue 19 item 10, scaled down: a file taking ~3x pip's --timeout to leave the index still installs on the first try."""
    from tests.support.clients import pip
    from tests.support.faults import sized_wheel

    wheel = sized_wheel(tmp_path / "big", "slowbig", "1.0", 9 * 2**20)
    test_index.add(wheel).rate = 2**20  # 1 MiB/s: about 9 s, while pip allows 3 s of silence
    with _edge(tmp_path, gateway) as edge:
        start = time.monotonic()
        r = pip(
            "install",
            "--timeout",
            "3",
            "--retries",
            "0",
            "--index-url",
            edge.url,
            "--target",
            str(tmp_path / "t"),
            "slowbig",
            timeout=120,
        )
        took = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr
    assert took >= 6, f"the file arrived in {took:.1f}s: too fast to show anything"
    assert (tmp_path / "t" / "slowbig" / "data.bin").stat().st_size > 8 * 2**20


@pytest.mark.slow
def test_html_only_index_installs(tmp_path: Path) -> None:
    dists = tmp_path / "dists"
    with TestIndex(mode="html") as index:
        for path in (
            build_wheel(dists, "app", "1.0", requires=["lib>=1.0"]),
            build_wheel(dists, "lib", "1.0", requires=["base"]),
            build_wheel(dists, "base", "2.0"),
        ):
            index.add(path)
        _gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url) as gw:
            for project in CHAIN:
                assert gw.publish(project)[0] == 200
            page = json.loads((gw.directory / "public" / "simple" / "app" / "index.json").read_bytes())
            assert "size" not in page["files"][0]  # HTML gives none: the edge bounds the length instead
            with _edge(tmp_path, gw) as edge:
                r = install("pip", edge.url, tmp_path / "t", "app")
                assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_an_html_client_gets_the_page_rendered_from_the_signed_json_one(tmp_path: Path, gateway: GatewayProcess) -> None:
    """The gateway signs a project's JSON page alone (one page, one bin a publish); the edge renders the PEP 503
    HTML page from it, verified, for a client that asks for HTML, and so does the gateway for a client straight
    at its plain pages."""
    from proxy.protocol import index
    from proxy.repository import Repository

    def get(url: str, accept: str, **headers: str) -> tuple[str, bytes, str | None]:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept, **headers}), timeout=30) as r:
            return r.headers["Content-Type"], r.read(), r.headers["ETag"]

    def files(page: index.ProjectPage) -> list[tuple[str, str | None]]:
        return [(f.filename, f.hashes.get("sha256")) for f in page.files]

    json_type = index.MediaType.JSON_V1.value
    with _edge(tmp_path, gateway) as edge:
        kind, html, _ = get(f"{edge.url}base/", "text/html")  # the miss publishes it
        assert kind.startswith("text/html")
        kind, data, _ = get(f"{edge.url}base/", json_type)
        assert kind.startswith(json_type)
    signed = index.parse_project_json(data, "base")
    assert files(index.parse_project_html(html, "base")) == files(signed) and len(signed.files) == 2
    targets = Repository.open(gateway.directory).signed_targets(["simple/base/index.json", "simple/base/index.html"])
    assert list(targets) == ["simple/base/index.json"]
    kind, plain, etag = get(f"{gateway.base}simple/base/", "text/html")
    assert kind.startswith("text/html") and files(index.parse_project_html(plain, "base")) == files(signed)
    assert get(f"{gateway.base}simple/base/index.html", "*/*")[1] == plain
    assert etag is not None
    with pytest.raises(urllib.error.HTTPError) as unchanged:  # urllib raises on a 304
        get(f"{gateway.base}simple/base/", "text/html", **{"If-None-Match": etag})
    assert unchanged.value.code == 304


@pytest.mark.parametrize(
    "argv, message",
    [
        (["gateway", "serve", "{dir}"], "give --index-url"),
        (["gateway", "serve", "{dir}", "--index-url", "ftp://x/"], "--index-url"),
        (["gateway", "serve", "{missing}", "--index-url", "http://127.0.0.1:9/simple/"], "not a repository"),
        (["gateway", "serve", "{dir}", "--index-url", "http://127.0.0.1:9/simple/", "--workers", "0"], "--workers"),
        (["gateway", "init", "{dir}"], "already holds a repository"),
        (["gateway", "init", "{new}", "--bins", "1000"], "power of two"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    _gateway_init(tmp_path / "gw")
    filled = [a.format(dir=tmp_path / "gw", missing=tmp_path / "nope", new=tmp_path / "new") for a in argv]
    r = subprocess.run([sys.executable, "-m", "proxy", *filled], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr


@pytest.mark.slow
def test_timestamp_is_resigned_before_it_expires_without_changes(tmp_path: Path, test_index: TestIndex) -> None:
    from tuf.api.metadata import Metadata

    _gateway_init(tmp_path / "gw", "--online-expiry", "0.0002")  # 17 s: re-signed every ~2 s, due at half life
    timestamp = tmp_path / "gw" / "public" / "metadata" / "timestamp.json"
    expires = lambda: Metadata.from_bytes(timestamp.read_bytes()).signed.expires  # noqa: E731
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--page-ttl", "4") as gw:
        first = expires()
        wait_for(lambda: expires() > first, timeout=40, what="timestamp re-signed")
        assert urllib.request.urlopen(f"{gw.base}readyz", timeout=10).status == 200


@pytest.mark.slow
def test_unreachable_index_never_unpublishes(tmp_path: Path, test_index: TestIndex) -> None:
    _gateway_init(tmp_path / "gw")
    with GatewayProcess(
        tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url, "--page-ttl", "1"
    ) as gw:
        assert gw.publish("lib")[0] == 200
        test_index.raw_pages["lib"] = b'<meta name="pypi:repository-version" content="2.0">'  # a page we refuse
        wait_for(
            lambda: _metric(gw.base, 'tufproxy_gateway_pages_fetched_total{outcome="refused"}') >= 1, what="a refused refresh"
        )
        test_index.__exit__()  # now the index is gone altogether
        wait_for(
            lambda: _metric(gw.base, 'tufproxy_gateway_pages_fetched_total{outcome="unreachable"}') >= 1,
            what="an unreachable refresh",
        )
        page = json.loads((gw.directory / "public" / "simple" / "lib" / "index.json").read_bytes())
        assert [f["filename"] for f in page["files"]] == ["lib-1.0-py3-none-any.whl"]
        assert gw.publish("lib")[0] == 200  # still published, still answered


@pytest.mark.slow
def test_absent_projects_are_remembered_briefly(tmp_path: Path, gateway: GatewayProcess, test_index: TestIndex) -> None:
    for _ in range(5):
        assert gateway.publish("not-there")[0] == 404
    assert test_index.requests.count("/simple/not-there/") == 1


@pytest.fixture(scope="module")
def strict_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, TestIndex]]:
    """One gateway for every bad-input case: small pages only, a short read timeout."""
    tmp = tmp_path_factory.mktemp("strict")
    with TestIndex(separate_files_host=True) as index:
        _gateway_init(tmp / "gw")
        with GatewayProcess(
            tmp / "gw",
            "--index-url",
            index.url,
            "--files-origin",
            index.files_url,
            "--max-page-size",
            "8K",
            "--read-timeout",
            "1",
            "--batch-window",
            "0.05",
        ) as gw:
            yield gw, index
        for gate in index.stall.values():
            gate.set()  # let a stalled page handler finish before the index stops


def _bad_input(case: str, index: TestIndex) -> None:
    """Make the index answer ``case``'s project badly."""
    link = '<a href="{files}files/{p}/{p}-{v}-py3-none-any.whl{frag}">{p}-{v}-py3-none-any.whl</a>'
    if case == "oversized":
        index.raw_pages[case] = b"<html><!--" + b"x" * (64 << 10) + b"--></html>"
    elif case == "another-project":
        index.raw_pages[case] = json.dumps({"meta": {"api-version": "1.0"}, "name": "lib", "files": []}).encode()
        index.raw_types[case] = "application/vnd.pypi.simple.v1+json"
    elif case == "nohash":
        index.raw_pages[case] = (
            link.format(files=index.files_url, p=case, v="1.0", frag="#sha256=" + "a" * 64)
            + link.format(files=index.files_url, p=case, v="1.1", frag="")
        ).encode()
    elif case == "loop":
        index.redirects[case] = f"/simple/{case}/"
    elif case == "away":
        index.redirects[case] = f"{index.files_url}simple/{case}/"  # another origin: no page may come from there
    elif case == "slow":
        index.stall[case] = threading.Event()


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, status, reason, kind",
    [
        ("oversized", 502, "oversized-page", "repository"),
        ("another-project", 502, "bad-page", "repository"),
        ("nohash", 200, "missing-hash", "repository"),
        ("loop", 502, "bad-redirect", "repository"),
        ("away", 502, "bad-redirect", "repository"),
        ("slow", 502, "upstream-unreachable", "upstream"),
    ],
)
def test_bad_index_input_is_refused_audited_counted_and_never_signed(
    tmp_path: Path, strict_gateway: tuple[GatewayProcess, TestIndex], case: str, status: int, reason: str, kind: str
) -> None:
    gw, index = strict_gateway
    _bad_input(case, index)
    counted = f'tufproxy_gateway_refusals_total{{kind="{kind}",reason="{reason}"}}'
    before = _metric(gw.base, counted)
    answer = gw.publish(case)
    assert answer[0] == status, answer
    signed = gw.directory / "public" / "simple" / case / "index.json"
    if status == 200:  # the page is signed without the entry that had no sha256
        assert [f["filename"] for f in json.loads(signed.read_bytes())["files"]] == ["nohash-1.0-py3-none-any.whl"]
        target = "packages/nohash/nohash-1.1-py3-none-any.whl"
    else:
        assert answer[1]["reason"] == reason and not signed.exists()
        target = f"simple/{case}/"
    assert any(a.get("reason") == reason and a.get("target") == target and a.get("fault") == kind
               for a in gw.audit()), gw.audit()[-3:]
    assert _metric(gw.base, counted) >= before + 1
    # The gateway keeps serving: a good project never seen before still publishes.
    good = "after" + case.replace("-", "")
    index.add(build_wheel(tmp_path / "good", good, "1.0"))
    assert gw.publish(good)[0] == 200


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, its own CA (PEM files: certificate, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test index")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "index.pem", directory / "index.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.mark.slow
def test_tls_index_needs_its_ca_bundle(tmp_path: Path) -> None:
    import ssl

    cert, key = _self_signed(tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with TestIndex(ssl_context=context) as index:
        index.add(build_wheel(tmp_path / "dists", "lib", "1.0"))
        _gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url) as gw:
            status, answer = gw.publish("lib")
            assert status == 502 and answer["reason"] == "upstream-unreachable"
            assert "certificate" in answer["detail"].lower(), answer
            assert not (gw.directory / "public" / "simple" / "lib").exists()
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--ca-bundle", str(cert)) as gw:
            assert gw.publish("lib")[0] == 200
            body = urllib.request.urlopen(f"{gw.base}packages/lib/lib-1.0-py3-none-any.whl", timeout=10).read()
            assert body == index.file("lib-1.0-py3-none-any.whl").data


@pytest.mark.slow
def test_netrc_authenticates_and_never_follows_a_redirect_to_another_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    header = "Basic " + base64.b64encode(b"reader:n3trc-pass").decode()
    (tmp_path / "netrc").write_text("machine 127.0.0.1 login reader password n3trc-pass\n")
    (tmp_path / "netrc").chmod(0o600)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with TestIndex(separate_files_host=True, basic_auth=header, files_via_index=True) as index:
        index.add(build_wheel(tmp_path / "dists", "lib", "1.0"))
        _gateway_init(tmp_path / "gw")
        # The index needs credentials: its projects are private; this test reads them anonymously on purpose.
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--files-origin", index.files_url,
                            "--allow-anonymous-private", "yes") as gw:
            assert gw.publish("lib")[0] == 200
            body = urllib.request.urlopen(f"{gw.base}packages/lib/lib-1.0-py3-none-any.whl", timeout=10).read()
            assert body == index.file("lib-1.0-py3-none-any.whl").data
    seen = index.authorization
    assert ("index", "/simple/lib/", header) in seen
    assert ("index", "/files/lib/lib-1.0-py3-none-any.whl", header) in seen  # then redirected to the files host
    files = [auth for host, _, auth in seen if host == "files"]
    assert files and files == [None] * len(files)


@pytest.mark.slow
def test_file_removed_at_the_index_leaves_the_signed_page_within_the_ttl(gateway: GatewayProcess, test_index: TestIndex) -> None:
    assert gateway.publish("base")[0] == 200
    page = gateway.directory / "public" / "simple" / "base" / "index.json"
    names = lambda: [f["filename"] for f in json.loads(page.read_bytes())["files"]]  # noqa: E731
    assert "base-2.0.tar.gz" in names()
    test_index.projects["base"] = [f for f in test_index.projects["base"] if f.path.name != "base-2.0.tar.gz"]
    start = time.monotonic()
    wait_for(lambda: names() == ["base-2.0-py3-none-any.whl"], timeout=15, what="the removed file leaves the page")
    # --page-ttl 1: due after 1 s, picked up at the next tick (a quarter ttl), signed after one batch window.
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_three_projects_changing_together_cost_one_signature(tmp_path: Path, test_index: TestIndex) -> None:
    """Three pages found changed by one refresh are signed in one batch: one snapshot and timestamp, not three."""
    projects = ("app", "lib", "base")
    _gateway_init(tmp_path / "gw")
    args = ("--index-url", test_index.url, "--files-origin", test_index.files_url)
    with GatewayProcess(tmp_path / "gw", *args) as gw:
        for project in projects:
            assert gw.publish(project)[0] == 200
        fetched = time.monotonic()
    for project in projects:
        test_index.add(build_wheel(tmp_path / "new", project, "9.0"))
    # Restarted with a short ttl: all three were fetched before this process, so all are due at its first refresh
    # once that ttl has passed since the last fetch (a start takes well under a second now: without this, the
    # last page could still be fresh at the first refresh and be signed in a batch of its own).
    wait_for(lambda: time.monotonic() - fetched > 1.0, what="the 1 s page ttl to pass since the last fetch")
    with GatewayProcess(tmp_path / "gw", *args, "--page-ttl", "1", "--refresh-rate", "100") as gw:
        pages = [gw.directory / "public" / "simple" / p / "index.json" for p in projects]
        wait_for(lambda: all(b"-9.0-" in p.read_bytes() for p in pages), what="three new releases signed")
        # Later refreshes find nothing changed: still one batch, however long we look.
        seen = test_index.requests.count("/simple/app/")
        wait_for(lambda: test_index.requests.count("/simple/app/") >= seen + 2, what="two more refreshes")
        assert _metric(gw.base, "tufproxy_gateway_publishes_total") == 1


@pytest.mark.slow
def test_refresh_rate_bounds_page_fetches(tmp_path: Path, test_index: TestIndex) -> None:
    for i in range(12):
        test_index.add(build_wheel(tmp_path / "many", f"rated{i}", "1.0"))
    _gateway_init(tmp_path / "gw")
    rate = 4.0
    with GatewayProcess(
        tmp_path / "gw",
        "--index-url",
        test_index.url,
        "--files-origin",
        test_index.files_url,
        "--page-ttl",
        "1",
        "--refresh-rate",
        str(rate),
    ) as gw:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            assert all(s == 200 for s, _ in pool.map(gw.publish, [f"rated{i}" for i in range(12)]))
        # Twelve pages are due every second; the refresher may fetch only `rate` a second.
        fetches = lambda: sum(p.startswith("/simple/rated") for p in test_index.requests)  # noqa: E731
        first = fetches()
        wait_for(lambda: fetches() > first, what="a first refresh")
        start, base = time.monotonic(), fetches()
        wait_for(lambda: fetches() >= base + 8, timeout=30, what="eight refreshes")
        took = time.monotonic() - start
    assert 8 / took <= rate * 1.1, f"{fetches() - base} page fetches in {took:.2f}s"


@pytest.mark.slow
def test_a_restart_refetches_only_the_pages_whose_ttl_has_passed(tmp_path: Path, test_index: TestIndex) -> None:
    """Fetch times survive a restart: of two published pages, only the one fetched longer ago than --page-ttl
    is fetched again (before, a restart found every published page due at once)."""
    _gateway_init(tmp_path / "gw")
    args = ("--index-url", test_index.url, "--files-origin", test_index.files_url, "--page-ttl", "3600",
            "--refresh-rate", "100")
    with GatewayProcess(tmp_path / "gw", *args) as gw:
        for project in ("app", "lib"):
            assert gw.publish(project)[0] == 200
        wait_for(lambda: "base" in gw.listed(), what="base published behind app, as its dependency")
    # The clean stop kept the catalog: a start takes every bin from it and reads none (it would say unsaved).
    from proxy.repository import Repository
    from proxy.repository.catalog import Catalog

    kept = Catalog(Repository.open(tmp_path / "gw"), tmp_path / "gw" / "gateway" / "run" / "catalog.json").update()
    assert kept.projects == {"app", "lib", "base"} and not kept.unsaved
    times = tmp_path / "gw" / "gateway" / "run" / "fetched.jsonl"
    recorded = [json.loads(line) for line in times.read_bytes().splitlines()]
    assert {r["p"] for r in recorded} == {"app", "lib", "base"}  # base: prefetched as app's dependency
    with times.open("ab") as f:  # lib was last fetched two hours ago, as if the gateway had been down that long
        f.write(json.dumps({"p": "lib", "t": time.time() - 7200}).encode() + b"\n" + b'{"torn": \n')
    seen = {p: test_index.requests.count(f"/simple/{p}/") for p in ("app", "lib", "base")}
    with GatewayProcess(tmp_path / "gw", *args) as gw:
        wait_for(lambda: _metric(gw.base, 'tufproxy_gateway_pages_fetched_total{outcome="ok"}') >= 1,
                 what="lib re-fetched: its ttl passed while the gateway was down")
        assert test_index.requests.count("/simple/lib/") > seen["lib"]
        for fresh in ("app", "base"):
            assert test_index.requests.count(f"/simple/{fresh}/") == seen[fresh], f"{fresh} was fetched within its ttl"


@pytest.mark.slow
def test_an_edge_that_knows_every_gateway_passes_over_one_that_is_down(tmp_path: Path, test_index: TestIndex) -> None:
    """--upstream and --gateway-url repeated: the first gateway of each list is down (its port refuses), the
    second answers; pip installs a chain no gateway had published, through reads and publishes that fail over."""
    from tests.support.net import free_port
    from tests.support.proxyproc import ProxyProcess

    _gateway_init(tmp_path / "gw")
    down = f"http://127.0.0.1:{free_port()}/"
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url) as gw:
        edge = ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", down, "--upstream", gw.base,
                            "--gateway-url", down, "--gateway-url", gw.base, "--root", str(gw.root),
                            "--workers", "1", "--connect-timeout", "2")
        with edge:
            r = install("pip", edge.url, tmp_path / "target", "app")
            assert r.returncode == 0, r.stdout + r.stderr
        assert _metric(gw.base, "tufproxy_gateway_published_projects_total") == 3
    assert {p.name for p in (tmp_path / "target").iterdir()} >= {"app", "lib", "base"}
