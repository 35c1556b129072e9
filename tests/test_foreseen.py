"""Files fetched ahead on a gateway's publish answer, or carried in it (issue 33): the wrapper over a real
HTTP server on 127.0.0.1 (a body is handed over once, within its bound, in time; anything else is fetched
again), a carried timestamp taken only above the version trusted, the answer's parsing at the edge, and an
edge in front of a real gateway, which takes the answer's timestamp, snapshot, bin-n and page without a
round trip and still refuses any of them that does not verify."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from tuf.api.metadata import Metadata

from proxy.gateway.publisher import Foresight, Publisher
from proxy.protocol import index
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.serving.edge import _expected, _given
from proxy.transport.foreseen import Foreseen
from proxy.transport.upstream import AiohttpFetcher, DownloadHTTPError, DownloadLengthError, read_whole
from proxy.trust import TrustConfig, TrustedClient
from tests.support.faults import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.poll import poll
from tests.support.proxyproc import ProxyProcess
from tests.support.relay import Relay
from tests.support.testindex import TestIndex
from tests.support.tree import signed_timestamp
from tests.support.trustenv import Env, env, tampered


class _Files:
    """``/NAME`` answers NAME's bytes (``/fail`` a 500), counting what was asked; ``/pieces/N``: N bytes in two
    pieces apart on the wire."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.url = ""

    async def answer(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.asked.append(name)
        if name.startswith("missing"):
            return web.Response(status=404)
        return web.Response(status=500) if name == "fail" else web.Response(body=name.encode() * 10)

    async def pieces(self, request: web.Request) -> web.StreamResponse:
        half = int(request.match_info["size"]) // 2
        response = web.StreamResponse()
        await response.prepare(request)
        for piece in (b"x" * half, b"y" * half):
            await response.write(piece)
            await asyncio.sleep(0.02)  # apart on the wire: a reader must wait for the second
        await response.write_eof()
        return response


def _with_foreseen(steps: Callable[[_Files, Foreseen], Awaitable[None]]) -> tuple[list[str], list[str]]:
    """Run ``steps`` against a Foreseen over a served _Files; what the server was asked and the outcomes."""
    async def scenario() -> tuple[list[str], list[str]]:
        outcomes: list[str] = []
        async for files in _served():
            fetcher = Foreseen(AiohttpFetcher(), counted=outcomes.append)
            try:
                await steps(files, fetcher)
            finally:
                await fetcher.close()
            return files.asked, outcomes
        raise AssertionError("unreachable")

    return asyncio.run(scenario())


async def _served() -> AsyncIterator[_Files]:
    files = _Files()
    app = web.Application()
    app.router.add_get("/{name}", files.answer)
    app.router.add_get("/pieces/{size}", files.pieces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    files.url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        yield files
    finally:
        await runner.cleanup()


def test_a_body_fetched_ahead_is_handed_over_once_and_anything_else_is_fetched_again() -> None:
    async def scenario() -> list[str]:
        outcomes: list[str] = []
        async for files in _served():
            fetcher = Foreseen(AiohttpFetcher(), keep=2, counted=outcomes.append)
            try:
                fetcher.expect(files.url + "a", 1000)
                assert await fetcher.fetch_bytes(files.url + "a", 1000) == b"a" * 10
                assert await fetcher.fetch_bytes(files.url + "a", 1000) == b"a" * 10  # once: then asked anew
                assert files.asked == ["a", "a"]
                # Longer than the caller's bound: not handed over; the ordinary fetch then refuses it itself.
                fetcher.expect(files.url + "b", 1000)
                with pytest.raises(DownloadLengthError):
                    await fetcher.fetch_bytes(files.url + "b", 5)
                # A download that failed ahead is tried again when asked for (and fails for itself).
                fetcher.expect(files.url + "fail", 1000)
                with pytest.raises(DownloadHTTPError):
                    await fetcher.fetch_bytes(files.url + "fail", 1000)
                assert files.asked.count("fail") == 2
                # At most ``keep`` wait: the oldest goes unused.
                for name in ("c", "d", "e"):
                    fetcher.expect(files.url + name, 1000)
                assert await fetcher.fetch_bytes(files.url + "c", 1000) == b"c" * 10
                assert files.asked.count("c") == 1  # evicted before it asked: this is the ordinary fetch
                # A resumed download (start > 0) is never served from what was fetched ahead.
                async with fetcher.stream(files.url + "d", 1000, start=3) as body:
                    assert b"".join([chunk async for chunk in body]) == (b"d" * 10)[3:]
            finally:
                await fetcher.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes.count("used") == 1
    assert outcomes.count("wasted") == 3  # b (too long), fail, c (evicted)


def test_a_404_fetched_ahead_is_handed_over_only_where_absence_was_foreseen() -> None:
    """The next root's probe: its 404 a moment ago is the answer (no second round trip); anywhere else a 404
    ahead may be a file not written yet, and is asked again."""
    async def steps(files: _Files, fetcher: Foreseen) -> None:
        fetcher.expect(files.url + "missing-root", 1000, absent_ok=True)
        fetcher.expect(files.url + "missing-page", 1000)
        for name in ("missing-root", "missing-page"):
            with pytest.raises(DownloadHTTPError) as absent:
                await fetcher.fetch_bytes(files.url + name, 1000)
            assert absent.value.status == 404

    asked, outcomes = _with_foreseen(steps)
    assert asked.count("missing-root") == 1 and asked.count("missing-page") == 2
    assert outcomes == ["used", "wasted"]


def test_a_body_given_is_handed_over_once_within_its_bound_and_a_given_absence_as_a_404() -> None:
    async def steps(files: _Files, fetcher: Foreseen) -> None:
        fetcher.give(files.url + "a", b"given")
        assert await fetcher.fetch_bytes(files.url + "a", 1000) == b"given"
        assert await fetcher.fetch_bytes(files.url + "a", 1000) == b"a" * 10  # once: then asked anew
        fetcher.give(files.url + "b", b"x" * 100)  # longer than the caller allows: fetched for itself
        assert await fetcher.fetch_bytes(files.url + "b", 50) == b"b" * 10
        fetcher.expect(files.url + "c", 1000)
        fetcher.give(files.url + "c", b"given c")  # given after a download started: the body given wins
        assert await fetcher.fetch_bytes(files.url + "c", 1000) == b"given c"
        fetcher.give(files.url + "missing-root", None)
        with pytest.raises(DownloadHTTPError) as absent:
            await fetcher.fetch_bytes(files.url + "missing-root", 1000)
        assert absent.value.status == 404

    asked, outcomes = _with_foreseen(steps)
    assert asked.count("a") == 1 and asked.count("b") == 1 and "missing-root" not in asked
    assert outcomes.count("used") == 3 and outcomes.count("wasted") == 2  # b (too long), c's download


async def test_a_timestamp_an_answer_carried_is_used_only_above_the_version_trusted(env: Env, tmp_path: Path) -> None:
    """Taken instead of a round trip and verified like a fetched one; one no newer than the version trusted
    (another answer, or a live fetch, moved past it) is not offered to a cycle, which would call it a rollback;
    one that does not verify (older than the version its answer named, expired) is dropped and the timestamp
    fetched."""
    client = TrustedClient(env.dir, [env.mirror], Foreseen(env.fetcher), TrustConfig(refresh_interval=3600.0))
    refused: list[Exception] = []
    client.on_refused = refused.append
    try:
        await client.refresh()
        old = env.meta("timestamp.json")
        env.publish(tmp_path)
        new, version = env.meta("timestamp.json"), env.version("timestamp")
        asked = env.up.count(r"/metadata/timestamp\.json")
        client.expect({}, {}, version, {"metadata/timestamp.json": new})
        await client.refresh(force=True)
        assert client.timestamp_version == version
        assert env.up.count(r"/metadata/timestamp\.json") == asked  # the answer's, no round trip

        client.expect({}, {}, version, {"metadata/timestamp.json": old})
        await client.refresh(force=True)
        assert refused == [] and client.timestamp_version == version
        assert env.up.count(r"/metadata/timestamp\.json") == asked + 1  # fetched: the one given was no newer

        env.publish(tmp_path, "later")
        client.expect({}, {}, version + 1, {"metadata/timestamp.json": old})
        await client.refresh(force=True)
        assert refused == [] and client.timestamp_version == env.version("timestamp") == version + 1
        assert env.up.count(r"/metadata/timestamp\.json") == asked + 2

        # Expired, two versions on: python-tuf takes an expired timestamp into its set before it refuses it,
        # so one offered would make the mirror's own (one version on) look like a rollback. Left out before.
        expired = signed_timestamp(env.repo, version_bump=2, expires_delta=-timedelta(days=3))
        env.publish(tmp_path, "latest")
        client.expect({}, {}, version + 3, {"metadata/timestamp.json": expired})
        await client.refresh(force=True)
        assert refused == [] and client.timestamp_version == env.version("timestamp") == version + 2
    finally:
        client.close()


def test_a_gateway_in_a_replica_group_carries_no_timestamp(tmp_path: Path) -> None:
    """Its group serves the bucket, which has a timestamp only once pushed: an edge must not trust one first.
    The immutable files a batch signed, and whether the next root exists, are carried either way."""
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    snapshot = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes()).signed.snapshot_meta.version
    seen = Foresight({"snapshot": snapshot}, {})

    async def push() -> None:
        return None

    alone, grouped = Publisher(repo).carried(seen, 1), Publisher(repo, after=push).carried(seen, 1)
    assert set(alone.bodies) == {"metadata/timestamp.json", f"metadata/{snapshot}.snapshot.json", "metadata/2.root.json"}
    assert set(grouped.bodies) == set(alone.bodies) - {"metadata/timestamp.json"}
    assert alone.bodies["metadata/2.root.json"] is None
    assert (grouped.version, grouped.roles) == (None, seen.roles)  # no timestamp: the batch's own files


def test_an_answer_carries_the_current_timestamp_and_the_snapshot_and_bin_n_it_names(tmp_path: Path) -> None:
    """A batch signed after a project's moves the snapshot (and, in the same bin, its bin-n): the answer for the
    project carries the timestamp the tree serves now and the files that one names, so the edge's cycle verifies
    what it was handed instead of fetching the newer snapshot and bin-n before it can answer."""
    repo = Repository.init(tmp_path / "g", bins=2, layout="gateway", clock_versions=True)
    publisher = Publisher(repo, window=0.01)
    profile = repo.profile
    succinct = repo.load_metadata(profile.bin_delegator, 1).signed.delegations.succinct_roles

    def bin_of(name: str) -> str:
        return str(succinct.get_role_for_target(profile.page_target(name, profile.signed_formats[0])))

    def page(name: str) -> index.ProjectPage:
        return index.ProjectPage(name=name, files=())

    second = next(f"p{i}" for i in range(100) if bin_of(f"p{i}") == bin_of("first"))

    async def scenario() -> Foresight | None:
        publisher.start()
        try:
            await publisher.publish({"first": page("first")})
            seen = publisher.foresight("first")
            await publisher.publish({second: page(second)})  # the same bin: re-signs first's bin-n as well
        finally:
            await publisher.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen is not None
    stamp = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes()).signed
    snapshot = stamp.snapshot_meta.version
    listed = Metadata.from_bytes((repo.metadata_dir / f"{snapshot}.snapshot.json").read_bytes()).signed.meta
    (bin_n,) = set(seen.roles) - {"snapshot"}
    assert seen.roles["snapshot"] < snapshot and seen.roles[bin_n] < listed[f"{bin_n}.json"].version
    carried = publisher.carried(seen, None)
    assert carried.version == stamp.version
    assert carried.roles == {"snapshot": snapshot, bin_n: listed[f"{bin_n}.json"].version}
    assert carried.bodies["metadata/timestamp.json"] == (repo.metadata_dir / "timestamp.json").read_bytes()
    for role, version in carried.roles.items():
        name = f"{version}.{role}.json"
        assert carried.bodies[f"metadata/{name}"] == (repo.metadata_dir / name).read_bytes()
    # A timestamp it cannot read leaves the batch's own files named.
    (repo.metadata_dir / "timestamp.json").write_bytes(b"{}")
    assert publisher.carried(seen, None).roles == seen.roles


