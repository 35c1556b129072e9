"""The resolver in process, with plain values: decisions, the on_miss hook, and the one error table.

A real signed repository on disk, read through ``LocalFetcher`` (the
``serve --repository`` path), a real store, trust core and audit log; no
HTTP server: each test asks :meth:`Resolver.resolve` and looks at the
decision value.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import proxy.serving.resolver as resolver_module
import proxy.trust.client as trust_client
from proxy.protocol import index
from proxy.protocol.errors import (
    BadPath,
    Busy,
    ExpiredMetadata,
    MetadataPending,
    NotAcceptable,
    NotFound,
    RepositoryError,
    StoreError,
    StoreFull,
    UnknownTarget,
    UpstreamUnreachable,
)
from proxy.protocol.hashing import UnsupportedHashes
from proxy.repository.sample import build_wheel
from proxy.repository.signer import _Change
from proxy.serving.refusals import Asker, Refusals
from proxy.serving.resolver import (
    Ask,
    CachedFile,
    KeptFile,
    NotModified,
    Page,
    ProxySettings,
    Redirect,
    Refused,
    Resolver,
    Streamed,
)
from proxy.storage.audit import AuditLog
from proxy.storage.pagecache import HotPages, IndexCache
from proxy.storage.store import BlobStore
from proxy.transport.local import LocalFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient
from proxy.trust.fetch import MissingUpstream
from proxy.util.metrics import Metrics
from tests.conftest import SampleRepo

WHEEL = "/packages/base/base-2.0-py3-none-any.whl"


class World:
    def __init__(self, tmp_path: Path, sample: SampleRepo, on_miss=None, slot: str = "md") -> None:  # type: ignore[no-untyped-def]
        self.repo = sample.repo
        self.audit_path = tmp_path / "audit.log"
        fetcher = LocalFetcher(self.repo.public_dir)
        base = fetcher.base_url()
        TrustedClient.initialize(tmp_path / slot, sample.root_bytes)
        profile = self.repo.profile
        self.trust = TrustedClient(tmp_path / slot, [Mirror(f"{base}{profile.metadata_path}", base)], fetcher,
                                   TrustConfig(served_name=profile.served_name))
        self.store = BlobStore(tmp_path / "cache")
        self.metrics = Metrics()
        self.resolver = Resolver(self.trust, fetcher, self.store, IndexCache(tmp_path / "cache"),
                                 AuditLog(self.audit_path), self.metrics, ProxySettings(), profile, (), on_miss)

    async def ask(self, path: str, accept: str | None = None, whole: bool = False):  # type: ignore[no-untyped-def]
        return await self.resolver.resolve(Ask("rid", "127.0.0.1", path, accept=accept, whole=whole))

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()] if self.audit_path.exists() else []

    def sign_md5_only(self, target_path: str, data: bytes) -> None:
        """A target the repository vouches for with md5 alone (no hash we check)."""
        with self.repo._locked():
            change = _Change(self.repo, datetime.now(UTC).replace(microsecond=0))
            info = change.put_target(target_path, data)
            info.hashes = {"md5": hashlib.md5(data).hexdigest()}
            change.commit()


@pytest.fixture
async def world(tmp_path: Path, sample_repo: SampleRepo) -> World:
    w = World(tmp_path, sample_repo)
    await w.trust.refresh()
    return w


async def test_pages_redirects_and_bad_paths(world: World) -> None:
    page = await world.ask("/simple/base/", accept="application/vnd.pypi.simple.v1+json")
    assert isinstance(page, Page) and page.content_type == "application/vnd.pypi.simple.v1+json"
    assert json.loads(page.body)["name"] == "base"
    assert await world.ask("/simple/Base/") == Redirect("../base/", permanent=True)
    assert await world.ask("/") == Redirect("simple/", permanent=False)
    bad = await world.ask("/nope/../x")
    assert isinstance(bad, Refused) and isinstance(bad.error, BadPath)
    refused = await world.ask("/simple/base/", accept="image/png")
    assert isinstance(refused, Refused) and isinstance(refused.error, NotAcceptable)


async def test_a_cold_file_streams_or_comes_whole_and_pinned(world: World, sample_repo: SampleRepo) -> None:
    data = (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    streamed = await world.ask(WHEEL)
    assert isinstance(streamed, Streamed) and streamed.length == len(data)
    blob = await streamed.download.result
    assert blob.path.read_bytes() == data
    whole = await world.ask(WHEEL, whole=True)
    assert isinstance(whole, CachedFile) and whole.blob == blob
    assert world.store._pins[blob.sha256] == 1  # pinned inside the decision
    with whole:
        pass
    assert blob.sha256 not in world.store._pins


async def test_unknown_project_asks_on_miss_once(tmp_path: Path, sample_repo: SampleRepo) -> None:
    asked: list[str] = []

    async def on_miss(project: str) -> bool:
        asked.append(project)
        if project != "late":
            return False
        sample_repo.repo.add([build_wheel(tmp_path / "late-dists", "late", "1.0")])
        await world.trust.refresh(force=True)
        return True

    world = World(tmp_path, sample_repo, on_miss)
    await world.trust.refresh()
    missing = await world.ask("/simple/no-such/")
    assert isinstance(missing, Refused) and isinstance(missing.error, UnknownTarget)
    assert isinstance(await world.ask("/simple/late/"), Page)
    assert asked == ["no-such", "late"]
    # A file whose page is needed does not ask: its project is known; an unknown file is 404.
    gone = await world.ask("/packages/late/late-9.0-py3-none-any.whl")
    assert isinstance(gone, Refused) and isinstance(gone.error, NotFound)


async def test_on_miss_pending_is_503_with_retry_after(tmp_path: Path, sample_repo: SampleRepo) -> None:
    async def on_miss(project: str) -> bool:
        raise MetadataPending(project, retry_after=3)

    world = World(tmp_path, sample_repo, on_miss)
    await world.trust.refresh()
    decision = await world.ask("/simple/unheard-of/")
    assert isinstance(decision, Refused)
    answer = world.resolver.refusals.answer(Asker("rid", None, "/simple/unheard-of/"), decision.error)
    assert (answer.status, answer.slug, answer.headers["Retry-After"]) == (503, "metadata-pending", "3")


@pytest.mark.parametrize("what", ["page", "file"])
async def test_md5_only_target_is_one_typed_refusal(world: World, what: str) -> None:
    if what == "page":
        path, target = "/simple/md5only/", "simple/md5only/index.html"
        data = b"<!DOCTYPE html><html><body></body></html>"
    else:
        path = target = "/packages/base/base-9.9-py3-none-any.whl"
        target, data = target.lstrip("/"), b"not checked"
    world.sign_md5_only(target, data)
    await world.trust.refresh(force=True)
    decision = await world.ask(path, accept="text/html")
    assert isinstance(decision, Refused) and isinstance(decision.error, UnsupportedHashes), decision
    answer = world.resolver.refusals.answer(Asker("rid", None, path, target=target), decision.error)
    assert (answer.status, answer.slug) == (502, "unsupported-hash")
    assert [r["reason"] for r in world.audit() if r["event"] == "refused"] == ["unsupported-hash"]
    assert world.metrics.refusals.labels("repository", "unsupported-hash")._value.get() == 1


async def test_a_tampered_cached_page_is_rechecked_once_per_process(tmp_path: Path, sample_repo: SampleRepo) -> None:
    first = World(tmp_path, sample_repo)
    await first.trust.refresh()
    assert isinstance(await first.ask("/simple/base/", accept="text/html"), Page)
    await first.resolver.close()  # its page writes end
    pages = IndexCache(tmp_path / "cache")
    (key,) = [k for k in pages.keys() if k.startswith("simple/base/")]  # noqa: SIM118 - IndexCache has keys(), no __iter__
    pages.set(key, b"<html>base is gone</html>")
    second = World(tmp_path, sample_repo, slot="md2")  # a new process: nothing re-checked yet
    await second.trust.refresh()
    page = await second.ask("/simple/base/", accept="text/html")
    assert isinstance(page, Page) and b"base-2.0-py3-none-any.whl" in page.body
    assert pages.get(key) != b"<html>base is gone</html>"


class _HeldPages(IndexCache):
    """A page cache whose writes wait until released, or fail as a full disk does."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.entered = threading.Event()  # a write has begun (and waits for release)
        self.full = False
        self.error: Exception | None = None

    def set(self, key: str, value: bytes) -> None:
        self.entered.set()
        assert self.release.wait(10)
        if self.full:
            raise StoreFull("index cache write: no space left on device")
        if self.error is not None:
            raise self.error
        super().set(key, value)


