"""The gateway's adaptive batch window: who a batch waits for (issue 33).

A batch a client waits for waits only for other clients' pages still being
fetched; a batch of prefetch guesses alone waits for the rest of their wave,
so a wave is signed once; a client asking for a guess makes it a client's
page.  Real repositories and publishers, in-process; the index is a stub
whose pages arrive when the test says, so which batch signed what is decided
by the rule and not by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from proxy.gateway.ledger import Ledger
from proxy.gateway.listing import IndexClient, Listing
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.policy import Policy
from proxy.gateway.publisher import PATIENCE_WEIGHT, Publisher
from proxy.gateway.service import Gateway
from proxy.protocol import index
from proxy.repository import Repository
from proxy.storage.audit import AuditLog
from proxy.util.locks import FetchLocks

# Far longer than any test runs: a batch that waited its whole window would time the test out instead.
WINDOW = 60.0
DONE_WITHIN = 10.0


def _page(name: str) -> index.ProjectPage:
    return index.ProjectPage(name=name, files=())


def _run(tmp_path: Path, scenario: Callable[[Publisher], Awaitable[None]], patience: float | None = WINDOW) -> None:
    """``scenario`` against a started publisher; ``patience`` WINDOW: a batch waits for every page it may wait for
    (who waits for whom is the rule tested, not for how long); None: as long as batches take, as served."""
    publisher = Publisher(Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True), window=WINDOW,
                          patience=patience)

    async def main() -> None:
        publisher.start()
        try:
            await asyncio.wait_for(scenario(publisher), DONE_WITHIN)
        finally:
            await publisher.stop()

    asyncio.run(main())


async def _settle() -> None:
    """Let every ready task run (the batch loop reaches its decision); a few loop turns, no wall-clock wait."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_wave_of_guesses_is_signed_in_one_batch(tmp_path: Path) -> None:
    async def scenario(publisher: Publisher) -> None:
        with publisher.preparing("b", urgent=False):
            with publisher.preparing("a", urgent=False):
                pass
            first = asyncio.create_task(publisher.publish({"a": _page("a")}, urgent=False))
            await _settle()
            assert not first.done()  # b is still being fetched and no client waits: the batch waits for it
        second = await publisher.publish({"b": _page("b")}, urgent=False)
        assert (await first).version == second.version

    _run(tmp_path, scenario)


def test_a_clients_page_is_never_held_back_by_a_guess(tmp_path: Path) -> None:
    async def scenario(publisher: Publisher) -> None:
        with publisher.preparing("guess", urgent=False):
            signed = await publisher.publish({"client": _page("client")})
        assert publisher.timestamp_version == signed.version
        assert "client" in publisher.published and "guess" not in publisher.published

    _run(tmp_path, scenario)


def test_a_client_asking_for_a_queued_guess_ends_the_wait_for_the_others(tmp_path: Path) -> None:
    async def scenario(publisher: Publisher) -> None:
        with publisher.preparing("slow", urgent=False):
            queued = asyncio.create_task(publisher.publish({"a": _page("a")}, urgent=False))
            await _settle()
            assert not queued.done()
            publisher.urge("a")
            await queued
            assert "slow" not in publisher.published

    _run(tmp_path, scenario)


def test_a_guess_a_client_asks_for_is_waited_for_like_a_clients_page(tmp_path: Path) -> None:
    async def scenario(publisher: Publisher) -> None:
        with publisher.preparing("guess", urgent=False):
            publisher.urge("guess")
            client = asyncio.create_task(publisher.publish({"client": _page("client")}))
            await _settle()
            assert not client.done()
        guess = await publisher.publish({"guess": _page("guess")}, urgent=False)
        assert (await client).version == guess.version

    _run(tmp_path, scenario)


def test_a_batch_waits_for_a_late_page_about_as_long_as_a_batch_takes(tmp_path: Path) -> None:
    """As served, a client's batch waits for another client's page still being fetched no longer than the last
    batches took to sign (not the whole window): a page arriving later is signed sooner in a batch of its own."""

    async def scenario(publisher: Publisher) -> None:
        with publisher.preparing("late"):  # never arrives while the test runs: waiting for it would time out
            for project in ("a", "b"):
                await publisher.publish({project: _page(project)})
        assert {"a", "b"} <= publisher.published and "late" not in publisher.published
        assert 0 < publisher.patience < WINDOW  # taken from the batches just signed

    _run(tmp_path, scenario, patience=None)


