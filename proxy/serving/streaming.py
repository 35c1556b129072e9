"""Sending a download in flight to an HTTP client, the final byte held back until it is verified.

Both the edge (:mod:`proxy.serving.server`) and the gateway (:mod:`proxy.gateway.files`)
stream a cold file to every request that wants it from one
:class:`~proxy.storage.downloads.Download`: the bytes are read from its temp file
as they arrive (``available``; in another worker, from the fetching
worker's file, hashed there first), and the last one is sent only once
the download's ``result`` is a verified blob.  If the body starts over
(``generation``) after bytes went out, or the download is refused, the
connection is reset, so no client ever holds a complete file that was
not verified.  The response head goes out with the first bytes: a refusal
before then is answered with its status instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from proxy.protocol.errors import Unsent
from proxy.storage.downloads import Download
from proxy.storage.store import Blob

# Streamed files go out in pieces of at most this much where sendfile is not available.
SEND_CHUNK = 2**20
# A cold file starts streaming once this much arrived, or this long after the request.
STREAM_AFTER = 2**20
STREAM_DELAY = 0.5


async def first_bytes(download: Download, joined: bool) -> BaseException | None:
    """Wait until streaming is worth starting; the download's refusal if it failed first.

    Streaming starts once ``STREAM_AFTER`` bytes arrived or, for the request
    that started the fetch, ``STREAM_DELAY`` passed: a small file is
    usually verified by then and answered whole, so a refusal keeps its
    clear status instead of a reset connection.  Once every byte of an
    exact-length body arrived, only local work is left (the hash, the
    store's publish): streaming would gain nothing and could only turn a
    late refusal into a reset, so it waits for the result.  A request that
    joined a fetch waits for the bytes alone: if that fetch is a slow one
    that gets abandoned, it has sent nothing yet and may get a fresh fetch
    of its own.
    """
    deadline = time.monotonic() + STREAM_DELAY
    while True:
        changed = download.waiter()
        result = download.result
        if result.done():
            return None if result.cancelled() else result.exception()
        whole = download.want.exact and download.available >= download.want.length
        if not whole and (download.available > STREAM_AFTER or (
                not joined and download.available > 1 and time.monotonic() >= deadline)):
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if joined or whole else max(0.0, deadline - time.monotonic()) or None):
                await changed.wait()


async def send_download(request: web.Request, download: Download, headers: Mapping[str, str],
                        length: int | None) -> tuple[web.StreamResponse, Blob | None] | BaseException:
    """Stream ``download`` to the client; the response, and the verified blob (None: the client was reset).

    The head goes out with the first bytes: a refusal before then is returned instead, for the caller to
    answer with its status.
    """
    response = web.StreamResponse(headers=headers)
    if length is not None:
        response.content_length = length
    sent = 0
    generation = download.generation
    fd, fd_generation = -1, generation
    try:
        while True:
            changed = download.waiter()
            result = download.result
            if download.generation != generation and sent == 0:
                generation = download.generation
            if download.generation != generation or (result.done() and (result.cancelled() or result.exception())):
                if not response.prepared and result.done():
                    return Unsent("the download was cancelled before any byte went out: ask again") \
                        if result.cancelled() else result.exception()  # type: ignore[return-value]
                # The body started over, or did not verify: what this client got must never complete.
                reset(request)
                return response, None
            verified = result.done()
            end = download.available if not verified else result.result().size
            limit = end if verified else end - 1  # the held-back tail
            if sent < limit:
                if fd < 0 or fd_generation != generation:
                    if fd >= 0:
                        os.close(fd)
                    # The download's file (which becomes the blob when published), or the blob.
                    opened, fd_generation = download.open(), generation
                    fd = -1 if opened is None else opened
                    if fd < 0 and verified:
                        try:
                            fd = await asyncio.to_thread(os.open, result.result().path, os.O_RDONLY)
                        except FileNotFoundError:  # evicted already, and nothing sent yet: this client asks again
                            return Unsent("the verified file was evicted before it could be sent: ask again")
                    if fd < 0:
                        await changed.wait()
                        continue
                if not response.prepared:
                    await response.prepare(request)
                n = await _send_range(request, response, fd, sent, limit - sent)
                if not n:
                    reset(request)
                    return response, None
                sent += n
                continue
            if verified:
                break
            await changed.wait()
    finally:
        if fd >= 0:
            os.close(fd)
    if not response.prepared:
        await response.prepare(request)
    await response.write_eof()
    return response, result.result()


async def _send_range(request: web.Request, response: web.StreamResponse, fd: int, offset: int, count: int) -> int:
    """Send up to ``count`` bytes of ``fd`` from ``offset``; how many went out (0: the file is short).

    ``sendfile`` where the loop has it and the body goes out as is (a
    Content-Length, not chunked as a file of unsigned length is): the bytes go from the page cache
    to the socket without a copy through Python or a thread hop per piece.
    """
    transport = request.transport
    if transport is None or transport.is_closing():  # the client left: as aiohttp's own writes say it
        raise ConnectionResetError("connection lost")
    # Over TLS the bytes must pass through the SSL object: asyncio's sendfile then raises RuntimeError
    # (with fallback=False), not SendfileNotAvailableError, so TLS never tries it.
    if response.content_length is not None and transport.get_extra_info("ssl_object") is None:
        with open(fd, "rb", buffering=0, closefd=False) as file:
            with contextlib.suppress(NotImplementedError, asyncio.SendfileNotAvailableError):  # uvloop
                return await asyncio.get_running_loop().sendfile(transport, file, offset, count, fallback=False)
    data = await asyncio.to_thread(os.pread, fd, min(count, SEND_CHUNK), offset)
    if data:
        await response.write(data)
    return len(data)


def over_tls(request: web.Request) -> bool:
    """Whether the request came over TLS (no sendfile then: the bytes pass through the SSL object)."""
    transport = request.transport
    return transport is not None and transport.get_extra_info("ssl_object") is not None


async def send_file_over_tls(request: web.Request, path: Path, size: int, headers: Mapping[str, str]) -> web.StreamResponse:
    """A whole file over TLS, read in :data:`SEND_CHUNK` pieces off the loop and written through the SSL transport.

    Over TLS, aiohttp's FileResponse takes asyncio's sendfile fallback (256 KiB reads, a drain after
    each), much slower than this loop (``bench/results/auth.md`` has both), and that fallback raises
    AttributeError when a client leaves mid-file. Range, conditional and HEAD requests still get FileResponse.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        # FileResponse's validators, so that a client's next If-None-Match or If-Range matches.
        response = web.StreamResponse(headers={**headers, **file_validators(os.fstat(fd)), "Accept-Ranges": "bytes"})
        response.content_length = size
        await response.prepare(request)
        offset = 0
        while offset < size:
            data = await asyncio.to_thread(os.pread, fd, min(SEND_CHUNK, size - offset), offset)
            if not data:  # shorter than it was when the answer began: the client must see a cut transfer
                reset(request)
                return response
            await response.write(data)
            offset += len(data)
    finally:
        os.close(fd)
    await response.write_eof()
    return response


def file_validators(st: os.stat_result) -> dict[str, str]:
    """The ``Etag`` and ``Last-Modified`` aiohttp's ``FileResponse`` derives from a file's stat (its spelling,
    its rounding), for the answers that send a stored file without it."""
    return {"Etag": f'"{st.st_mtime_ns:x}-{st.st_size:x}"',
            "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(math.ceil(st.st_mtime)))}


def reset(request: web.Request) -> None:
    """Abort the connection with a TCP reset: the client sees a broken transfer, never a clean end."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
