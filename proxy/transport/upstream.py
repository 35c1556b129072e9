"""The fetcher seam: bounded HTTP downloads from the upstream repository.

The trust core fetches metadata through :class:`Fetcher`, and the proxy
server streams distribution files into its store through the same object,
so both share one transport policy: a length bound on every body, a
connect timeout, a per-chunk read timeout (a slow drip cannot hold a
connection forever), a total timeout, and no redirects (a redirect to
another host would let the upstream pick where our bytes come from).
Every transport failure surfaces as one :class:`DownloadError` subclass.
Nothing here verifies content: that is the trust core's job.
"""

from __future__ import annotations

import asyncio
import ssl
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import aiohttp

from proxy.protocol.errors import Fault
from proxy.transport.credentials import OriginAuth
from proxy.transport.receive import Receiver

# A read waits for at least this much (or the body's end): the unit the read timeout applies to.
CHUNK_SIZE = 64 * 1024
# How much a response buffers before reading from its socket pauses. aiohttp's default (64 KiB)
# pauses and resumes the socket every few reads of a fast body.
READ_BUFFER = 2**18
# A body of at least this announced length is received straight into the reader's buffers
# (proxy.transport.receive): two copies fewer per byte, but its connection is closed after it. Below
# it, the connection kept for the next request is worth more (a new one costs a round trip, over TLS three).
RECEIVE_MIN = 16 * 2**20


class DownloadError(Exception):
    """A download failed at the transport level."""

    reason = "download-error"
    fault = Fault.UPSTREAM

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class DownloadHTTPError(DownloadError):
    """The upstream answered with a status other than 200 (redirects included)."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(url, f"HTTP {status}")
        self.status = status


class DownloadLengthError(DownloadError):
    """The body is longer than the caller's bound; ``actual``: bytes announced or received so far."""

    reason = "length-mismatch"
    fault = Fault.REPOSITORY  # the bound comes from signed metadata or our limit: a longer body is a lie

    def __init__(self, url: str, max_length: int, actual: int) -> None:
        super().__init__(url, f"{actual} bytes or more, at most {max_length} allowed")
        self.max_length = max_length
        self.actual = actual


class DownloadTimeout(DownloadError):
    """Connecting, a chunk, or the whole download took too long."""


