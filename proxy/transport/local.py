"""The fetcher seam over a directory: ``tufproxy serve --repository DIR``.

A signed tree on local disk (written by ``tufproxy repo`` or carried across
an air gap) is as untrusted as any mirror: it goes through the same trust
core and the same store as an HTTP upstream.  This fetcher only turns
``file://`` URLs under the tree's root into bounded chunk streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

from proxy.transport.upstream import ByteStream, DownloadError, DownloadHTTPError, DownloadLengthError, Fetcher

CHUNK_SIZE = 1 << 20


class LocalFetcher(Fetcher):
    """Reads ``file://`` URLs that resolve inside ``root``; a missing file is a 404."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def base_url(self) -> str:
        return self.root.as_uri() + "/"

    def _path(self, url: str) -> Path:
        parts = urlsplit(url)
        if parts.scheme != "file":
            raise DownloadError(url, "not a file:// URL")
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(self.root):
            raise DownloadError(url, "outside the served tree")
        return path

    def stream(self, url: str, max_length: int, start: int = 0) -> AbstractAsyncContextManager[ByteStream]:
        return self._stream(url, max_length, start)

    @asynccontextmanager
    async def _stream(self, url: str, max_length: int, start: int) -> AsyncIterator[ByteStream]:
        path = self._path(url)
        try:
            f = await asyncio.to_thread(open, path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise DownloadHTTPError(url, 404) from None
        except OSError as e:
            raise DownloadError(url, str(e)) from e
        try:
            size = await asyncio.to_thread(lambda: Path(f.name).stat().st_size)
            if size > max_length:
                raise DownloadLengthError(url, max_length, size)
            f.seek(start)
            yield ByteStream(self._chunks(url, f, max_length, start), size - start)
        finally:
            f.close()

    async def _chunks(self, url: str, f, max_length: int, start: int) -> AsyncIterator[bytes]:
        received = start
        while chunk := await asyncio.to_thread(f.read, CHUNK_SIZE):
            received += len(chunk)
            if received > max_length:
                raise DownloadLengthError(url, max_length, received)
            yield chunk
