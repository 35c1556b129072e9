"""One failover loop, one reading of a mirror's answer (proxy.transport.failover), proved against every caller.

The same faults, served by real HTTP mirrors on 127.0.0.1, are put to each
caller that asks several mirrors for one thing: a signed target (the one
fetch-and-verify), a metadata role the snapshot lists, the next root (a
probe: whether it exists is the question) and the gateway's project page.
Each must reach the verdict the table gives for its question; where a
caller's consequence of a verdict is its own (a role the repository must
serve, missing everywhere, is the upstream broken), the caller says so in
``CONSEQUENCE``, once.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.gateway.listing import IndexClient, IndexUnreachable, Listing, PageRefused
from proxy.gateway.policy import Policy, Refusal
from proxy.protocol import errors
from proxy.protocol.errors import BadMetadata, RepositoryError, UpstreamUnreachable
from proxy.protocol.model import Mirror
from proxy.repository import Repository
from proxy.transport.failover import Outcome, Tried, classify, failover, in_order
from proxy.transport.indexhttp import IndexHTTP, RedirectRefused
from proxy.transport.upstream import AiohttpFetcher, DownloadError, DownloadHTTPError, DownloadLengthError, DownloadTimeout
from proxy.trust import TrustedClient
from proxy.trust.fetch import MissingUpstream, Want, fetch_bytes
from tests.support.faults import Fault, FaultyUpstream

SERVED, MISSING, DENIED, UNREACHABLE, LIE = (Outcome.SERVED, Outcome.MISSING, Outcome.DENIED, Outcome.UNREACHABLE,
                                             Outcome.LIE)
WHEEL = "p-1.0-py3-none-any.whl"
WHEEL_BYTES = b"a wheel's bytes " * 1000
BLOB = b'{"signed": "a role", "version": 1}'
PAGE = (f'<html><body><a href="/packages/p/{WHEEL}#sha256={hashlib.sha256(WHEEL_BYTES).hexdigest()}">'
        f"{WHEEL}</a></body></html>").encode()

# (name, fault, status): what one mirror does with every request of the test.
FAULTS = {
    "200": (None, 0),
    "404": (Fault.STATUS, 404),
    "410": (Fault.STATUS, 410),
    "403": (Fault.STATUS, 403),
    "500": (Fault.STATUS, 500),
    "503": (Fault.STATUS, 503),
    "truncated": (Fault.TRUNCATE, 0),
    "oversized": (Fault.OVERSIZED, 0),
    "garbage": (Fault.GARBAGE, 0),
}

# One mirror: the verdict of a fetch (the file is signed to exist) and of a probe.
ONE = {
    "200": (SERVED, SERVED),
    "404": (MISSING, MISSING),
    "410": (MISSING, MISSING),
    "403": (UNREACHABLE, MISSING),
    "500": (UNREACHABLE, UNREACHABLE),
    "503": (UNREACHABLE, UNREACHABLE),
    "truncated": (UNREACHABLE, UNREACHABLE),
    "oversized": (LIE, LIE),
    "garbage": (LIE, LIE),
}

# Two mirrors, asked in order: a fetch, a probe, and the gateway's first-index policy
# (a later index never answers for one that did not answer cleanly).
TWO = {
    ("503", "200"): (SERVED, SERVED, UNREACHABLE),
    ("404", "200"): (SERVED, SERVED, SERVED),
    ("403", "200"): (SERVED, SERVED, UNREACHABLE),
    ("garbage", "200"): (SERVED, SERVED, LIE),
    ("404", "404"): (MISSING, MISSING, MISSING),
    ("404", "410"): (MISSING, MISSING, MISSING),
    ("404", "503"): (UNREACHABLE, MISSING, UNREACHABLE),
    ("503", "404"): (UNREACHABLE, MISSING, UNREACHABLE),
    ("403", "404"): (UNREACHABLE, MISSING, UNREACHABLE),
    ("garbage", "404"): (LIE, LIE, LIE),
    ("404", "oversized"): (LIE, LIE, LIE),
}


@dataclass
class World:
    mirrors: list[FaultyUpstream]
    metadata_dir: Path
    fetcher: AiohttpFetcher

    def set(self, *names: str) -> None:
        for mirror, name in zip(self.mirrors, names, strict=False):
            mirror.clear()
            fault, status = FAULTS[name]
            if fault is not None:
                mirror.inject(r"/.*", fault, status=status or 503)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[FaultyUpstream], Path]]:
    root = tmp_path_factory.mktemp("mirror")
    for rel, data in ((f"packages/p/{WHEEL}", WHEEL_BYTES), ("metadata/blob.json", BLOB), ("simple/p/index.html", PAGE)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    repo = Repository.init(tmp_path_factory.mktemp("repo"), bins=4)
    metadata_dir = tmp_path_factory.mktemp("client")
    TrustedClient.initialize(metadata_dir, (repo.metadata_dir / "1.root.json").read_bytes())
    mirrors = [FaultyUpstream(root).start(), FaultyUpstream(root).start()]
    yield mirrors, metadata_dir
    for m in mirrors:
        m.stop()


@pytest.fixture
async def world(tree: tuple[list[FaultyUpstream], Path]) -> AsyncIterator[World]:
    fetcher = AiohttpFetcher(connect_timeout=2, read_timeout=2, total_timeout=10)
    yield World(tree[0], tree[1], fetcher)
    await fetcher.close()
    for m in tree[0]:
        m.clear()


def _verify(data: bytes) -> bytes:
    if data != BLOB:
        raise BadMetadata("not the role's bytes", role="r")
    return data


async def _metadata(world: World, n: int, *, probe: bool) -> Outcome:
    client = TrustedClient(world.metadata_dir, [Mirror(f"{m.url}metadata/", m.url) for m in world.mirrors[:n]],
                           world.fetcher)
    try:
        role = "root" if probe else "bins-0"
        found = await client._fetch_verified(role, "blob.json", 4096, _verify, missing_ok=probe)
    except RepositoryError:
        return LIE
    except UpstreamUnreachable:
        return UNREACHABLE
    finally:
        client.close()
    return MISSING if found is None else SERVED


async def metadata_role(world: World, n: int) -> Outcome:
    return await _metadata(world, n, probe=False)


async def next_root(world: World, n: int) -> Outcome:
    return await _metadata(world, n, probe=True)


async def target(world: World, n: int) -> Outcome:
    want = Want(f"packages/p/{WHEEL}", {"sha256": hashlib.sha256(WHEEL_BYTES).hexdigest()}, len(WHEEL_BYTES))
    try:
        data = await fetch_bytes(world.fetcher, want, [f"{m.url}packages/p/{WHEEL}" for m in world.mirrors[:n]])
    except MissingUpstream:
        return MISSING
    except RepositoryError:
        return LIE
    except UpstreamUnreachable:
        return UNREACHABLE
    assert data == WHEEL_BYTES
    return SERVED


async def page(world: World, n: int) -> Outcome:
    http = IndexHTTP([f"{m.url}simple/" for m in world.mirrors[:n]], connect_timeout=2, read_timeout=2)
    try:
        found = await IndexClient(http).listing("p", Policy())
    except IndexUnreachable:
        return UNREACHABLE
    except PageRefused:
        return LIE
    finally:
        await http.close()
    if isinstance(found, Refusal):
        assert found.kind is errors.Fault.NOT_FOUND
        return MISSING
    assert isinstance(found, Listing) and [f.filename for f in found.page.files] == [WHEEL]
    return SERVED


Caller = Callable[[World, int], Awaitable[Outcome]]
# Each caller, the question it asks (the column of ONE and TWO), and its own consequence of a verdict.
CALLERS: dict[str, tuple[Caller, int]] = {"target": (target, 0), "metadata-role": (metadata_role, 0),
                                          "next-root": (next_root, 1), "gateway-page": (page, 2)}
CONSEQUENCE = {"metadata-role": {MISSING: UNREACHABLE}}  # a role the snapshot lists must be served


def expected(caller: str, verdict: Outcome) -> Outcome:
    return CONSEQUENCE.get(caller, {}).get(verdict, verdict)


@pytest.mark.parametrize("fault", list(ONE))
@pytest.mark.parametrize("caller", list(CALLERS))
async def test_one_mirror(world: World, caller: str, fault: str) -> None:
    run, column = CALLERS[caller]
    world.set(fault)
    verdict = ONE[fault][1 if column == 1 else 0]  # one index: first-index asks what a fetch asks
    assert await run(world, 1) == expected(caller, verdict)


@pytest.mark.parametrize("faults", list(TWO), ids=["+".join(f) for f in TWO])
@pytest.mark.parametrize("caller", list(CALLERS))
async def test_two_mirrors(world: World, caller: str, faults: tuple[str, str]) -> None:
    run, column = CALLERS[caller]
    world.set(*faults)
    assert await run(world, 2) == expected(caller, TWO[faults][column])


# The classifier itself: every status and error a transport raises, read once.
CLASSIFIED = [
    (DownloadHTTPError("u", 404), False, MISSING),
    (DownloadHTTPError("u", 410), False, MISSING),
    (DownloadHTTPError("u", 403), False, DENIED),
    (DownloadHTTPError("u", 404), True, UNREACHABLE),  # a resumed body: the file exists
    (DownloadHTTPError("u", 403), True, UNREACHABLE),
    (DownloadHTTPError("u", 500), False, UNREACHABLE),
    (DownloadHTTPError("u", 302), False, UNREACHABLE),  # the proxy's fetcher follows no redirect
    (DownloadHTTPError("u", 206), False, UNREACHABLE),
    (DownloadTimeout("u", "slow"), False, UNREACHABLE),
    (RedirectRefused("u", "elsewhere"), False, LIE),  # the gateway's: one to where no page may come from
    (DownloadError("u", "reset"), False, UNREACHABLE),
    (DownloadLengthError("u", 1, 2), False, LIE),
    (BadMetadata("junk"), False, LIE),
    (OSError("our disk"), False, None),
    (KeyError("our bug"), False, None),
]


@pytest.mark.parametrize("error,resumed,outcome", CLASSIFIED, ids=[f"{type(e).__name__}-{e}-{r}" for e, r, _ in CLASSIFIED])
def test_classify(error: Exception, resumed: bool, outcome: Outcome | None) -> None:
    assert classify(error, resumed=resumed) is outcome


def test_outcome_labels_are_the_attempt_metrics_three() -> None:
    assert {o.label for o in Outcome} == {"ok", "error", "refused"}
    assert (SERVED.label, LIE.label, MISSING.label, DENIED.label) == ("ok", "refused", "error", "error")


async def test_an_error_not_of_the_mirror_ends_the_loop_at_once() -> None:
    asked: list[int] = []

    async def attempt(i: int, _url: str) -> None:
        asked.append(i)
        raise OSError("the store is full") if i == 1 else DownloadHTTPError("u", 503)

    with pytest.raises(OSError, match="store is full"):
        await failover(["a", "b", "c"], attempt)
    assert asked == [0, 1]


def test_in_order_asks_every_mirror_once() -> None:
    tried = Tried(["a", "b"])
    assert in_order(tried) == 0
    assert in_order(Tried([])) is None