class ByteStream:
    """The body of one response, as chunks or into the reader's buffer; ``content_length`` if announced."""

    def __init__(self, chunks: AsyncIterator[bytes], content_length: int | None) -> None:
        self._chunks = chunks
        self.content_length = content_length
        self._rest = memoryview(b"")  # what a readinto did not take of the last chunk

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def readinto(self, view: memoryview) -> int:
        """The next bytes of the body, written into ``view``: at least one, or 0 at its end.

        Raises what iterating would.  Here a chunk is copied in; an upstream's large body is received
        into ``view`` itself (:class:`ResponseBody`)."""
        if not self._rest:
            chunk = await anext(self._chunks, b"")
            if not chunk:
                return 0
            self._rest = memoryview(chunk)
        n = min(len(view), len(self._rest))
        view[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


class ResponseBody(ByteStream):
    """An aiohttp response's body; one of :data:`RECEIVE_MIN` bytes or more is taken over on its first
    :meth:`readinto` by a :class:`~proxy.transport.receive.Receiver` (read timeout and deadline still apply)."""

    def __init__(self, fetcher: AiohttpFetcher, url: str, response: aiohttp.ClientResponse, max_length: int,
                 start: int, skip: int, deadline: float | None) -> None:
        super().__init__(fetcher._chunks(url, response, max_length, start, skip), response.content_length)
        self._url = url
        self._response = response
        self._read_timeout = fetcher.read_timeout
        self._deadline = deadline
        headers = response.headers
        # As aiohttp would deliver it: not compressed, not chunked, not continued from a byte we must drop.
        self._receivable = (not skip and (response.content_length or 0) >= RECEIVE_MIN
                            and headers.get("Content-Encoding", "identity") == "identity"
                            and "Transfer-Encoding" not in headers)
        self._receiver: Receiver | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        self._receivable = False  # read through aiohttp once iterated: the receiver would not know what was
        return super().__aiter__()

    async def readinto(self, view: memoryview) -> int:
        if self._receiver is None and (not self._receivable or self._response.connection is None):
            # No connection: aiohttp had the whole body already (and released the connection at its end).
            self._receivable = False
            return await super().readinto(view)
        wait = self._read_timeout
        if self._deadline is not None:
            wait = min(wait, self._deadline - asyncio.get_running_loop().time())
        try:
            if self._receiver is None:
                self._receiver = Receiver(self._response)
            async with asyncio.timeout(wait):
                return await self._receiver.readinto(view)
        except TimeoutError as e:
            raise DownloadTimeout(self._url, "timed out reading") from e
        except (aiohttp.ClientError, OSError) as e:
            raise DownloadError(self._url, f"{type(e).__name__}: {e}") from e


class Fetcher(ABC):
    """Where the trust core and the store get upstream bytes from."""

    @abstractmethod
    def stream(self, url: str, max_length: int, start: int = 0) -> AbstractAsyncContextManager[ByteStream]:
        """``async with fetcher.stream(url, n) as body: async for chunk in body``.

        Raises :class:`DownloadError` (on entry or while iterating) when the
        transport fails or the body exceeds ``max_length`` bytes.  With
        ``start``, the chunks are the body from that offset on (a resumed
        download); ``max_length`` still bounds the whole body.
        """

    async def fetch_bytes(self, url: str, max_length: int) -> bytes:
        """The whole body of ``url``, at most ``max_length`` bytes."""
        parts: list[bytes] = []
        async with self.stream(url, max_length) as body:
            async for chunk in body:
                parts.append(chunk)
        return b"".join(parts)

    async def close(self) -> None:
        """Release connections this fetcher owns."""


class AiohttpFetcher(Fetcher):
    """:class:`Fetcher` over an ``aiohttp`` session (its own unless given one)."""

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        total_timeout: float | None = 600.0,
        per_host: int = 0,
        auth: OriginAuth | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._session = session
        # Credentials by origin (sent to their own origin only) and the TLS context (private CA, client cert).
        self.auth = auth
        self.ssl_context = ssl_context
        self._owns_session = session is None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout
        # Connections per mirror (0: aiohttp's overall limit only). One fetcher per
        # purpose gives metadata a pool that file downloads cannot exhaust.
        self.per_host = per_host

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=self.per_host, ssl=self.ssl_context if self.ssl_context is not None else True),
                                                  read_bufsize=READ_BUFFER)
            self._owns_session = True
        return self._session

    def _credentials(self, url: str) -> dict[str, str]:
        """The ``Authorization`` header for ``url``'s origin, if we hold its credentials (only to that origin)."""
        return self.auth.headers(url) if self.auth else {}

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def stream(self, url: str, max_length: int, start: int = 0) -> AbstractAsyncContextManager[ByteStream]:
        return self._stream(url, max_length, start)

    @asynccontextmanager
    async def _stream(self, url: str, max_length: int, start: int) -> AsyncIterator[ByteStream]:
        timeout = aiohttp.ClientTimeout(
            total=self.total_timeout,
            sock_connect=self.connect_timeout,
            sock_read=self.read_timeout,
        )
        deadline = asyncio.get_running_loop().time() + self.total_timeout if self.total_timeout is not None else None
        try:
            # sock_read restarts on every byte: a header drip must not outlast this.
            async with asyncio.timeout(self.connect_timeout + self.read_timeout):
                response = await self._get_session().get(
                    url, allow_redirects=False, timeout=timeout,
                    headers=({"Range": f"bytes={start}-"} if start else {}) | self._credentials(url),
                )
        except (TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise DownloadTimeout(url, f"timed out ({type(e).__name__})") from e
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise DownloadError(url, f"{type(e).__name__}: {e}") from e
        # Only the request above is translated here: whatever the caller's
        # body raises must pass through unchanged.
        try:
            skip = _resumed_at(url, response, start)
            announced = response.content_length
            if announced is not None and start - skip + announced > max_length:
                raise DownloadLengthError(url, max_length, start - skip + announced)
            yield ResponseBody(self, url, response, max_length, start, skip, deadline)
        finally:
            response.release()

    async def _chunks(
        self, url: str, response: aiohttp.ClientResponse, max_length: int, start: int, skip: int
    ) -> AsyncIterator[bytes]:
        received = start - skip
        try:
            while True:
                # A whole chunk (or the end of the body) within read_timeout: a
                # drip of a byte per second, which resets sock_read each time,
                # fails here instead of holding the download for total_timeout.
                async with asyncio.timeout(self.read_timeout):
                    chunk = await _read_chunk(response.content)
                if not chunk:
                    return
                received += len(chunk)
                if received > max_length:
                    raise DownloadLengthError(url, max_length, received)
                if skip:
                    # A mirror that ignored Range: drop what we have from the one before.
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                    if not chunk:
                        continue
                yield chunk
        except DownloadError:
            raise
        except (TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise DownloadTimeout(url, f"timed out reading ({type(e).__name__})") from e
        except (aiohttp.ClientError, OSError) as e:
            raise DownloadError(url, f"{type(e).__name__}: {e}") from e


def _resumed_at(url: str, response: aiohttp.ClientResponse, start: int) -> int:
    """How many leading bytes of this body to drop so it continues at ``start``."""
    if response.status == 200:
        return start
    if start and response.status == 206:
        unit, _, rest = response.headers.get("Content-Range", "").partition(" ")
        first = rest.partition("-")[0]
        if unit == "bytes" and first.isdigit() and int(first) == start:
            return 0
        raise DownloadError(url, f"asked for bytes from {start}, got Content-Range {rest[:60]!r}")
    raise DownloadHTTPError(url, response.status)


async def _read_chunk(content: aiohttp.StreamReader) -> bytes:
    """What the response buffered, at least CHUNK_SIZE bytes (fewer only where the body ends).

    Buffered pieces are taken whole rather than cut to a size: a fast body
    then costs one copy and one trip through the loop per socket read.
    """
    data = await content.readany()
    if not data or len(data) >= CHUNK_SIZE:
        return data
    parts, n = [data], len(data)
    while n < CHUNK_SIZE and (data := await content.readany()):
        parts.append(data)
        n += len(data)
    return b"".join(parts)


async def read_whole(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body of ``response``, or None if it is (or says it is) longer than ``limit`` bytes.

    ``StreamReader.read(n)`` returns what is buffered, not ``n`` bytes: a body that arrives in pieces is
    read here to its end."""
    if (response.content_length or 0) > limit:
        return None
    parts, size = [], 0
    while chunk := await response.content.read(CHUNK_SIZE):
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
