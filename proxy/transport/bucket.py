"""The S3 seam: one bucket (S3 or compatible), its errors, its metrics.

:class:`Bucket` is the only place that talks to the object store, through
obstore (Rust ``object_store`` bindings, chosen by measurement:
bench/results/s3client.md; an optional extra, ``tufproxy[s3]``).
Credentials come from the standard AWS chain: the environment, web
identity (IRSA), the shared credentials and config files
(:mod:`proxy.transport.awsprofile`), the ECS container endpoint and the instance
role.  Nothing here logs or formats a credential: errors carry the
operation, the key, where the credentials came from and the error's class
and first line, scrubbed of every key and secret in use.

Nothing read from a bucket is trusted here: :class:`BucketFetcher` hands
objects to the one fetch-and-verify as a mirror like any other, and
callers verify.  A bucket that cannot be reached raises
:class:`BucketUnavailable` (our resources), never a transport error a
caller would fail over from.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from proxy.protocol.errors import Fault, StoreError
from proxy.transport.awsprofile import AwsSettings, ProfileError, resolve
from proxy.transport.upstream import ByteStream, DownloadHTTPError, DownloadLengthError, Fetcher
from proxy.util.metrics import BucketMetrics

_CHUNK = 256 * 1024


class BucketUnavailable(StoreError):
    """The bucket did not answer usably (down, timing out, refusing our credentials)."""

    reason = "bucket-unavailable"


class BucketDenied(BucketUnavailable):
    """The bucket refused our credentials (wrong keys, or not allowed): a configuration error at start-up."""

    reason = "bucket-denied"


class BucketConfigError(ValueError):
    """``--store`` cannot be used as given (bad URL, S3 client not installed)."""

    reason = "bucket-config"
    fault = Fault.OPERATOR


def parse_store_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` -> (bucket, prefix without slashes at the ends)."""
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(/.*)?", url.strip())
    if not m:
        raise BucketConfigError(f"not an s3://BUCKET/PREFIX URL: {url!r}")
    return m.group(1), (m.group(2) or "").strip("/")


