"""The edge's account of a file missing from a signed page: the gateway's ``why`` asked once per project per
minute however many clients ask, and never waited for past its deadline."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.serving import edge
from proxy.serving.edge import MissProtocol


class _Gateway:
    """Stands in for the gateways' ``why`` answer (the HTTP side is tested in test_why with a real gateway)."""

    def __init__(self, answer: dict[str, Any], hang: bool = False) -> None:
        self.answer, self.hang, self.asked = answer, hang, 0

    async def why(self, project: str) -> dict[str, Any]:
        self.asked += 1
        if self.hang:
            await asyncio.Event().wait()
        return self.answer


def _protocol(gateway: _Gateway) -> MissProtocol:
    protocol = MissProtocol(["http://127.0.0.1:9/"], trust=None, locks=None)  # type: ignore[arg-type]
    protocol.why = gateway.why  # type: ignore[method-assign]
    return protocol


def test_many_clients_asking_for_absent_files_ask_the_gateway_once() -> None:
    gateway = _Gateway({"project": "lib", "offered": ["lib-1.0.tar.gz"],
                        "hidden": [{"filename": "lib-2.0.tar.gz", "rule": "deny-version"}]})
    protocol = _protocol(gateway)

    async def main() -> list[str]:
        return await asyncio.gather(*(protocol.missing("lib", f"lib-{i}.0.tar.gz") for i in range(2, 200)))

    answers = asyncio.run(main())
    assert gateway.asked == 1
    assert answers[0] == ("lib-2.0.tar.gz: hidden by the gateway's policy (deny-version); "
                          "`tufproxy why 'lib==2.0' --edge URL` says more")
    assert answers[1] == "lib-3.0.tar.gz: the index does not list it for lib"


def test_a_gateway_that_does_not_answer_in_time_gets_the_generic_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge, "EXPLAIN_DEADLINE", 0.05)
    gateway = _Gateway({}, hang=True)
    protocol = _protocol(gateway)

    async def main() -> str:
        first = await protocol.missing("lib", "lib-2.0-py3-none-any.whl")
        second = await protocol.missing("lib", "not-a-distribution.zip")
        assert gateway.asked == 1  # the pending question is shared, not asked again
        return first + "\n" + second

    first, second = asyncio.run(main()).splitlines()
    assert first == ("lib-2.0-py3-none-any.whl: not on the gateway's signed page of lib; "
                     "`tufproxy why 'lib==2.0' --edge URL` says why")
    assert second.endswith("`tufproxy why lib --edge URL` says why")


def test_a_refused_project_is_named_with_the_gateways_reason() -> None:
    protocol = _protocol(_Gateway({"project": "evil", "refused": "evil: denied by policy\x1b[31m"}))
    answer = asyncio.run(protocol.missing("evil", "evil-1.0.tar.gz"))
    assert answer == "evil-1.0.tar.gz: the gateway does not offer evil: evil: denied by policy?[31m"


class _Trust:
    """What MissProtocol reads of the edge's trust core, trusting nothing yet."""

    root_version = timestamp_version = None
    first_mirror, foresees = "http://127.0.0.1:9/", False

    async def refresh_until(self, version: int, timeout: float) -> None:
        return None

    def expect(self, *args: object) -> int:
        return 0


def test_misses_take_the_publish_asked_ahead_while_it_is_under_way_and_ask_again_once_it_is_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.util.locks import FetchLocks

    monkeypatch.setattr(edge, "AHEAD_TTL", -1.0)  # an answer is old at once; one under way is taken however old

    async def main() -> list[tuple[str, bool]]:
        protocol = MissProtocol(["http://127.0.0.1:9/"], _Trust(), FetchLocks(tmp_path))  # type: ignore[arg-type]
        asked: list[tuple[str, bool]] = []
        entered, answer = asyncio.Event(), asyncio.Event()

        async def ask(project: str, ahead: bool = False) -> edge._Answer:
            asked.append((project, ahead))
            entered.set()
            await answer.wait()
            return edge._Answer(7, {}, {}, {}, [])

        protocol._ask = ask  # type: ignore[method-assign]
        protocol.ask_ahead("lib")
        protocol.ask_ahead("lib")  # asked once
        await entered.wait()
        misses = [asyncio.ensure_future(protocol.on_miss("lib")) for _ in range(2)]
        await asyncio.sleep(0)  # each miss takes its first step: it finds the ask under way
        answer.set()
        assert await asyncio.gather(*misses) == [True, True]
        assert await protocol.on_miss("lib") is True  # the answer is old now: asked again
        return asked

    assert asyncio.run(main()) == [("lib", True), ("lib", False)]


def test_a_miss_reuses_the_gateways_404_asked_ahead_but_asks_again_after_a_passing_failure(tmp_path: Path) -> None:
    from proxy.protocol.errors import UnknownTarget, UpstreamUnreachable
    from proxy.util.locks import FetchLocks

    async def main() -> list[tuple[str, bool]]:
        protocol = MissProtocol(["http://127.0.0.1:9/"], _Trust(), FetchLocks(tmp_path))  # type: ignore[arg-type]
        asked: list[tuple[str, bool]] = []

        async def ask(project: str, ahead: bool = False) -> edge._Answer:
            asked.append((project, ahead))
            if project == "absent":
                raise UnknownTarget("simple/absent/", detail="gateway: absent: no index lists it")
            if ahead:
                raise UpstreamUnreachable("publish blip", [])
            return edge._Answer(7, {}, {}, {}, [])

        protocol._ask = ask  # type: ignore[method-assign]
        for project in ("blip", "absent"):
            protocol.ask_ahead(project)
            await asyncio.wait({protocol._ahead[project].task})  # answered (or failed) before the lookup misses
        assert await protocol.on_miss("blip") is True  # the gateway unreachable a moment: asked again
        with pytest.raises(UnknownTarget):
            await protocol.on_miss("absent")  # the gateway's 404: its answer, not asked again
        await protocol.close()
        return asked

    assert asyncio.run(main()) == [("blip", True), ("absent", True), ("blip", False)]


def test_an_answer_asked_ahead_for_a_timestamp_the_edge_trusts_already_is_asked_again(tmp_path: Path) -> None:
    """The lookup missed in that timestamp: the page went since (a gateway restored from a backup), and only a
    new ask publishes it again."""
    from proxy.util.locks import FetchLocks

    async def main() -> list[bool]:
        trust = _Trust()
        trust.timestamp_version = 9  # type: ignore[assignment]
        protocol = MissProtocol(["http://127.0.0.1:9/"], trust, FetchLocks(tmp_path))  # type: ignore[arg-type]
        asked: list[bool] = []

        async def ask(project: str, ahead: bool = False) -> edge._Answer:
            asked.append(ahead)
            return edge._Answer(7 if ahead else 10, {}, {}, {}, [])

        protocol._ask = ask  # type: ignore[method-assign]
        protocol.ask_ahead("late")
        await asyncio.wait({protocol._ahead["late"].task})
        assert await protocol.on_miss("late") is True
        await protocol.close()
        return asked

    assert asyncio.run(main()) == [True, False]