async def test_a_page_is_answered_before_its_disk_write_ends_and_despite_its_failure(
        world: World, tmp_path: Path) -> None:
    held = _HeldPages(tmp_path / "held")
    world.resolver.pages = held
    page = await world.ask("/simple/base/", accept="application/vnd.pypi.simple.v1+json")
    assert isinstance(page, Page) and json.loads(page.body)["name"] == "base"
    assert held.keys() == []  # its write waits
    held.release.set()
    await world.resolver.close()  # lets the writes under way end
    assert [k for k in held.keys() if k.startswith("simple/base/")]  # noqa: SIM118 - IndexCache has no __iter__
    # A disk that refuses the write: the page is still answered (from memory), and the failure logged.
    held.full = True
    lib = await world.ask("/simple/lib/", accept="application/vnd.pypi.simple.v1+json")
    await world.resolver.close()
    assert isinstance(lib, Page) and not [k for k in held.keys() if k.startswith("simple/lib/")]  # noqa: SIM118


async def test_page_writes_under_way_are_bounded_and_a_page_too_large_for_memory_is_written_first(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    json_v1 = "application/vnd.pypi.simple.v1+json"
    held = _HeldPages(tmp_path / "held")
    world.resolver.pages = held
    # Larger than the memory that answers pages keeps (a quarter of it): on disk before it is answered.
    monkeypatch.setattr(resolver_module, "_RAW_BYTES", 64)
    large = asyncio.ensure_future(world.ask("/simple/base/", accept=json_v1))
    assert await asyncio.to_thread(held.entered.wait, 10)
    assert not large.done()
    held.release.set()
    assert isinstance(await large, Page) and [k for k in held.keys() if k.startswith("simple/base/")]  # noqa: SIM118
    # At most _PAGE_WRITES under way: the next page waits for a write to end before it is answered.
    monkeypatch.undo()
    world.resolver.pages = held
    monkeypatch.setattr(resolver_module, "_PAGE_WRITES", 1)
    held.release.clear()
    held.entered.clear()
    first = await world.ask("/simple/lib/", accept=json_v1)  # answered; its write is held
    assert isinstance(first, Page) and await asyncio.to_thread(held.entered.wait, 10)
    waiting = asyncio.Event()
    real_wait = asyncio.wait

    async def noted_wait(*args: object, **kwargs: object) -> object:
        waiting.set()
        return await real_wait(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(resolver_module.asyncio, "wait", noted_wait)
    second = asyncio.ensure_future(world.ask("/simple/app/", accept=json_v1))
    await asyncio.wait_for(waiting.wait(), 10)
    assert not second.done()
    held.release.set()
    assert isinstance(await second, Page)
    await world.resolver.close()


async def test_upstream_unreachable_names_the_target_not_a_role(world: World) -> None:
    error = UpstreamUnreachable("packages/x/x-1.whl", [])
    Refusals(world.resolver.audit, world.metrics, world.trust).answer(Asker("rid", None, "/p"), error)
    (record,) = world.audit()
    assert record["target"] == "packages/x/x-1.whl" and record["role"] is None


@pytest.mark.parametrize("layout", ["warehouse"], indirect=True)
@pytest.mark.parametrize("digest", ["abc", "Z" * 64, "0" * 63])
async def test_a_malformed_sha256_on_a_signed_page_is_a_typed_refusal(world: World, digest: str) -> None:
    profile = world.repo.profile
    page_path = profile.page_target("base", profile.signed_formats[0])
    info = (await world.trust.get_target(page_path))
    raw = world.repo.served_path(page_path, next(iter(info.hashes.values()))).read_bytes()
    page = index.parse_project_html(raw, "base")
    bad = dataclasses.replace(page, files=tuple(dataclasses.replace(f, hashes={"sha256": digest}) for f in page.files))
    with world.repo._locked():
        change = _Change(world.repo, datetime.now(UTC).replace(microsecond=0))
        change.put_target(page_path, index.render_project_html(bad))
        change.commit()
    await world.trust.refresh(force=True)
    decision = await world.ask(WHEEL)
    assert isinstance(decision, Refused) and isinstance(decision.error, UnsupportedHashes), decision
    assert world.resolver.refusals.answer(Asker("rid", None, WHEEL), decision.error).status == 502


JSON = "application/vnd.pypi.simple.v1+json"


async def test_a_page_carries_an_etag_that_never_outlives_its_trusted_state(
        world: World, sample_repo: SampleRepo, tmp_path: Path) -> None:
    first = await world.ask("/simple/base/", accept=JSON)
    assert isinstance(first, Page) and first.headers["ETag"] == first.etag
    assert await world.ask("/simple/base/", accept=JSON) is first  # kept ready to send
    html = await world.ask("/simple/base/", accept="text/html")
    assert isinstance(html, Page) and html.etag != first.etag  # one ETag per representation
    # A conditional request is answered from the trusted target alone: no page read, no fetch.
    cold = Resolver(world.trust, LocalFetcher(sample_repo.repo.public_dir), world.store, IndexCache(tmp_path / "other"),
                    AuditLog(tmp_path / "other.log"), Metrics(), ProxySettings(), sample_repo.repo.profile)
    unchanged = await cold.resolve(Ask("rid", "127.0.0.1", "/simple/base/", accept=JSON, if_none_match=f'W/"x", {first.etag}'))
    assert isinstance(unchanged, NotModified) and unchanged.headers["ETag"] == first.etag
    assert cold.metrics.cache_misses.labels("page")._value.get() == 0
    # A new trusted state that changes the page: new bytes, and the old ETag no longer matches.
    sample_repo.repo.add([build_wheel(tmp_path / "new", "base", "3.0")])
    await world.trust.refresh(force=True)
    again = await world.resolver.resolve(Ask("rid", "127.0.0.1", "/simple/base/", accept=JSON, if_none_match=first.etag))
    assert isinstance(again, Page) and again.etag != first.etag
    assert "3.0" in json.loads(again.body)["versions"] and "3.0" not in json.loads(first.body)["versions"]


async def test_a_ready_answer_needs_the_live_trusted_state_and_a_kept_page(
        world: World, sample_repo: SampleRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """:meth:`Resolver.ready` (the hot path's question) answers only what resolve would, without waiting."""
    ready = world.resolver.ready
    assert ready("/simple/base/", JSON, None) is None  # never rendered: resolve() fetches it
    page = await world.ask("/simple/base/", accept=JSON)
    assert ready("/simple/base/", JSON, None) == ("project_index", page)
    assert ready("/simple/base/", JSON, f'"x", {page.etag}') == ("project_index", NotModified({"ETag": page.etag, "Vary": "Accept"}))
    assert ready("/simple/base/", "text/html", None) is None  # negotiated to a representation not kept yet
    root = await world.ask("/simple/", accept=JSON)
    assert ready("/simple/", JSON, None) == ("root_index", root)
    for path, accept in (
        ("/simple/Base/", JSON),
        ("/simple/base", JSON),
        (WHEEL, None),
        ("/nope/../x", None),
        ("/simple/base/", "image/png"),
        ("/metrics", None),
    ):
        assert ready(path, accept, None) is None, path  # redirects, files, refusals: resolve() answers them
    # A new trusted state that changes the page: not ready until rendered again from it.
    sample_repo.repo.add([build_wheel(tmp_path / "new", "base", "3.0")])
    await world.trust.refresh(force=True)
    assert ready("/simple/base/", JSON, None) is None
    again = await world.ask("/simple/base/", accept=JSON)
    assert isinstance(again, Page) and ready("/simple/base/", JSON, None) == ("project_index", again) != ("project_index", page)
    # Expired trusted metadata: nothing is ready, and resolve() refuses.
    monkeypatch.setattr(trust_client, "_utcnow", lambda: datetime.now(UTC) + timedelta(days=400))
    assert ready("/simple/base/", JSON, None) is None
    refused = await world.ask("/simple/base/", accept=JSON)
    assert isinstance(refused, Refused) and isinstance(refused.error, ExpiredMetadata)


@pytest.mark.parametrize("layout", ["tufproxy", "gateway"], indirect=True)
async def test_a_small_file_is_ready_from_memory_only_while_the_target_it_was_checked_against_is_trusted(
        world: World, sample_repo: SampleRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ready, data = world.resolver.ready, (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    cold = await world.ask(WHEEL)
    assert isinstance(cold, Streamed)
    blob = await cold.download.result
    assert ready(WHEEL, None, None) is None  # stored, not yet served from the store
    with await world.ask(WHEEL) as served:
        assert isinstance(served, CachedFile)
    answer = ready(WHEEL, None, None)
    assert answer is not None and answer[0] == "file"
    kept = answer[1]
    assert isinstance(kept, KeptFile) and kept.body == data and kept.sha256 == hashlib.sha256(data).hexdigest()
    st = blob.path.stat()  # what aiohttp's FileResponse derives them from
    assert kept.headers["Etag"] == f'"{st.st_mtime_ns:x}-{st.st_size:x}"' and kept.headers["Accept-Ranges"] == "bytes"
    hits, store_hits = world.metrics.cache_hits.labels("file")._value.get(), world.store.hits
    assert ready(WHEEL, None, None) == answer and world.metrics.cache_hits.labels("file")._value.get() == hits + 1
    assert world.store.hits == store_hits + 1  # its use recorded in the store, as a store hit's is
    # The blob gone, then stored again as another file: memory answers once it has read that one.
    world.store.evict(blob.sha256)
    assert ready(WHEEL, None, None) is None
    refetched = await world.ask(WHEEL)
    assert isinstance(refetched, Streamed)
    blob = await refetched.download.result
    with await world.ask(WHEEL):
        pass
    answer = ready(WHEEL, None, None)
    st = blob.path.stat()
    assert answer is not None and answer[1].headers["Etag"] == f'"{st.st_mtime_ns:x}-{st.st_size:x}"' != kept.headers["Etag"]
    # A part, a tag or a date: FileResponse's to answer.
    assert ready(WHEEL, None, '"x"') is None and ready(WHEEL, None, None, conditional=True) is None
    # A new trusted state: the file's source is derived from the new target before memory answers again.
    sample_repo.repo.add([build_wheel(tmp_path / "new", "base", "3.0")])
    await world.trust.refresh(force=True)
    with await world.ask("/packages/base/base-3.0-py3-none-any.whl", whole=True):
        pass  # looks the new state's targets up
    assert ready(WHEEL, None, None) is None
    with await world.ask(WHEEL):
        pass
    assert ready(WHEEL, None, None) == answer
    # Expired trusted metadata: nothing is ready, and resolve() refuses.
    monkeypatch.setattr(trust_client, "_utcnow", lambda: datetime.now(UTC) + timedelta(days=400))
    assert ready(WHEEL, None, None) is None


async def test_a_small_cold_file_sent_whole_is_kept_and_a_new_process_reads_a_stored_one_once(
        world: World, sample_repo: SampleRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    cold = await world.ask(WHEEL)
    assert isinstance(cold, Streamed)
    cold.served(await cold.download.result)  # what the server calls once the verified file went out whole
    await asyncio.gather(*world.resolver._keeping)
    answer = world.resolver.ready(WHEEL, None, None)
    assert answer is not None and answer[1].body == data  # no second request through the store needed
    # A new process: its first use of a stored small file is one read, verified as it is kept.
    other = World(tmp_path, sample_repo, slot="md2")
    await other.trust.refresh()
    rehashed: list[str] = []
    monkeypatch.setattr(other.store, "verify", lambda blob, hashes: rehashed.append(blob.sha256) or True)
    with await other.ask(WHEEL) as served:
        assert isinstance(served, CachedFile)
    assert rehashed == [] and other.resolver.ready(WHEEL, None, None) == answer


async def test_a_background_failure_is_logged_and_nothing_is_kept(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A page write or a keep that fails where no request waits for it: said, never 'never retrieved'."""
    cold = await world.ask(WHEEL)
    assert isinstance(cold, Streamed)
    blob = await cold.download.result

    def no_pin(sha256: str) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(world.store, "pin", no_pin)
    cold.served(blob)
    await asyncio.gather(*world.resolver._keeping, return_exceptions=True)
    held = _HeldPages(tmp_path / "held")
    held.release.set()
    held.error = RuntimeError("a bug in the cache")
    world.resolver.pages = held
    assert isinstance(await world.ask("/simple/base/", accept="application/vnd.pypi.simple.v1+json"), Page)
    await world.resolver.close()
    assert world.resolver.ready(WHEEL, None, None) is None
    logged = [r.getMessage() for r in caplog.records]
    assert any("keeping a file in memory failed: OSError" in m for m in logged), logged
    assert any("page write failed: RuntimeError: a bug in the cache" in m for m in logged), logged


async def test_a_blob_gone_when_read_for_memory_is_fetched_anew(
        world: World, sample_repo: SampleRepo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process may evict a blob between the store's answer and the read: a 404 would be wrong."""
    cold = await world.ask(WHEEL)
    assert isinstance(cold, Streamed)
    await cold.download.result

    def gone(blob: object, want: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(resolver_module, "_read_kept", gone)
    again = await world.ask(WHEEL)
    assert isinstance(again, Streamed)
    assert (await again.download.result).path.read_bytes() == (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()


async def test_memory_keeps_no_bytes_that_do_not_hash_to_their_name(world: World, sample_repo: SampleRepo) -> None:
    """Rot after the store's first re-check of a blob: the copy for memory is verified again; the rotten blob
    is neither kept nor served."""
    cold = await world.ask(WHEEL)
    assert isinstance(cold, Streamed)
    blob = await cold.download.result
    with await world.ask(WHEEL):  # re-checked by the store, and kept
        pass
    assert world.resolver.ready(WHEEL, None, None) is not None
    world.resolver._files = HotPages()  # memory let it go
    rotten = bytearray(blob.path.read_bytes())
    rotten[-1] ^= 1
    blob.path.chmod(0o644)
    blob.path.write_bytes(bytes(rotten))
    again = await world.ask(WHEEL)  # not served: evicted, fetched anew
    assert isinstance(again, Streamed)
    assert world.resolver.ready(WHEEL, None, None) is None
    assert (await again.download.result).path.read_bytes() == (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()


class _Counting(LocalFetcher):
    """The repository on disk, counting the bin-n roles fetched (what a listing costs)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.bins: list[str] = []

    def stream(self, url: str, max_length: int, start: int = 0):  # type: ignore[no-untyped-def]
        if re.fullmatch(r"[0-9]+\.bins?-[0-9a-f]+\.json", url.rsplit("/", 1)[-1]):
            self.bins.append(url.rsplit("/", 1)[-1])
        return super().stream(url, max_length, start)


def _listed(page: object) -> list[str]:
    assert isinstance(page, Page), page
    return [p["name"] for p in json.loads(page.body)["projects"]]


@pytest.mark.parametrize("layout", ["gateway", "warehouse"], indirect=True)
async def test_a_layout_with_no_signed_root_list_lists_exactly_the_pages_the_bins_vouch_for(
        world: World, tmp_path: Path) -> None:
    repo = world.repo
    counting = _Counting(repo.public_dir)
    world.trust._fetcher = counting
    world.resolver.fetcher = counting
    first = await world.ask("/simple/", accept=JSON)
    assert _listed(first) == ["app", "base", "future-only", "lib"]
    html = await world.ask("/simple/", accept="text/html")
    assert isinstance(html, Page) and b'<a href="future-only/">future-only</a>' in html.body
    assert isinstance(first, Page) and first.etag != html.etag
    again = await world.resolver.resolve(Ask("rid", "127.0.0.1", "/simple/", accept=JSON, if_none_match=first.etag))
    assert isinstance(again, NotModified) and again.headers["ETag"] == first.etag
    assert world.resolver.ready("/simple/", JSON, first.etag) is None  # never answered without a look
    assert len(counting.bins) == 16  # every bin once, for both renderings

    # A page target signed into a bin its hash does not name: no lookup would find it, so it is not listed.
    fmt = repo.profile.signed_formats[0]
    stray = repo.profile.page_target("stray", fmt)
    with repo._locked():
        change = _Change(repo, datetime.now(UTC).replace(microsecond=0))
        right = change.bin_for(stray)
        wrong = next(n for n in (f"{repo.profile.bin_prefix}-{i:x}" for i in range(16)) if n != right)
        change.role(wrong).signed.targets[stray] = change.put_target("simple/elsewhere/x", b"x")
        change.role(wrong).signed.targets[stray].path = stray
        change.dirty.add(wrong)
        change.commit()
    counting.bins.clear()
    await world.trust.refresh(force=True)
    assert _listed(await world.ask("/simple/", accept=JSON)) == ["app", "base", "future-only", "lib"]
    assert len(counting.bins) <= 2  # the bins that publish re-signed, not all 16

    if repo.profile.files_are_targets or repo.profile.name == "warehouse":
        return
    page = repo.current_page("base")
    assert page is not None
    repo.publish_pages({"lib": None, "new": dataclasses.replace(page, name="new", files=()),
                        "secret": dataclasses.replace(page, name="secret", files=())},
                       private=lambda p: p == "secret")
    await world.trust.refresh(force=True)
    assert _listed(await world.ask("/simple/", accept=JSON)) == ["app", "base", "future-only", "new"]
    assert isinstance(await world.ask("/simple/secret/", accept=JSON), Refused)  # private: as if absent here
