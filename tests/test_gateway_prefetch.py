"""Dependency prefetch and the adaptive batch window at the gateway (issue 33).

Real gateway processes over a local index whose wheels carry real
Requires-Dist: a miss publishes the project at once and its dependencies
behind it, within the depth and count bounds, through the same policy as a
request; a hostile index cannot make it fetch without bound.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.poll import wait_for
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
        # Depth 2 below pf-a: pf-c's own dependencies are not read, pf-d never asked of the index.
        assert "pf-d" not in _pages_asked(test_index) and not _published(gw, "pf-d")
        assert not any(p.endswith("pf_c-1.0-py3-none-any.whl.metadata") for p in test_index.requests)
        # The .metadata the prefetch read is what the client asks next: served from those bytes (checked against
        # the pin), not fetched from the index a second time.
        name = "pf_a-1.0-py3-none-any.whl.metadata"
        wanted = test_index.file(name.removesuffix(".metadata"))
        with urllib.request.urlopen(f"{gw.base}packages/pf-a/{name}", timeout=10) as r:
            served = r.read()
        assert wanted.core is not None and served == wanted.core
        assert len([p for p in test_index.requests if p.endswith(name)]) == 1
        assert metric(gw.base, 'tufproxy_gateway_files_total{outcome="read-ahead"}') == 1


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


@pytest.mark.slow
def test_a_lone_miss_is_signed_without_waiting_for_the_window(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, "--batch-window", "20", "--prefetch-depth", "0") as gw:
        started = time.monotonic()
        assert gw.publish("pf-d")[0] == 200
        assert time.monotonic() - started < 10  # the window (20 s) is for pages still being fetched, not lone misses


def test_read_ahead_holds_at_most_its_bound_oldest_dropped_first() -> None:
    from proxy.gateway.files import ReadAhead

    held = ReadAhead(limit=10)
    held.offer("a", b"1234")
    held.offer("b", b"5678")
    held.offer("c", b"90ab")  # 12 bytes: "a" goes
    held.offer("huge", b"x" * 11)  # over the bound alone: not held
    assert held.take("a") is None and held.take("huge") is None
    assert held.take("b") == b"5678" and held.take("b") is None
    assert held.take("c") == b"90ab"
