"""A follower replica's publish requests, forwarded to the leader (``--leader-lease``).

Only the leader signs and pushes, so a follower asked to publish a project
passes the request (with its ``Authorization`` header) to the URL the
leader wrote into the lease, and answers with the leader's status, body
and ``Server-Timing`` (where the leader's publish spent its time, read
with :func:`proxy.util.timing.parse`'s bounds): the leader answers once
the batch is signed and pushed to the bucket.  With no leader known, or the leader not answering, the follower
publishes locally (it is pushed if this replica becomes leader).
"""

from __future__ import annotations

import logging

import aiohttp

from proxy.protocol.layout import MAX_PUBLISH_ANSWER
from proxy.storage.leader import LeaderLease
from proxy.transport.upstream import read_whole
from proxy.util import timing

log = logging.getLogger(__name__)


class Forwarder:
    def __init__(self, lease: LeaderLease, timeout: float) -> None:
        self.lease = lease
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def publish(self, path: str, authorization: str | None) -> tuple[int, bytes, timing.Phases] | None:
        """The leader's (status, JSON body, Server-Timing phases), or None to publish here (this replica leads,
        or no leader answers)."""
        url = self.lease.leader_url
        if self.lease.leader or not url or url.rstrip("/") == self.lease.url.rstrip("/"):
            return None
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        headers = {"Authorization": authorization} if authorization else {}
        try:
            async with self._session.post(url.rstrip("/") + path, headers=headers) as r:
                body = await read_whole(r, MAX_PUBLISH_ANSWER)
                if body is None:
                    raise aiohttp.ClientPayloadError(f"an answer over {MAX_PUBLISH_ANSWER} bytes")
                return r.status, body, timing.parse(r.headers.get("Server-Timing"))
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("the leader %s did not answer a forwarded %s (%s): publishing here", url, path, e)
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