def test_a_body_asked_for_after_its_ttl_is_fetched_again() -> None:
    async def scenario() -> list[str]:
        async for files in _served():
            fetcher = Foreseen(AiohttpFetcher(), ttl=0.0)
            try:
                fetcher.expect(files.url + "a", 1000)
                await asyncio.sleep(0.01)  # past the ttl (the condition, not synchronisation)
                assert await fetcher.fetch_bytes(files.url + "a", 1000) == b"a" * 10
            finally:
                await fetcher.close()
            return files.asked
        raise AssertionError("unreachable")

    assert asyncio.run(scenario()) == ["a", "a"]


async def test_a_root_probe_404_kept_from_before_a_rotation_is_not_taken_for_the_last_word(env: Env) -> None:
    """A publish answer's root probe (404) waits to be used; meanwhile the repository rotates its root and
    online key.  The cycle that takes the 404 meets a timestamp signed by the new key: it looks for the next
    root again, finds it, and follows it, rather than refusing the repository."""
    client = TrustedClient(env.dir, [env.mirror], Foreseen(env.fetcher), TrustConfig(refresh_interval=3600.0))
    refused: list[Exception] = []
    client.on_refused = refused.append
    try:
        await client.refresh()
        env.up.status(r"/metadata/2\.root\.json", 404)  # whatever the rotation's timing, the probe ahead says 404
        assert client.expect({}, {}) == 1
        await poll(lambda: env.up.count(r"/metadata/2\.root\.json") == 2, "the root probe ahead asked")
        env.up.clear()
        env.repo.rotate_root(rotate_online=True)
        await client.refresh(force=True)
        assert client.status()["roles"]["root"]["version"] == 2
        assert client.status()["roles"]["timestamp"]["version"] == env.version("timestamp")
        assert refused == []
        # The first refresh's probe, the one ahead (404), the look again, and the cycle started over.
        assert env.up.count(r"/metadata/2\.root\.json") == 4
    finally:
        client.close()


