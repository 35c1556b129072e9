"""Two tiers: the local disk store in front of a bucket shared by every replica.

:class:`SharedTier` decides how a cold file (missing from the local
:class:`~proxy.storage.store.BlobStore`) is obtained when a bucket is configured:

* blobs live in the bucket content-addressed, ``blobs/<aa>/<sha256>``;
* a blob in the bucket is read through the one fetch-and-verify as the
  first "mirror", with the upstream mirrors after it: its bytes stream
  into the local tier and to clients exactly like upstream bytes (final
  byte held back) and are checked against the same signed hashes.  An
  object that does not verify is refused and audited like a lying
  mirror, the body starts over from upstream, and the bad object is
  replaced; a missing one is a 404 the fetch moves past;
* a blob nobody has stored yet is fetched upstream by ONE replica: it
  creates ``leases/<sha256>`` with a conditional PUT (``If-None-Match:
  *``); the others wait until the blob appears or the lease is released
  or stale, then read it from the bucket.  They wait at most ``wait``
  seconds, so their clients see a first byte well within their read
  timeouts: a holder still fetching after that (a big file, a slow
  upstream) is not waited for, and the waiter fetches upstream itself,
  verified and conditionally published like the holder's (the fleet then
  fetched that file twice);
* the fetcher publishes the verified file with a single conditional PUT
  (no multipart), so an object appears whole or not at all: a replica
  killed mid-upload leaves at most a lease, which goes stale.

Signed pages live in the bucket under their signed digest,
``pages/<alg>/<digest>``, and are read the same way (the bucket first,
refused and audited if they do not verify, replaced), without a lease.

The local tiers only ever receive bytes that passed the check (the store's
writer publishes after the fetch verified them; the page cache is filled
by the caller with the verified bytes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.protocol.errors import RepositoryError
from proxy.storage.store import Blob
from proxy.transport.bucket import Bucket, BucketUnavailable
from proxy.trust.fetch import Observer, Want

log = logging.getLogger(__name__)
# A waiter polls the bucket this often at first, backing off to the maximum.
_POLL_FIRST, _POLL_MAX = 0.05, 1.0
T = TypeVar("T", Blob, bytes)
Fetch = Callable[[list[str], Observer], Awaitable[T]]


def blob_key(sha256: str) -> str:
    return f"blobs/{sha256[:2]}/{sha256}"


class _BucketFirst(Observer):
    """The caller's observer, with the bucket as mirror 0 in front of its mirrors.

    Upstream attempts reach the caller renumbered as before; a refusal of
    the bucket's object is reported (audited) and remembered so it is replaced.
    """

    def __init__(self, inner: Observer, bucket_url: str) -> None:
        self.inner = inner
        self.bucket_url = bucket_url
        self.from_bucket = False
        self.tampered = False

    def attempt(self, mirror: int, outcome: str, nbytes: int, seconds: float) -> None:
        if mirror == 0:
            self.from_bucket = outcome == "ok"
            return
        self.inner.attempt(mirror - 1, outcome, nbytes, seconds)

    def refused(self, error: RepositoryError, url: str) -> None:
        if url == self.bucket_url:
            self.tampered = True
            log.error("object %s in the bucket failed verification (%s): refetching from upstream",
                      url, error.reason)
        self.inner.refused(error, url)


class SharedTier:
    """The bucket behind the local store; see the module docstring."""

    def __init__(self, bucket: Bucket, lease_seconds: float = 300.0, wait: float = 5.0) -> None:
        self.bucket = bucket
        self.lease_seconds = lease_seconds
        self.wait = wait

    async def fetch(self, want: Want, urls: list[str], observer: Observer, fetch: Fetch[Blob]) -> Blob:
        """The verified blob of ``want``: from the bucket, or fetched upstream by one replica and published."""
        sha256 = want.hashes.get("sha256")
        if sha256 is None:
            return await fetch(urls, observer)  # not content-addressed by a signed sha256: no bucket
        key = blob_key(sha256)
        lease = f"leases/{sha256}"
        deadline = time.monotonic() + self.wait
        while True:
            if await self.bucket.exists(key):
                return await self._from_bucket(key, urls, observer, fetch)
            if await self.bucket.create(lease, self._lease_body()):
                break
            if not await self._wait(key, lease, deadline):
                log.info("another replica is still fetching %s after %.1fs: fetching it too", key, self.wait)
                return await self._upstream(key, urls, observer, fetch)
        try:
            if await self.bucket.exists(key):  # published between our look and our lease
                return await self._from_bucket(key, urls, observer, fetch)
            return await self._upstream(key, urls, observer, fetch)
        finally:
            await _quietly(self.bucket.delete(lease))

    async def _upstream(self, key: str, urls: list[str], observer: Observer, fetch: Fetch[Blob]) -> Blob:
        blob = await fetch(urls, observer)
        await self._publish(key, blob)
        return blob

    async def page(self, algorithm: str, digest: str, urls: list[str], observer: Observer,
                   fetch: Fetch[bytes]) -> bytes:
        """A signed page's verified bytes: the bucket's copy, else upstream's (then published for the fleet)."""
        return await self._from_bucket(f"pages/{algorithm}/{digest}", urls, observer, fetch)

    async def _from_bucket(self, key: str, urls: list[str], observer: Observer, fetch: Fetch[T]) -> T:
        watch = _BucketFirst(observer, self.bucket.key_url(key))
        try:
            got = await fetch([watch.bucket_url, *urls], watch)
        finally:
            if watch.tampered:  # gone even if upstream failed too: the next reader does not start from it
                await _quietly(self.bucket.delete(key))
        if not watch.from_bucket:
            await self._publish(key, got)
        return got

    async def _publish(self, key: str, got: Blob | bytes) -> None:
        """Put a verified file or page in the bucket, once: an object there already is left alone (it is read verified)."""
        if not await self.bucket.create(key, got.path if isinstance(got, Blob) else got):
            log.debug("bucket already holds %s", key)

    def _lease_body(self) -> bytes:
        return json.dumps({"until": time.time() + self.lease_seconds}).encode()

    async def _wait(self, key: str, lease: str, deadline: float) -> bool:
        """Until the blob appears or the lease is gone (released, or stale and removed here): True;
        False if the holder is still at it at ``deadline``."""
        delay = _POLL_FIRST
        while True:
            if await self.bucket.exists(key):
                return True
            body = await self.bucket.read(lease)
            if body is None:
                return True
            if _lease_until(body) < time.time():
                log.warning("lease %s is stale (its holder died?): taking over", lease)
                await self.bucket.delete(lease)
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(left, delay * (0.5 + random.random())))
            delay = min(_POLL_MAX, delay * 2)

    async def probe(self) -> None:
        await self.bucket.probe()


def _lease_until(body: bytes) -> float:
    try:
        return float(json.loads(body)["until"])
    except (ValueError, KeyError, TypeError):
        return 0.0  # unreadable: treat as stale


async def _quietly(call: Awaitable[None]) -> None:
    """A clean-up the request need not wait on if the bucket is down (a lease then goes stale)."""
    try:
        await call
    except BucketUnavailable as e:
        log.warning("%s", e)
