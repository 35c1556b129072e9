"""HTTP to a plain index: TLS verified, credentials kept to their host, redirects bounded.

An index URL may carry ``user:password@``; otherwise ``~/.netrc`` (or
``$NETRC``) is asked for its host.  Credentials are sent only to the
origin they belong to and never appear in a URL this module returns, so
they cannot reach a log line, an audit record or a metric label.
Redirects are followed by hand, at most ``max_redirects``, and only to an
origin the caller allows; anything else is a refusal, not a fetch.
Bodies are bounded and timed exactly as :class:`~proxy.transport.upstream.AiohttpFetcher`
bounds an upstream's (its body reader is reused), and :meth:`IndexHTTP.stream`
makes it the :class:`~proxy.transport.upstream.Fetcher` that the one fetch-and-verify
(:func:`proxy.trust.fetch.fetch_verified`) streams pinned files with, into
the indexes' own origins and the ``files_origins`` only.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import aiohttp

from proxy.protocol.errors import Fault
from proxy.transport.credentials import OriginAuth, origin
from proxy.transport.upstream import (
    AiohttpFetcher,
    ByteStream,
    DownloadError,
    DownloadHTTPError,
    DownloadLengthError,
    DownloadTimeout,
    ResponseBody,
)

_REDIRECTS = (301, 302, 303, 307, 308)


class RedirectRefused(DownloadError):
    """A redirect to an origin we may not fetch from, or one too many."""

    reason = "bad-redirect"
    fault = Fault.REPOSITORY


@dataclass(frozen=True)
class Response:
    """A 200 answer: where it finally came from, its type, its bounded body (or a 304 to a conditional GET)."""

    url: str
    content_type: str
    body: ByteStream
    status: int = 200
    validators: Mapping[str, str] = field(default_factory=dict)  # ETag and Last-Modified, for the next conditional GET


class IndexHTTP(AiohttpFetcher):
    """GETs against indexes and their file hosts; see the module docstring."""

    def __init__(self, index_urls: Iterable[str], *, files_origins: Iterable[str] = (), ca_bundle: Path | None = None,
                 max_redirects: int = 5, connect_timeout: float = 10.0, read_timeout: float = 30.0) -> None:
        auth = OriginAuth()
        super().__init__(connect_timeout=connect_timeout, read_timeout=read_timeout, auth=auth)
        self.max_redirects = max_redirects
        self._ssl = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
        self.index_urls = auth.add_all(index_urls)
        self.files_origins = tuple(files_origins)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl), trust_env=False)
            self._owns_session = True
        return self._session

    def stream(self, url: str, max_length: int, start: int = 0) -> AbstractAsyncContextManager[ByteStream]:
        """A file's body from an index or a files origin (each file has one source: never resumed)."""
        if start:
            raise DownloadError(url, "resuming a body is not supported by the gateway's index client")
        return self._file_body(url, max_length)

    @asynccontextmanager
    async def _file_body(self, url: str, max_length: int) -> AsyncIterator[ByteStream]:
        # No overall deadline: a big file's pace is bounded by the fetch's stall and minimum rate instead.
        async with self.get(url, max_length, (*self.index_urls, *self.files_origins), total=None) as response:
            yield response.body

    @asynccontextmanager
    async def get(self, url: str, max_length: int, allowed: Iterable[str], accept: str | None = None,
                  total: float | None = 600.0, conditional: Mapping[str, str] | None = None) -> AsyncIterator[Response]:
        """GET ``url`` (a URL without credentials) following redirects into ``allowed`` origins only, within ``total`` seconds.

        With ``conditional`` (the ``validators`` of an earlier answer), a 304 is answered with status 304 and no body.
        """
        allowed_origins = {origin(a) for a in allowed}
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=self.connect_timeout, sock_read=self.read_timeout)
        deadline = asyncio.get_running_loop().time() + total if total is not None else None
        accepting = {"Accept": accept} if accept else {}
        for name, header in (("ETag", "If-None-Match"), ("Last-Modified", "If-Modified-Since")):
            if conditional and conditional.get(name):
                accepting[header] = conditional[name]
        for _ in range(self.max_redirects + 1):
            if origin(url) not in allowed_origins:
                raise RedirectRefused(url, "redirected to an origin that is not allowed")
            try:
                async with asyncio.timeout(self.connect_timeout + self.read_timeout):
                    response = await self._get_session().get(
                        url, allow_redirects=False, timeout=timeout, headers=accepting | self._credentials(url))
            except (TimeoutError, aiohttp.ServerTimeoutError) as e:
                raise DownloadTimeout(url, f"timed out ({type(e).__name__})") from e
            except (aiohttp.ClientError, OSError, ValueError) as e:
                raise DownloadError(url, f"{type(e).__name__}: {e}") from e
            try:
                if response.status in _REDIRECTS and "Location" in response.headers:
                    url = urljoin(url, response.headers["Location"])
                    continue
                validators = {k: response.headers[k] for k in ("ETag", "Last-Modified") if k in response.headers}
                if response.status == 304 and conditional:
                    yield Response(url, "", ByteStream(_nothing(), 0), 304, validators or dict(conditional))
                    return
                if response.status != 200:
                    raise DownloadHTTPError(url, response.status)
                if response.content_length is not None and response.content_length > max_length:
                    raise DownloadLengthError(url, max_length, response.content_length)
                yield Response(url, response.headers.get("Content-Type", ""),
                               ResponseBody(self, url, response, max_length, 0, 0, deadline), validators=validators)
                return
            finally:
                response.release()
        raise RedirectRefused(url, f"more than {self.max_redirects} redirects")


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing
