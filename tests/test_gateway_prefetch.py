"""Dependency prefetch and the adaptive batch window at the gateway (issue 33).

Real gateway processes over a local index whose wheels carry real
Requires-Dist: a miss publishes the project at once and its dependencies
behind it, within the depth and count bounds, through the same policy as a
request; a hostile index cannot make it fetch without bound.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.gateway.prefetch import requirements
from proxy.protocol.layout import core_metadata_target
from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init, metric
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex

# a -> b -> c -> d, and a -> e[extra] on a marker that is false here: prefetch reads names broadly.
CHAIN = (("a", ["b>=1"]), ("b", ["c"]), ("c", ["d"]), ("d", []), ("e", []))


@pytest.fixture
def test_index(tmp_path: Path) -> Iterator[TestIndex]:
    index = TestIndex(separate_files_host=True)
    dists = tmp_path / "dists"
    for name, requires in CHAIN:
        extra = ['e[fast] ; python_version < "3"'] if name == "a" else []
        index.add(build_wheel(dists, f"pf-{name}", "1.0", requires=[f"pf-{r}" for r in requires] + [
            f"pf-{x}" for x in extra]))
    index.add(build_wheel(dists, "pf-denied-user", "1.0", requires=["pf-forbidden", "pf-b"]))
    index.add(build_wheel(dists, "pf-forbidden", "1.0"))
    with index:
        yield index


def _gateway(tmp_path: Path, index: TestIndex, *args: str) -> GatewayProcess:
    gateway_init(tmp_path / "gw")
    return GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--files-origin", index.files_url, *args)


def _published(gw: GatewayProcess, project: str) -> bool:
    """Whether the gateway's root page lists ``project`` (asking for the project's page would publish it)."""
    return project in gw.listed()


def _pages_asked(index: TestIndex) -> set[str]:
    return {p.split("/")[-2] for p in index.requests if p.startswith("/simple/")}


@pytest.mark.slow
def test_a_miss_publishes_its_dependency_closure_to_the_depth_bound(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, "--prefetch-depth", "2") as gw:
        assert gw.publish("pf-a")[0] == 200
        wait_for(lambda: all(_published(gw, p) for p in ("pf-b", "pf-c", "pf-e")), "the prefetched pages", timeout=30)
        wait_for(lambda: metric(gw.base, 'tufproxy_gateway_prefetches_total{outcome="published"}') >= 3, "count", timeout=10)
        # Depth 2 below pf-a: pf-c's own dependencies are not followed, pf-d never asked of the index.
        assert "pf-d" not in _pages_asked(test_index) and not _published(gw, "pf-d")
        # The .metadata the prefetch read is what the client asks next: served from those bytes (checked against
        # the pin), not fetched from the index a second time.
        name = "pf_a-1.0-py3-none-any.whl.metadata"
        wanted = test_index.file(name.removesuffix(".metadata"))
        with urllib.request.urlopen(f"{gw.base}packages/pf-a/{name}", timeout=10) as r:
            served = r.read()
        assert wanted.core is not None and served == wanted.core
        assert len([p for p in test_index.requests if p.endswith(name)]) == 1
        assert metric(gw.base, 'tufproxy_gateway_files_total{outcome="read-ahead"}') == 1
        # The last level's .metadata is read too (its dependencies are not followed): the client asks for it next.
        leaf = "pf_c-1.0-py3-none-any.whl.metadata"
        with urllib.request.urlopen(f"{gw.base}packages/pf-c/{leaf}", timeout=10) as r:
            assert r.read() == test_index.file(leaf.removesuffix(".metadata")).core
        assert len([p for p in test_index.requests if p.endswith(leaf)]) == 1
        assert metric(gw.base, 'tufproxy_gateway_files_total{outcome="read-ahead"}') == 2
        # Answered from memory, kept on disk behind the answer: the gateway restarted serves it from there.
        wait_for((tmp_path / "gw" / "public" / core_metadata_target("pf-a", name.removesuffix(".metadata"))).exists,
                 "the read-ahead .metadata kept")
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url) as gw:
        with urllib.request.urlopen(f"{gw.base}packages/pf-a/{name}", timeout=10) as r:
            assert r.read() == wanted.core
    assert len([p for p in test_index.requests if p.endswith(name)]) == 1


@pytest.mark.slow
def test_a_metadata_request_fetches_its_file_ahead_once(tmp_path: Path, test_index: TestIndex) -> None:
    """A resolver asks for a file's .metadata, then for the file: the gateway starts the file when asked for the
    first, so the download finds it kept or under way, one index round trip sooner; never twice."""
    name = "pf_d-1.0-py3-none-any.whl"
    with _gateway(tmp_path, test_index, "--prefetch-depth", "0") as gw:
        assert gw.publish("pf-d")[0] == 200
        assert not any(p.endswith(name) for p in test_index.requests)
        for _ in range(2):
            with urllib.request.urlopen(f"{gw.base}packages/pf-d/{name}.metadata", timeout=10) as r:
                assert r.read() == test_index.file(name).core
        wait_for(lambda: metric(gw.base, 'tufproxy_gateway_files_total{outcome="ok"}') == 2, "the file kept ahead")
        assert metric(gw.base, "tufproxy_gateway_files_read_ahead_total") == 1
        with urllib.request.urlopen(f"{gw.base}packages/pf-d/{name}", timeout=10) as r:
            assert r.read() == test_index.file(name).data
        assert len([p for p in test_index.requests if p.endswith(name)]) == 1


@pytest.mark.slow
def test_a_gateway_with_read_ahead_0_fetches_a_file_only_when_asked(tmp_path: Path, test_index: TestIndex) -> None:
    name = "pf_d-1.0-py3-none-any.whl"
    with _gateway(tmp_path, test_index, "--prefetch-depth", "0", "--read-ahead", "0") as gw:
        assert gw.publish("pf-d")[0] == 200
        with urllib.request.urlopen(f"{gw.base}packages/pf-d/{name}.metadata", timeout=10) as r:
            assert r.read() == test_index.file(name).core
        with urllib.request.urlopen(f"{gw.base}packages/pf-d/{name}", timeout=10) as r:
            assert r.read() == test_index.file(name).data
        assert metric(gw.base, "tufproxy_gateway_files_read_ahead_total") == 0
        assert len([p for p in test_index.requests if p.endswith(name)]) == 1


@pytest.mark.slow
def test_off_means_off(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, "--prefetch-depth", "0") as gw:
        assert gw.publish("pf-a")[0] == 200
        assert gw.publish("pf-d")[0] == 200  # a later miss: the first one's prefetch would have run by now
        assert _pages_asked(test_index) == {"pf-a", "pf-d"} and not _published(gw, "pf-b")
        assert not [p for p in test_index.requests if p.endswith(".metadata")]


@pytest.mark.slow
def test_a_prefetch_publishes_nothing_a_request_could_not(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, "--deny-project", "pf-forbidden") as gw:
        assert gw.publish("pf-denied-user")[0] == 200
        wait_for(lambda: _published(gw, "pf-b"), "the allowed dependency", timeout=30)
        wait_for(lambda: metric(gw.base, 'tufproxy_gateway_prefetches_total{outcome="refused"}') >= 1, "refusal", timeout=10)
        assert not _published(gw, "pf-forbidden") and "pf-forbidden" not in _pages_asked(test_index)
        assert any(r.get("reason") == "deny-project" for r in gw.audit())


@pytest.mark.slow
def test_a_prefetch_of_a_cooled_down_release_makes_nothing_of_it_installable(tmp_path: Path) -> None:
    """pf-old needs pf-fresh, whose only release is a day old under a 30-day cooldown: the prefetch goes
    through the policy as a request would, so no signed page lists that file, and its metadata (whose
    dependencies would be prefetched next) is never read from the index."""
    fresh = datetime.now(UTC) - timedelta(days=1)
    with TestIndex(separate_files_host=True) as index:
        index.add(build_wheel(tmp_path / "dists", "pf-old", "1.0", requires=["pf-fresh"]))
        index.add(build_wheel(tmp_path / "dists", "pf-fresh", "1.0", requires=["pf-further"]),
                  upload_time=fresh.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        index.add(build_wheel(tmp_path / "dists", "pf-further", "1.0"))
        with _gateway(tmp_path, index, "--min-release-age", "30d", "--prefetch-depth", "2") as gw:
            assert gw.publish("pf-old")[0] == 200
            wait_for(lambda: "pf-fresh" in _pages_asked(index), "the prefetch of pf-fresh's page", timeout=30)
            wait_for(lambda: metric(gw.base, "tufproxy_gateway_prefetches_total") >= 1, "its outcome", timeout=30)
            req = urllib.request.Request(f"{gw.base}simple/pf-fresh/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert json.loads(r.read())["files"] == []  # listed by its index, offered by nobody yet
        assert not any(p.endswith("pf_fresh-1.0-py3-none-any.whl.metadata") for p in index.requests)
        assert "pf-further" not in _pages_asked(index)


@pytest.mark.slow
def test_a_hostile_index_naming_10000_dependencies_costs_at_most_the_budget(tmp_path: Path) -> None:
    with TestIndex(separate_files_host=True) as index:
        names = [f"pf-junk-{i}" for i in range(10_000)]
        index.add(build_wheel(tmp_path / "dists", "pf-hostile", "1.0", requires=names))
        for name in names[:50]:  # some exist, so each costs a real publish
            index.add(build_wheel(tmp_path / "dists", name, "1.0", requires=names[:100]))
        with _gateway(tmp_path, index, "--prefetch-max", "5", "--prefetch-depth", "3") as gw:
            assert gw.publish("pf-hostile")[0] == 200
            wait_for(lambda: len(_pages_asked(index)) >= 6, "the prefetches", timeout=30)
            settled = metric(gw.base, "tufproxy_gateway_prefetches_total")
            assert gw.publish("pf-junk-49")[0] == 200  # a later request's own budget: 5 more at most
            wait_for(lambda: len(_pages_asked(index)) >= 7, "the second miss", timeout=30)
        # The first miss asked its 5, the second miss its own page and at most 5 more.
        assert len(_pages_asked(index)) <= 1 + 5 + 1 + 5, sorted(_pages_asked(index))
        assert settled <= 5
        # One .metadata read per page published (the last level's read ahead, not followed), none beyond.
        assert len([p for p in index.requests if p.endswith(".metadata")]) <= 1 + 5 + 1 + 5


@pytest.mark.slow
def test_a_lone_miss_is_signed_without_waiting_for_the_window(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, "--batch-window", "20", "--prefetch-depth", "0") as gw:
        started = time.monotonic()
        assert gw.publish("pf-d")[0] == 200
        assert time.monotonic() - started < 10  # the window (20 s) is for pages still being fetched, not lone misses


def test_requirements_follow_extras_as_asked_and_markers_broadly() -> None:
    metadata = b"""Metadata-Version: 2.1
Name: top
Requires-Dist: plain>=1
Requires-Dist: windows-only; sys_platform == "win32"
Requires-Dist: socks-lib; extra == "socks"
Requires-Dist: dev-tool[Fast_Mode]; python_version < "3.9" and extra == 'dev'
Requires-Dist: reversed; "Test" == extra
Requires-Dist: backport; python_version < "3.11" or extra == "test"
Requires-Dist: py2-only; python_version < "3" and extra == "dev"
Requires-Dist: plain[more]
Requires-Dist: not a requirement!

"""
    everything = requirements(metadata, 100)
    assert list(everything) == ["plain", "windows-only", "socks-lib", "dev-tool", "reversed", "backport", "py2-only"]
    assert everything["plain"] == {"more"} and everything["dev-tool"] == {"fast-mode"}
    # No extra asked: only what applies without one, on some platform and Python ("or" read as "or").
    assert list(requirements(metadata, 100, frozenset())) == ["plain", "windows-only", "backport"]
    # A marker no supported Python satisfies brings nothing in, whatever the extras.
    assert list(requirements(metadata, 100, frozenset({"dev", "test"}))) == [
        "plain", "windows-only", "dev-tool", "reversed", "backport"]
    assert list(requirements(metadata, 2)) == ["plain", "windows-only"]


@pytest.mark.slow
def test_below_the_requested_project_only_the_extras_asked_for_are_followed(tmp_path: Path) -> None:
    """A client may want any extra of the project it asked for; a dependency's extras count only as the
    requirement that led to it names them (pf-lib[speed] brings pf-fast, never pf-lib's docs tools)."""
    with TestIndex(separate_files_host=True) as index:
        dists = tmp_path / "dists"
        index.add(build_wheel(dists, "pf-top", "1.0", requires=["pf-cli ; extra == 'cli'", "pf-lib[speed]"]))
        index.add(build_wheel(dists, "pf-lib", "1.0", requires=[
            "pf-fast ; extra == 'speed'", "pf-docs ; extra == 'docs'", "pf-core"]))
        for name in ("pf-cli", "pf-fast", "pf-docs", "pf-core"):
            index.add(build_wheel(dists, name, "1.0"))
        with _gateway(tmp_path, index, "--prefetch-depth", "2") as gw:
            assert gw.publish("pf-top")[0] == 200
            wait_for(lambda: all(_published(gw, p) for p in ("pf-cli", "pf-lib", "pf-fast", "pf-core")),
                     "the prefetched pages", timeout=30)
        # pf-docs was pf-fast's and pf-core's sibling in one wave: had it been wanted, it would have been asked.
        assert "pf-docs" not in _pages_asked(index)


@pytest.mark.slow
def test_an_edge_fetches_a_file_ahead_when_its_metadata_is_asked(tmp_path: Path, test_index: TestIndex) -> None:
    """uv and pip ask for a version's .metadata while resolving and for its file only at the end: the edge
    starts the file at the first, verified and stored as a request's, so the download is a cache hit."""
    name = "pf_d-1.0-py3-none-any.whl"
    wanted = test_index.file(name)
    sha = _sha256(wanted.data)
    blob = tmp_path / "edge" / "blobs" / sha[:2] / sha
    with _gateway(tmp_path, test_index, "--prefetch-depth", "0") as gw, edge_for(tmp_path, gw) as edge:
        assert _get(f"{edge.url}pf-d/")[0] == 200
        assert _get(f"{edge.base}packages/pf-d/{name}.metadata") == (200, wanted.core)
        wait_for(blob.exists, "the file read ahead into the edge's store")
        assert metric(edge.base, "tufproxy_files_read_ahead_total") == 1
        assert _get(f"{edge.base}packages/pf-d/{name}") == (200, wanted.data)
        assert metric(edge.base, 'tufproxy_cache_hits_total{kind="file"}') == 1
        assert metric(edge.base, 'tufproxy_cache_misses_total{kind="file"}') == 0


@pytest.mark.slow
def test_read_ahead_0_fetches_no_file_before_it_is_asked(tmp_path: Path, test_index: TestIndex) -> None:
    name = "pf_d-1.0-py3-none-any.whl"
    wanted = test_index.file(name)
    with _gateway(tmp_path, test_index, "--prefetch-depth", "0") as gw, \
            ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                         "--workers", "1", "--read-ahead", "0") as edge:
        assert _get(f"{edge.base}packages/pf-d/{name}.metadata") == (200, wanted.core)
        assert _get(f"{edge.base}packages/pf-d/{name}") == (200, wanted.data)
        assert metric(edge.base, "tufproxy_files_read_ahead_total") == 0
        assert metric(edge.base, 'tufproxy_cache_misses_total{kind="file"}') == 1