def test_the_edge_keeps_a_publish_answers_files_only_when_the_whole_hint_is_well_formed() -> None:
    digest = "ab" * 32
    good = {"roles": {"snapshot": 7, "bin-3a": 5}, "targets": {"simple/lib/index.json": digest}}
    assert _expected(good, "lib") == ({"snapshot": 7, "bin-3a": 5}, {"simple/lib/index.json": digest})
    for bad in (None, [], {"roles": []}, {"roles": {}, "targets": {"simple/other/index.json": digest}},
                {"roles": {}, "targets": {"simple/lib/../../x": digest}}, {"roles": {}, "targets": {"simple/lib/a/b": digest}},
                {"roles": {"Snapshot": 1}, "targets": {}}, {"roles": {"snapshot": 0}, "targets": {}},
                {"roles": {"snapshot": True}, "targets": {}}, {"roles": {"../x": 1}, "targets": {}},
                {"roles": {}, "targets": {"simple/lib/index.json": "xyz"}},
                {"roles": {f"bin-{i}": 1 for i in range(9)}, "targets": {}}):
        assert _expected(bad, "lib") == ({}, {}), bad


def test_the_edge_takes_a_publish_answers_bodies_only_when_all_are_well_formed() -> None:
    ts, page = base64.b64encode(b"timestamp").decode(), base64.b64encode(b"page").decode()
    good = {"metadata/timestamp.json": ts, "simple/lib/ab.index.json": page, "metadata/2.root.json": None}
    assert _given(good) == {"metadata/timestamp.json": b"timestamp", "simple/lib/ab.index.json": b"page",
                            "metadata/2.root.json": None}
    for bad in (None, [], "x", {"metadata/timestamp.json": 1}, {"metadata/timestamp.json": "not base64!"},
                {"metadata/timestamp.json": ["x"]}, {f"simple/lib/{i}": ts for i in range(11)}):
        assert _given(bad) == {}, bad