class Bucket:
    """One bucket and prefix; every call is timed and counted in ``metrics`` by operation."""

    def __init__(self, url: str, metrics: BucketMetrics, endpoint_url: str | None = None, timeout: float = 30.0) -> None:
        try:
            import obstore
            from obstore.store import S3Store
        except ImportError:
            raise BucketConfigError("--store s3://... needs the S3 client: pip install 'tufproxy[s3]'") from None
        from obstore.exceptions import (
            AlreadyExistsError,
            NotFoundError,
            NotModifiedError,
            PermissionDeniedError,
            PreconditionError,
            UnauthenticatedError,
        )
        self._obstore = obstore
        self._denied = (PermissionDeniedError, UnauthenticatedError)
        # obstore raises the built-in FileNotFoundError/FileExistsError for some calls, its own for others.
        self._missing = (NotFoundError, FileNotFoundError)
        self._taken = (AlreadyExistsError, PreconditionError, FileExistsError)
        self._unchanged = (NotModifiedError,)
        self.name, self.prefix = parse_store_url(url)
        self.url = f"s3://{self.name}/{self.prefix}/" if self.prefix else f"s3://{self.name}/"
        self.metrics = metrics
        try:
            self.aws: AwsSettings = resolve(endpoint_url)
        except ProfileError as e:
            raise BucketConfigError(f"--store {url}: {e}") from None
        kwargs: dict[str, Any] = dict(self.aws.options)
        endpoint = self.aws.endpoint
        if endpoint:
            kwargs["virtual_hosted_style_request"] = False
        try:
            self._store = S3Store(self.name, prefix=self.prefix or None,
                                  client_options={"allow_http": bool(endpoint and endpoint.startswith("http:")),
                                                  "timeout": timedelta(seconds=timeout),
                                                  "connect_timeout": timedelta(seconds=min(timeout, 10.0))},
                                  # Two tries, bounded: a request waits on a down bucket for at most this long.
                                  retry_config={"max_retries": 1, "retry_timeout": timedelta(seconds=timeout)},
                                  **kwargs)
        except Exception as e:  # noqa: BLE001 - obstore raises its own config errors; show them as one line
            raise BucketConfigError(f"--store {url}: {self.scrub(e)}") from None

    def key_url(self, key: str) -> str:
        return self.url + key

    async def exists(self, key: str) -> bool:
        async with self._op("head"):
            try:
                await self._obstore.head_async(self._store, key)
            except self._missing:
                return False
        return True

    async def read(self, key: str) -> bytes | None:
        """A small object's bytes, or None."""
        async with self._op("get") as op:
            try:
                data = bytes(await (await self._obstore.get_async(self._store, key)).bytes_async())
            except self._missing:
                return None
            op.nbytes = len(data)
        return data

    async def create(self, key: str, data: bytes | Path) -> bool:
        """Store ``data`` under ``key`` only if nothing is there (``If-None-Match: *``); False if taken.

        A single PUT (no multipart), so the object appears whole or not at all.
        """
        async with self._op("put") as op:
            try:
                await self._obstore.put_async(self._store, key, data, mode="create", use_multipart=False)
            except self._taken:
                return False
            op.nbytes = data.stat().st_size if isinstance(data, Path) else len(data)
        return True

    async def create_or_same(self, key: str, data: bytes | Path, meta: dict[str, str] | None = None) -> bool:
        """Store ``data`` (with user metadata ``meta``) only if ``key`` is absent, or True if it already holds
        exactly ``data``; False if it holds other bytes."""
        body = data.read_bytes() if isinstance(data, Path) else data
        if await self.put_if(key, body, None, meta) is not None:
            return True
        async with self._op("head"):
            try:
                found = await self._obstore.head_async(self._store, key)
            except self._missing:
                found = None
        if found is None:  # deleted between the two requests: try once more
            return await self.put_if(key, body, None, meta) is not None
        etag = str(found.get("e_tag") or "").strip('"')
        # A single PUT's ETag is the MD5 of its bytes (S3, SeaweedFS, MinIO); other stores' are read and compared.
        if re.fullmatch(r"[0-9a-f]{32}", etag):
            return etag == hashlib.md5(body, usedforsecurity=False).hexdigest()
        return await self.read(key) == body

    async def read_tagged(self, key: str, unless: str | None = None) -> tuple[bytes, str] | None:
        """A small object's bytes and ETag, or None: what a conditional :meth:`put_if` names.

        ``unless``: an ETag the caller holds the bytes of; an object still carrying it is not downloaded
        (``If-None-Match``) and the answer is ``(b"", unless)``, which a caller comparing ETags passes over.
        """
        async with self._op("get") as op:
            try:
                options: Any = {"if_none_match": unless} if unless else None
                result = await self._obstore.get_async(self._store, key, options=options)
                data = bytes(await result.bytes_async())
            except self._missing:
                return None
            except self._unchanged:
                return b"", str(unless)
            op.nbytes = len(data)
        return data, str(result.meta.get("e_tag") or "")

    async def put_if(self, key: str, data: bytes, etag: str | None, meta: dict[str, str] | None = None) -> str | None:
        """Store ``data`` only if ``key`` still has ``etag`` (``If-Match``), or, with None, is absent
        (``If-None-Match: *``); the new ETag, or None if another writer got there first.
        ``meta``: user-defined metadata stored with the object."""
        mode: Any = "create" if etag is None else {"e_tag": etag}
        async with self._op("put") as op:
            try:
                result = await self._obstore.put_async(self._store, key, data, mode=mode, use_multipart=False,
                                                       attributes=meta)
            except (*self._taken, *self._missing):
                return None
            op.nbytes = len(data)
        return str(result["e_tag"] or "")

    async def replace(self, key: str, data: Path | bytes) -> None:
        """Store ``data`` under ``key`` whatever is there; a single PUT, so readers see the old object or the new one."""
        # A file gone meanwhile is the caller's FileNotFoundError, not the bucket's fault.
        size = data.stat().st_size if isinstance(data, Path) else len(data)
        async with self._op("put") as op:
            await self._obstore.put_async(self._store, key, data, use_multipart=False)
            op.nbytes = size

    async def list(self, prefix: str, limit: int = 1000) -> list[tuple[str, str]]:
        """(key, ETag) of the objects whose keys start with ``prefix``, at most ``limit`` of them."""
        found: list[tuple[str, str]] = []
        async with self._op("list"):
            async for batch in self._obstore.list(self._store, prefix=prefix):
                for meta in batch:
                    found.append((str(meta["path"]), str(meta.get("e_tag") or "")))
                    if len(found) >= limit:
                        return found
        return found

    async def inventory(self) -> dict[str, tuple[int, str]]:
        """Every object's key, size and ETag (a paged LIST of the whole prefix: what a pusher holds at start-up)."""
        found: dict[str, tuple[int, str]] = {}
        async with self._op("list"):
            async for batch in self._obstore.list(self._store):
                for meta in batch:
                    found[str(meta["path"])] = (int(meta["size"]), str(meta.get("e_tag") or "").strip('"'))
        return found

    async def delete(self, key: str) -> None:
        async with self._op("delete"):
            try:
                await self._obstore.delete_async(self._store, key)
            except self._missing:
                pass

    async def probe(self) -> None:
        """One cheap request; :class:`BucketUnavailable` if the bucket does not answer (for /readyz),
        :class:`BucketDenied` if it refuses our credentials."""
        await self.exists("readyz-probe")

    def scrub(self, error: BaseException) -> str:
        """An error's first line, bounded, with every key and secret in use cut out."""
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        for secret in self.aws.secrets:
            text = text.replace(secret, "<redacted>")
        return text[:300]

    def stream(self, key: str, max_length: int) -> AbstractAsyncContextManager[ByteStream]:
        return self._stream(key, max_length)

    @asynccontextmanager
    async def _stream(self, key: str, max_length: int) -> AsyncIterator[ByteStream]:
        # Only the bucket's own failures become BucketUnavailable: what the reader raises
        # inside the block (a refusal, a timeout) passes through untouched.
        op = self._op("get")
        op.deferred = True
        try:
            async with op:
                try:
                    result = await self._obstore.get_async(self._store, key)
                except self._missing:
                    raise DownloadHTTPError(self.key_url(key), 404) from None
            size = int(result.meta["size"])
            if size > max_length:
                raise DownloadLengthError(self.key_url(key), max_length, size)
            yield ByteStream(self._chunks(result, op), size)
        finally:
            op.record()

    async def _chunks(self, result: Any, op: _Op) -> AsyncIterator[bytes]:
        stream = result.stream(min_chunk_size=_CHUNK)
        while True:
            try:
                chunk = await anext(stream)
            except StopAsyncIteration:
                return
            except Exception as e:  # noqa: BLE001 - obstore's transport errors mid-body
                raise op.failed(e) from None
            op.nbytes += len(chunk)
            yield bytes(chunk)

    def _op(self, name: str) -> _Op:
        return _Op(self, name)


