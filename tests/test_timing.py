"""Server-Timing of miss answers (issue 33): where one cold page's wait went, phase by phase.

The header's reader and writer with plain strings; then a real gateway and
edge over a local index that holds a page back: the edge's answer names
each phase of the miss, the gateway's relayed under ``gw-``, and the held
page is in the gateway's ``index`` phase.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from proxy.util import timing
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

MISS = ["lookup", "publish", "gw-index", "gw-accept", "gw-batch-wait", "gw-sign", "gw-write", "refresh", "relookup",
        "page"]


def test_phases_are_written_in_milliseconds_and_read_back() -> None:
    value = timing.header([("index", 0.0412), ("sign", 0.0098)])
    assert value == "index;dur=41.2, sign;dur=9.8"
    assert timing.parse(value) == [("index", pytest.approx(0.0412)), ("sign", pytest.approx(0.0098))]
    assert timing.header([]) is None


@pytest.mark.parametrize("value", [
    "index;dur=-1", "index;dur=1e999", "index;dur=nan", "Index;dur=1", "in dex;dur=1", "index;desc=x;dur=1",
    "index", "index;dur=", "a" * 40 + ";dur=1", "index;dur=1" + ", x;dur=1" * 200,
])
def test_a_relayed_header_is_read_with_bounds(value: str) -> None:
    """A gateway's header reaches the edge's answer: only plain names with finite durations, a bounded number."""
    assert timing.parse(value) == []


def test_at_most_max_phases_are_read_or_kept_and_a_relayed_header_leaves_room_for_our_own() -> None:
    many = ", ".join(f"p{i};dur=1" for i in range(timing.MAX_PHASES + 5))
    assert len(timing.parse(many)) == timing.MAX_PHASES

    async def request() -> timing.Phases:
        phases = timing.collect()
        timing.relay(timing.parse(many), "gw-")
        for i in range(timing.MAX_PHASES + 5):
            timing.record(f"p{i}", 0.001)
        return phases

    kept = [name for name, _ in asyncio.run(request())]
    assert len(kept) == timing.MAX_PHASES
    assert kept[:timing.MAX_RELAYED] == [f"gw-p{i}" for i in range(timing.MAX_RELAYED)]
    assert kept[timing.MAX_RELAYED:] == [f"p{i}" for i in range(timing.MAX_PHASES - timing.MAX_RELAYED)]

    async def longest() -> timing.Phases:
        phases = timing.collect()
        timing.relay([("a" * 32, 0.001)], "gw-")  # the longest name a header may carry, under its prefix
        return phases

    assert asyncio.run(longest()) == [("gw-" + "a" * 32, 0.001)]


def test_only_a_request_that_collects_keeps_phases_and_background_work_can_detach() -> None:
    timing.record("outside", 1.0)  # no request: nothing to keep it in, nothing raised

    async def request() -> timing.Phases:
        phases = timing.collect()
        with timing.phase("mine"):
            pass

        async def background() -> None:
            timing.detach()
            timing.record("not-mine", 1.0)

        await asyncio.create_task(background())  # a task copies the request's context: detach leaves it
        timing.relay([("sign", 0.5)], "gw-")
        return phases

    assert [name for name, _ in asyncio.run(request())] == ["mine", "gw-sign"]


@pytest.mark.slow
def test_a_page_miss_says_where_its_wait_went(tmp_path: Path) -> None:
    with TestIndex(separate_files_host=True) as index:
        index.add(build_wheel(tmp_path / "dists", "st-a", "1.0"))
        index.add(build_wheel(tmp_path / "dists", "st-b", "1.0"))
        gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--files-origin", index.files_url,
                            "--prefetch-depth", "0") as gw, edge_for(tmp_path, gw) as edge:
            index.stall["st-a"] = gate = threading.Event()
            answer: dict[str, str | None] = {}

            def ask() -> None:
                with urllib.request.urlopen(f"{edge.url}st-a/", timeout=30) as r:
                    answer["first"] = r.headers.get("Server-Timing")

            client = threading.Thread(target=ask)
            client.start()
            wait_for(lambda: "/simple/st-a/" in index.requests, "the gateway fetching the page")
            seen = time.monotonic()
            time.sleep(0.2)  # not a synchronisation: the length of the hold the gateway's index phase must contain
            held = time.monotonic() - seen
            gate.set()
            client.join(30)
            assert "first" in answer, "the client's request failed"
            phases = timing.parse(answer["first"])
            assert [name for name, _ in phases] == MISS, answer["first"]
            took = dict(phases)
            assert took["gw-index"] >= held
            # The gateway's phases all happen inside the edge's exchange with it (0.1 ms rounding each), which
            # began while its lookup read the bin-n (asked ahead) and ended in its publish phase.
            assert took["lookup"] + took["publish"] + 0.001 >= sum(s for name, s in phases if name.startswith("gw-"))
            # The same page again: trusted already and kept rendered, nothing waited for, nothing said (so the
            # answer is the same whether the hot path or aiohttp sends it).
            with urllib.request.urlopen(f"{edge.url}st-a/", timeout=30) as r:
                assert r.headers.get("Server-Timing") is None
            # A refusal says nothing (what a 404 waited for would tell a private project from an absent one).
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{edge.url}st-nothere/", timeout=30)
            assert refused.value.code == 404 and refused.value.headers.get("Server-Timing") is None
            # Asked of the gateway itself: a publish it made names its phases; one it had made, none.
            request = urllib.request.Request(f"{gw.base}_tufproxy/publish/st-b", method="POST", data=b"")
            with urllib.request.urlopen(request, timeout=30) as r:
                assert [n for n, _ in timing.parse(r.headers.get("Server-Timing"))] == [n[3:] for n in MISS[2:7]]
            with urllib.request.urlopen(request, timeout=30) as r:
                assert r.headers.get("Server-Timing") is None