def test_patience_follows_the_batches_that_signed_pages(tmp_path: Path) -> None:
    """A batch that signed pages moves the estimate toward what it took (here a slow bucket push of 50 ms); a
    re-sign of the online roles, and a batch whose pages had not changed, leave it alone."""
    push = 0.05  # what the push costs (the work measured, not a wait for another task)

    async def slow_push() -> None:
        await asyncio.sleep(push)

    publisher = Publisher(Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True), window=WINDOW,
                          after=slow_push)

    async def main() -> None:
        publisher.start()
        try:
            first = publisher.patience
            await publisher.publish({"a": _page("a")})
            moved = publisher.patience
            assert moved >= first + PATIENCE_WEIGHT * (push - first)
            await publisher.resign()
            await publisher.publish({"a": _page("a")})  # the same page: nothing to sign
            assert publisher.patience == moved
        finally:
            await publisher.stop()

    asyncio.run(asyncio.wait_for(main(), DONE_WITHIN))


class _Index(IndexClient):
    """An index whose page for each project arrives when the test releases it."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.release: dict[str, asyncio.Event] = {}
        self.asked: dict[str, asyncio.Event] = {}

    def _event(self, events: dict[str, asyncio.Event], project: str) -> asyncio.Event:
        return events.setdefault(project, asyncio.Event())

    async def listing(self, project: str, policy: Policy, only: str | None = None) -> Listing:
        self._event(self.asked, project).set()
        await self._event(self.release, project).wait()
        return Listing(project, "http://127.0.0.1:9/simple/", _page(project))


def _run_gateway(tmp_path: Path, scenario: Callable[[Gateway, _Index], Awaitable[None]],
                 locks: FetchLocks | None = None) -> None:
    """``scenario`` against a Gateway (real publisher, repository and ledger) whose index is an :class:`_Index`."""
    publisher = Publisher(Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True), window=WINDOW,
                          patience=WINDOW)
    audit = AuditLog(tmp_path / "audit.jsonl")
    stub = _Index()
    gateway = Gateway(stub, Ledger(tmp_path / "ledger"), publisher, audit, GatewayMetrics(), locks=locks)

    async def main() -> None:
        publisher.start()
        try:
            await asyncio.wait_for(scenario(gateway, stub), DONE_WITHIN)
        finally:
            await publisher.stop()

    try:
        asyncio.run(main())
    finally:
        audit.close()


def test_a_client_joining_a_prefetch_under_way_makes_its_batch_wait_for_it(tmp_path: Path) -> None:
    """Gateway.ensure's side: a client's publish of a project a prefetch is fetching urges it, so the client
    batch signed meanwhile waits for it and both are carried by one timestamp."""

    async def scenario(gateway: Gateway, stub: _Index) -> None:
        guess = asyncio.create_task(gateway.ensure("dep", gateway.prefetcher.first_wave()))
        await stub._event(stub.asked, "dep").wait()
        joined = asyncio.create_task(gateway.ensure("dep"))  # a client asks for the page being prefetched
        top = asyncio.create_task(gateway.ensure("top"))
        stub._event(stub.release, "top").set()
        await _settle()
        assert not top.done()  # its batch waits for dep, which a client now waits for too
        stub._event(stub.release, "dep").set()
        assert (await top).timestamp_version == (await joined).timestamp_version == (await guess).timestamp_version

    _run_gateway(tmp_path, scenario)


def test_under_workers_a_guess_is_signed_without_waiting_for_other_guesses(tmp_path: Path) -> None:
    """Under --workers a guess's batch holds the cross-process lock on its project, which a client on another
    worker waits for and cannot urge: so it waits for no other guess."""

    async def scenario(gateway: Gateway, stub: _Index) -> None:
        fast = asyncio.create_task(gateway.ensure("fast", gateway.prefetcher.first_wave()))
        slow = asyncio.create_task(gateway.ensure("slow", gateway.prefetcher.first_wave()))
        await stub._event(stub.asked, "slow").wait()
        stub._event(stub.release, "fast").set()
        await fast  # signed while slow is still being fetched
        assert not slow.done()
        stub._event(stub.release, "slow").set()
        await slow

    _run_gateway(tmp_path, scenario, FetchLocks(tmp_path / "locks"))
