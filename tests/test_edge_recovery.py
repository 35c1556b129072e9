"""An edge behind a path that lies about ``timestamp.json`` (issue 27, items 6 and 7).

A relay between the edge and its gateway plays a stale CDN or mirror copy:
it answers ``timestamp.json`` with an older signed one, with bytes whose
signature does not verify, or with garbage.

* Item 6: a rejected update is aborted, as the TUF client workflow says;
  the edge keeps serving what it verified before (still valid), and the
  refusal is audited and counted.
* Item 7: an edge with nothing verified yet fails closed, but the first
  request after the path turns honest starts a re-check itself and is
  served (at most one cycle a second, so within about a second).

Everything is real: the index, the gateway and the edge are processes or
servers on 127.0.0.1; the relay forwards every other request unchanged.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.relay import Relay
from tests.support.testindex import TestIndex

TIMESTAMP = r"/metadata/timestamp\.json$"


def get(url: str, timeout: float = 20) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def metric_sum(base: str, name: str, label: str) -> float:
    text = get(f"{base}metrics")[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[GatewayProcess, Relay]]:
    index = TestIndex()
    for name in ("app", "lib", "extra"):
        index.add(build_wheel(tmp_path / "dists", name, "1.0"))
    gateway_init(tmp_path / "gw")
    with index, GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--batch-window", "0.05") as gw, \
            Relay(gw.base) as relay:
        yield gw, relay


def bad_signature(timestamp: bytes) -> bytes:
    doc = json.loads(timestamp)
    sig = doc["signatures"][0]["sig"]
    doc["signatures"][0]["sig"] = ("0" if sig[0] != "0" else "1") + sig[1:]
    return json.dumps(doc).encode()


@pytest.mark.slow
@pytest.mark.parametrize("lie", ["rollback", "bad-signature", "garbage"])
def test_a_rejected_timestamp_aborts_the_update_and_the_edge_keeps_serving(
        tmp_path: Path, world: tuple[GatewayProcess, Relay], lie: str) -> None:
    gw, relay = world
    audit = tmp_path / "edge-audit.log"
    edge = ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", relay.base, "--root", str(gw.root),
                        "--workers", "1", "--refresh-interval", "0.5", "--audit-log", str(audit))
    timestamp = gw.directory / "public" / "metadata" / "timestamp.json"
    with edge:
        assert get(f"{edge.url}app/")[0] == 200  # published through the relay (the miss protocol)
        older = timestamp.read_bytes()
        assert gw.publish("lib")[0] == 200  # a newer timestamp, which the edge picks up
        wait_for(lambda: get(f"{edge.url}lib/")[0] == 200, "the edge serving lib", timeout=15)
        newest = timestamp.read_bytes()
        relay.serve(TIMESTAMP, {"rollback": older, "bad-signature": bad_signature(newest),
                                "garbage": b'{"signed": 7'}[lie])
        served_before = relay.served.get(TIMESTAMP, 0)
        wait_for(lambda: relay.served.get(TIMESTAMP, 0) >= served_before + 2, "two refreshes meeting the lie", timeout=15)
        answers = [get(f"{edge.url}{p}/")[0] for p in ("app", "lib") for _ in range(5)]
        wheel = get(f"{edge.url}lib/")[1].decode()
        assert answers == [200] * 10, answers
        assert "lib-1.0-py3-none-any.whl" in wheel
        refused = metric_sum(edge.base, "tufproxy_verification_failures_total", "")
        assert refused >= 2, refused
        records = [json.loads(line) for line in audit.read_text().splitlines() if line.startswith("{")]
        assert [r for r in records if r.get("event") == "refused" and r.get("role") == "timestamp"
                and r.get("request_path") == "(metadata refresh)"], records[-3:]
        relay.clear()
        # Honest again: the next release reaches the edge.
        assert gw.publish("extra")[0] == 200
        wait_for(lambda: get(f"{edge.url}extra/")[0] == 200, "the edge serving extra", timeout=15)
    assert "Traceback" not in edge.log()


@pytest.mark.slow
@pytest.mark.parametrize("lie", ["bad-signature", "garbage"])
def test_the_first_request_after_the_path_turns_honest_is_served(
        tmp_path: Path, world: tuple[GatewayProcess, Relay], lie: str) -> None:
    gw, relay = world
    assert gw.publish("app")[0] == 200
    current = (gw.directory / "public" / "metadata" / "timestamp.json").read_bytes()
    relay.serve(TIMESTAMP, bad_signature(current) if lie == "bad-signature" else b"\x00garbage")
    # The default --refresh-interval (60 s): recovery must not wait for the background refresher.
    edge = ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", relay.base, "--root", str(gw.root),
                        "--workers", "1")
    with edge:
        for _ in range(3):
            status, _, headers = get(f"{edge.url}app/")
            assert status == 502, status  # fails closed: nothing verified yet
        assert headers.get("X-Tufproxy-Reason") in ("bad-signature", "bad-metadata", "unsigned"), headers
        relay.clear()
        honest = time.monotonic()
        status, body, _ = get(f"{edge.url}app/")
        took = time.monotonic() - honest
        print(f"first request after the path turned honest: {status} in {took:.2f}s")
        assert status == 200, body[:300]
        # One new cycle a second at most, then the cycle itself: well under pip's retry budget.
        assert took < 3.0, took