@pytest.mark.slow
def test_a_file_read_ahead_that_lies_is_neither_kept_nor_served(tmp_path: Path, test_index: TestIndex) -> None:
    """The index swaps the file after its page was signed: the read-ahead is refused like a request's
    fetch (nothing kept at the edge), and the client's own request is a 502, never the swapped bytes."""
    name = "pf_d-1.0-py3-none-any.whl"
    wanted = test_index.file(name)
    signed = wanted.data
    with _gateway(tmp_path, test_index, "--prefetch-depth", "0") as gw, edge_for(tmp_path, gw) as edge:
        assert _get(f"{edge.url}pf-d/")[0] == 200
        wanted.data = signed[:-1] + bytes([signed[-1] ^ 1])
        assert _get(f"{edge.base}packages/pf-d/{name}.metadata")[0] == 200
        wait_for(lambda: any(r.get("reason") == "hash-mismatch" for r in gw.audit()), "the gateway's refusal")
        # The edge's read-ahead itself failed (the gateway answers the lie with a 502): nothing to keep.
        wait_for(lambda: metric(edge.base, 'tufproxy_upstream_fetches_total{mirror="0",outcome="error"}') >= 1,
                 "the edge's read-ahead to fail")
        assert metric(edge.base, "tufproxy_files_read_ahead_total") == 1
        assert _get(f"{edge.base}packages/pf-d/{name}")[0] == 502
        kept = {p.name for p in (tmp_path / "edge" / "blobs").rglob("*") if p.is_file()}
        assert kept == {_sha256(wanted.core or b"")}  # the .metadata, verified; neither the file nor its swap


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _get(url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


async def test_read_ahead_holds_reads_under_way_and_at_most_its_bounds_oldest_dropped_first() -> None:
    from proxy.gateway.files import ReadAhead

    loop = asyncio.get_running_loop()

    def read(data: bytes | None = None) -> asyncio.Future[bytes]:
        future: asyncio.Future[bytes] = loop.create_future()
        if data is not None:
            future.set_result(data)
        return future

    held = ReadAhead(limit=10, entries=5)
    under_way, failing = read(), read()
    for target, future in (("a", read(b"1234")), ("b", read(b"5678")), ("under-way", under_way), ("failing", failing)):
        held.offer(target, future)
    failing.set_exception(ConnectionResetError("index went away"))
    held.offer("c", read(b"90ab"))  # 12 bytes read: "a" goes
    held.offer("huge", read(b"x" * 11))  # over the bound alone: not held
    await asyncio.sleep(0)  # one turn of the loop: the reads' done-callbacks run
    assert held.take("a") is None and held.take("huge") is None and held.take("failing") is None
    b = held.take("b")
    assert b is not None and await b == b"5678" and held.take("b") is None
    assert held.take("under-way") is under_way  # a read under way is held whatever the bytes
    for i in range(6):
        held.offer(f"more-{i}", read())
    assert held.take("c") is None and held.take("more-0") is None and held.take("more-5") is not None

    # Reads that end in the same turn, one counted before the other's callback ran: the bound still holds.
    held = ReadAhead(limit=10)
    first, second, third = read(), read(), read()
    for target, future in (("first", first), ("second", second), ("third", third)):
        held.offer(target, future)
    second.set_result(b"x" * 5)
    await asyncio.sleep(0)
    third.set_result(b"y" * 6)
    first.set_result(b"z" * 4)
    await asyncio.sleep(0)
    kept = [held.take(t) for t in ("first", "second", "third")]
    assert sum(len(k.result()) for k in kept if k is not None) <= 10
    held.offer("after", read(b"w" * 10))
    await asyncio.sleep(0)
    after = held.take("after")
    assert after is not None and after.result() == b"w" * 10  # nothing left counted that is not held


@pytest.mark.slow
def test_a_metadata_asked_while_the_prefetch_reads_it_waits_for_that_read(tmp_path: Path, test_index: TestIndex) -> None:
    """uv asks for a project's .metadata as soon as its page is signed, while the prefetch (reading the same file
    for the project's dependencies) is still at it: the request waits for that read, no second trip to the index."""
    name = "pf_a-1.0-py3-none-any.whl.metadata"
    test_index.hold[name] = gate = threading.Event()
    with _gateway(tmp_path, test_index, "--prefetch-depth", "1", "--read-ahead", "0") as gw:
        try:
            assert gw.publish("pf-a")[0] == 200
            wait_for(lambda: name in {p.rsplit("/", 1)[-1] for p in test_index.requests}, "the prefetch reading it")
            answer: dict[str, bytes] = {}

            def ask() -> None:
                with urllib.request.urlopen(f"{gw.base}packages/pf-a/{name}", timeout=30) as r:
                    answer["body"] = r.read()

            client = threading.Thread(target=ask)
            client.start()
            wait_for(lambda: metric(gw.base, "tufproxy_gateway_read_ahead_waits_total") == 1, "the request waiting")
        finally:
            gate.set()
        client.join(30)
        assert answer["body"] == test_index.file(name.removesuffix(".metadata")).core
        assert len([p for p in test_index.requests if p.endswith(name)]) == 1
        assert metric(gw.base, 'tufproxy_gateway_files_total{outcome="read-ahead"}') == 1
