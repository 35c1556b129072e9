"""Files the gateway has pinned but not fetched yet: streamed, checked, then published.

A request for ``/packages/<p>/<file>`` (or its ``.metadata``) that is not
in ``DIR/public`` yet is answered from the index while the bytes arrive:
each chunk is hashed (the one check, :class:`StreamingVerifier`, against
the pin's hashes and, where known, its exact size) and written to a temp
file, and sent to the client one chunk behind.  Only when the whole body
matched is the temp file renamed into the tree and the last chunk sent;
on a mismatch the client's connection is reset before its last byte, the
temp file is dropped, and the refusal is audited and counted.  So a cold
big wheel flows to pip at the index's pace, and no complete unverified
file ever leaves the gateway or lands in its tree.

One fetch per file at a time: a second request for a file in flight waits
for it and is then served from the tree (streaming one body to several
clients is left for later).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from aiohttp import web

from proxy.audit import AuditLog
from proxy.gateway.indexhttp import IndexHTTP, origin
from proxy.gateway.ledger import Ledger, Pin
from proxy.gateway.metrics import GatewayMetrics
from proxy.layout import core_metadata_target, file_target
from proxy.trust.errors import RepositoryError
from proxy.trust.hashing import StreamingVerifier
from proxy.upstream import DownloadError

log = logging.getLogger(__name__)
MAX_CORE_METADATA = 16 * 2**20


class FileSource:
    """Streams pinned files into ``public_dir``; see the module docstring."""

    def __init__(self, public_dir: Path, ledger: Ledger, http: IndexHTTP, audit: AuditLog, metrics: GatewayMetrics,
                 files_origins: tuple[str, ...], max_file_size: int) -> None:
        self.public_dir = public_dir
        self.ledger = ledger
        self.http = http
        self.audit = audit
        self.metrics = metrics
        self.files_origins = files_origins
        self.max_file_size = max_file_size
        self._inflight: dict[str, asyncio.Event] = {}

    async def serve(self, request: web.Request, project: str, filename: str, core: bool) -> web.StreamResponse:
        target = core_metadata_target(project, filename) if core else file_target(project, filename)
        path = self.public_dir / target
        self.ledger.reload()  # a revocation from 'tufproxy gateway revoke' applies at once
        pin = self.ledger.pins.get((project, filename))
        if pin is None or self.ledger.is_revoked(project, filename):
            raise web.HTTPNotFound(reason="not published by this gateway")
        while target in self._inflight:
            await self._inflight[target].wait()
        if path.is_file():
            return web.FileResponse(path)
        done = self._inflight[target] = asyncio.Event()
        try:
            return await self._fetch(request, pin, target, path, core)
        finally:
            del self._inflight[target]
            done.set()

    async def _fetch(self, request: web.Request, pin: Pin, target: str, path: Path, core: bool) -> web.StreamResponse:
        if core:
            if not pin.core_metadata:
                raise web.HTTPNotFound(reason="no core metadata published for this file")
            hashes, length, exact, url = pin.core_metadata, MAX_CORE_METADATA, False, pin.url + ".metadata"
        else:
            exact = pin.size is not None
            hashes, length, url = pin.hashes, pin.size if pin.size is not None else self.max_file_size, pin.url
        verifier = StreamingVerifier(target, hashes, length, exact=exact, role=f"gateway pin from {pin.index}")
        allowed = (origin(pin.index), *self.files_origins)
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        if exact:
            response.content_length = length
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(tmp, "wb") as out:
                async with self.http.get(url, length, allowed) as upstream:
                    await response.prepare(request)
                    held = b""
                    async for chunk in upstream.body:
                        verifier.update(chunk)
                        out.write(chunk)
                        if held:
                            await response.write(held)
                        held = chunk
                verifier.finish()
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except RepositoryError as e:
            self._refused(request, e.reason, str(e), url, target, e.expected, e.actual)
            return self._abort(request, response, e.reason, str(e))
        except DownloadError as e:
            self._refused(request, "upstream-unreachable", str(e), url, target)
            return self._abort(request, response, "upstream-unreachable", str(e))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self.metrics.files.labels("ok").inc()
        self.metrics.file_bytes.inc(verifier.received)
        await response.write(held)
        await response.write_eof()
        return response

    def _refused(self, request: web.Request, reason: str, message: str, url: str, target: str,
                 expected: object = None, actual: object = None) -> None:
        log.warning("refused %s: %s", target, message)
        self.metrics.files.labels("refused").inc()
        self.metrics.refusals.labels(reason).inc()
        self.audit.refused(reason=reason, target=target, upstream_url=url, client=request.remote,
                           request_path=request.path, expected=expected, actual=actual, detail=message)

    @staticmethod
    def _abort(request: web.Request, response: web.StreamResponse, reason: str, message: str) -> web.StreamResponse:
        if response.prepared:
            # Some bytes are out: reset, so the client never holds the last one.
            if request.transport is not None:
                request.transport.abort()
            return response
        raise web.HTTPBadGateway(reason=f"refused by the gateway ({reason})", text=f"{message}\n")