class _Op:
    """Times and counts one bucket call; turns the client's errors into :class:`BucketUnavailable`.

    "Not found" and "already exists" are answers, not failures: callers
    catch them inside the block.
    """

    def __init__(self, bucket: Bucket, name: str) -> None:
        self.bucket = bucket
        self.name = name
        self.nbytes = 0
        self.began = time.monotonic()
        self._recorded = False
        self.deferred = False  # a streamed body: recorded when the stream closes

    def failed(self, e: BaseException) -> BucketUnavailable:
        self.bucket.metrics.errors.labels(self.name).inc()
        b = self.bucket
        if isinstance(e, b._denied):
            return BucketDenied(f"bucket {b.url} refused the credentials of {b.aws.source} ({self.name}): {b.scrub(e)}")
        return BucketUnavailable(f"bucket {b.url} {self.name}: {type(e).__name__}: {b.scrub(e)}")

    def record(self) -> None:
        if self._recorded:
            return
        self._recorded = True
        m = self.bucket.metrics
        m.requests.labels(self.name).inc()
        m.seconds.labels(self.name).observe(time.monotonic() - self.began)
        if self.nbytes:
            m.bytes.labels(self.name).inc(self.nbytes)

    def __enter__(self) -> _Op:
        return self

    def __exit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        if not self.deferred or exc is not None:
            self.record()
        if isinstance(exc, Exception) and not isinstance(exc, (BucketUnavailable, DownloadHTTPError)):
            raise self.failed(exc) from None

    async def __aenter__(self) -> _Op:
        return self

    async def __aexit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(t, exc, tb)


class BucketFetcher(Fetcher):
    """A fetcher that reads the bucket's URLs from the bucket and hands every other URL on.

    So an object in the bucket is read by the one fetch-and-verify exactly
    like an upstream mirror's body, and checked against the same signed hashes.
    """

    def __init__(self, bucket: Bucket, upstream: Fetcher) -> None:
        self.bucket = bucket
        self.upstream = upstream

    def stream(self, url: str, max_length: int, start: int = 0) -> AbstractAsyncContextManager[ByteStream]:
        if url.startswith(self.bucket.url):
            # The bucket's errors are never failed over (it is ours): start>0 does not happen.
            return self.bucket.stream(url[len(self.bucket.url):], max_length)
        return self.upstream.stream(url, max_length, start) if start else self.upstream.stream(url, max_length)

    async def close(self) -> None:
        await self.upstream.close()