def _forge(name: str, change: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """An edit of a publish answer: the bodies it carries whose path matches ``name`` changed by ``change``."""
    def edit(body: bytes) -> bytes:
        answer = json.loads(body)
        for path, given in answer.get("given", {}).items():
            if given is not None and re.fullmatch(name, path):
                answer["given"][path] = base64.b64encode(change(base64.b64decode(given))).decode()
        return json.dumps(answer).encode()
    return edit


def test_a_publish_answer_arriving_in_pieces_is_read_whole() -> None:
    async def scenario() -> tuple[bytes | None, bytes | None]:
        async for files in _served():
            async with aiohttp.ClientSession() as session:
                async with session.get(files.url + "pieces/140000") as r:
                    whole = await read_whole(r, 140_000)
                async with session.get(files.url + "pieces/140000") as r:
                    over = await read_whole(r, 139_999)
            return whole, over
        raise AssertionError("unreachable")

    whole, over = asyncio.run(scenario())
    assert whole == b"x" * 70_000 + b"y" * 70_000 and over is None


@pytest.mark.slow
def test_an_edge_takes_the_answers_bodies_without_a_round_trip_and_refuses_any_that_does_not_verify(
        tmp_path: Path) -> None:
    index = TestIndex()
    for name in ("lib", "page", "snap", "stamp", "held", "cdn"):
        index.add(build_wheel(tmp_path / "dists", name, "1.0"))
    gateway_init(tmp_path / "gw")
    stale = (tmp_path / "gw" / "public" / "metadata" / "timestamp.json").read_bytes()
    with index, GatewayProcess(tmp_path / "gw", "--index-url", index.url) as gw, Relay(gw.base) as relay:
        # The edge reads the gateway through a relay that logs what it is asked and can forge what the gateway's
        # answers carry.
        with ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", relay.base, "--root",
                          str(gw.root), "--workers", "1", "--audit-log", str(tmp_path / "edge.audit")) as edge:
            def page(project: str, url: str = edge.url) -> int:
                request = urllib.request.Request(f"{url}{project}/",
                                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
                try:
                    with urllib.request.urlopen(request, timeout=30) as r:
                        assert f"{project}-1.0-py3-none-any.whl".encode() in r.read()
                        return int(r.status)
                except urllib.error.HTTPError as e:
                    return e.code

            def asked_after_publish(project: str) -> list[str]:
                asked = relay.requests[relay.requests.index(f"POST /_tufproxy/publish/{project}") + 1:]
                return [a for a in asked if not a.startswith("POST ")]

            # Signed at the gateway before lib, so in every timestamp the edge trusts from lib's miss on.
            with urllib.request.urlopen(urllib.request.Request(f"{gw.base}_tufproxy/publish/held", method="POST"),
                                        timeout=30):
                pass
            # The edge has not read lib's bin-n: it asks the gateway to publish lib before that read ends (the
            # relay holds the read until the publish has come).
            relay.hold(r"GET /metadata/1\.bins?(-[0-9a-f]+)?\.json", r"POST /_tufproxy/publish/lib")
            assert page("lib") == 200
            assert relay.released and all(came for _, came in relay.released), relay.released
            relay.clear()
            # The answer carried the next root's absence, the timestamp, the new snapshot, lib's bin-n and its
            # JSON page: after it the edge asked the gateway nothing but the roles its lookup was reading.
            looked = r"GET /metadata/1\.bins?(-[0-9a-f]+)?\.json"
            assert [a for a in asked_after_publish("lib") if not re.fullmatch(looked, a)] == []
            assert metric(edge.base, 'tufproxy_foreseen_total{outcome="used"}') >= 4

            # Bodies that are not the signed ones, carried like any: each refused, never served.
            relay.rewrite("/_tufproxy/publish/page", _forge(r"simple/page/.*", lambda b: b.replace(b"page", b"evil")))
            relay.rewrite("/_tufproxy/publish/snap", _forge(r"metadata/\d+\.snapshot\.json",
                                                            lambda b: tampered(b, lambda s: s.update(version=99))))
            assert page("page") == 502 and page("snap") == 502
            audit = [json.loads(line) for line in (tmp_path / "edge.audit").read_text().splitlines()]
            refusals = [a for a in audit if a.get("event") == "refused"]
            assert all(a.get("fault") == "repository" for a in refusals), refusals
            assert any("simple/page/" in str(a.get("target")) for a in refusals), refusals
            assert "bad-signature" in {a.get("reason") for a in refusals}, refusals
            # A timestamp that does not verify (an older one, under a newer version's name) is a hint gone
            # wrong: dropped, and the timestamp asked for, which serves the page.
            relay.rewrite("/_tufproxy/publish/stamp", _forge(r"metadata/timestamp\.json", lambda _: stale))
            assert page("stamp") == 200
            assert "GET /metadata/timestamp.json" in asked_after_publish("stamp")
            relay.clear()
            assert page("snap") == 200  # the refused update cost nothing lasting

            # A project signed before the timestamp the edge trusts, in a bin-n it has not read: asked ahead all
            # the same (the edge cannot tell yet), answered at once naming and carrying nothing, and found.
            answers: list[dict[str, object]] = []
            relay.rewrite("/_tufproxy/publish/held", lambda body: answers.append(json.loads(body)) or body)
            held = urllib.request.Request(f"{edge.url}held/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(held, timeout=30) as r:
                assert b"held-1.0-py3-none-any.whl" in r.read()
                phases = r.headers.get("Server-Timing") or ""
                assert "lookup" not in phases and "publish" not in phases, phases  # found: no miss (the page fetched)
            assert [("given" in a, "expect" in a) for a in answers] == [(False, False)], answers
            relay.clear()
            # Only a page in the timestamp the edge names (have=T) gets the empty answer.
            for have, names in (("0", True), ("abc", True), ("9" * 19, False)):
                ask = urllib.request.Request(f"{gw.base}_tufproxy/publish/lib?given=1&have={have}", method="POST")
                with urllib.request.urlopen(ask, timeout=30) as r:
                    said = json.loads(r.read())
                assert ("expect" in said, "given" in said) == (names, names), (have, said)
            # lib was signed several batches ago: the answer names the timestamp the gateway serves now, and the
            # snapshot that one names, and carries both (not the older ones of the batch that signed lib).
            now = Metadata.from_bytes((tmp_path / "gw" / "public" / "metadata" / "timestamp.json").read_bytes()).signed
            ask = urllib.request.Request(f"{gw.base}_tufproxy/publish/lib?given=1&have=0", method="POST")
            with urllib.request.urlopen(ask, timeout=30) as r:
                said = json.loads(r.read())
            snapshot = now.snapshot_meta.version
            assert (said["timestamp_version"], said["expect"]["roles"]["snapshot"]) == (now.version, snapshot)
            assert f"metadata/{snapshot}.snapshot.json" in said["given"]
            assert Metadata.from_bytes(base64.b64decode(said["given"]["metadata/timestamp.json"])).signed == now

            # A root version that is not a plain number is ignored, never an error.
            odd = urllib.request.Request(f"{gw.base}_tufproxy/publish/lib?root=%C2%B2", method="POST")
            with urllib.request.urlopen(odd, timeout=30) as r:
                assert "metadata/2.root.json" not in json.loads(r.read()).get("given", {})

        # An edge whose refreshes read another copy first (a CDN, a mirror of the tree) takes none of the bodies:
        # that copy may not serve that timestamp yet. It fetches what the answer names, from its mirror.
        mirror = FaultyUpstream(tmp_path / "gw" / "public")
        with mirror, ProxyProcess(tmp_path / "edge2", "--profile", "gateway", "--upstream", mirror.url,
                                  "--gateway-url", gw.base, "--root", str(gw.root), "--workers", "1") as edge2:
            assert page("cdn", edge2.url) == 200
            for name in (r"metadata/timestamp\.json", r"metadata/\d+\.snapshot\.json",
                         r"metadata/\d+\.bin-[0-9a-f]+\.json", r"simple/cdn/[0-9a-f]{64}\.index\.json"):
                assert any(re.fullmatch(f"/{name}", p) for p in mirror.requests), (name, mirror.requests)
