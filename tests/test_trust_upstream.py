"""proxy.transport.upstream: bounded downloads, one error family, no redirects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from proxy.transport.upstream import (
    CHUNK_SIZE,
    READ_BUFFER,
    AiohttpFetcher,
    DownloadError,
    DownloadHTTPError,
    DownloadLengthError,
    DownloadTimeout,
)
from tests.support.net import free_port
from tests.support.upstream import Reply, Upstream


@asynccontextmanager
async def raw_server(handler) -> AsyncIterator[str]:
    """A hand-written HTTP server on 127.0.0.1, for misbehaviour http.server cannot do."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def served(tmp_path: Path):
    (tmp_path / "f.bin").write_bytes(b"x" * 200_000)
    (tmp_path / "big.bin").write_bytes(b"y" * 8 * READ_BUFFER)
    with Upstream(tmp_path) as up:
        yield up


@pytest.fixture
async def fetcher() -> AsyncIterator[AiohttpFetcher]:
    f = AiohttpFetcher(connect_timeout=2, read_timeout=0.5, total_timeout=5)
    yield f
    await f.close()


async def test_fetch_and_stream(served: Upstream, fetcher: AiohttpFetcher) -> None:
    assert await fetcher.fetch_bytes(f"{served.url}f.bin", 200_000) == b"x" * 200_000
    size = 8 * READ_BUFFER
    async with fetcher.stream(f"{served.url}big.bin", size) as body:
        assert body.content_length == size
        chunks = [c async for c in body]
    # Streamed as it arrives (never more than a few read buffers at once), each read at least a
    # CHUNK_SIZE (the unit of the read timeout) except where the body ends.
    assert len(chunks) > 1 and sum(map(len, chunks)) == size and b"".join(chunks) == b"y" * size
    assert all(len(c) >= CHUNK_SIZE for c in chunks[:-1]) and max(map(len, chunks)) <= 4 * READ_BUFFER


async def test_length_bound(served: Upstream, fetcher: AiohttpFetcher) -> None:
    with pytest.raises(DownloadLengthError):
        await fetcher.fetch_bytes(f"{served.url}f.bin", 199_999)


async def test_length_bound_without_announced_length(fetcher: AiohttpFetcher) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        try:
            for _ in range(1000):  # 64 MB unless the client hangs up first
                writer.write(b"z" * 65536)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async with raw_server(endless) as url, fetcher.stream(url, 100_000) as body:
        assert body.content_length is None
        with pytest.raises(DownloadLengthError):
            async for _chunk in body:
                pass


async def test_status_and_redirects_are_errors(served: Upstream, fetcher: AiohttpFetcher) -> None:
    with pytest.raises(DownloadHTTPError) as info:
        await fetcher.fetch_bytes(f"{served.url}missing", 10)
    assert info.value.status == 404
    served.override(r"/moved", lambda _o: Reply(302, b"", {"Location": "http://example.invalid/f.bin"}))
    with pytest.raises(DownloadHTTPError) as info:
        await fetcher.fetch_bytes(f"{served.url}moved", 10)
    assert info.value.status == 302


async def test_unreachable_is_a_download_error(fetcher: AiohttpFetcher) -> None:
    with pytest.raises(DownloadError):
        await fetcher.fetch_bytes(f"http://127.0.0.1:{free_port()}/x", 10)


async def test_slow_drip_times_out(fetcher: AiohttpFetcher) -> None:
    release = asyncio.Event()

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nab")
        await writer.drain()
        await release.wait()  # never sends the rest while the client waits
        writer.close()

    async with raw_server(drip) as url:
        try:
            with pytest.raises(DownloadTimeout):
                await fetcher.fetch_bytes(url, 100)
        finally:
            release.set()


async def test_errors_of_the_callers_body_pass_through(served: Upstream, fetcher: AiohttpFetcher) -> None:
    with pytest.raises(KeyError):
        async with fetcher.stream(f"{served.url}f.bin", 200_000):
            raise KeyError("mine")
