"""The aiohttp middleware that applies a :class:`~proxy.serving.guard.Guard` to every request.

The listener says, per request, what is asked (:data:`Resource`): None for
what anyone may ask (``/healthz``, ``/readyz``), else the project (None:
the repository as a whole), whether it is a publish, and whether it is
private.  A refusal is answered here with its status, ``X-Tufproxy-Reason``,
``WWW-Authenticate`` on a 401, one audit record and one count in
``tufproxy_access_refusals_total{reason}``; the request's user is left in
``request[USER]`` for the handler.  Password checks run in threads, a
few at a time, so bcrypt never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from proxy.serving.guard import BAD_CREDENTIALS, Guard, Pending, Refusal, User
from proxy.storage.audit import AuditLog, AuditWriteError

log = logging.getLogger(__name__)
# Where the middleware leaves the authorized user for the handler (typed: aiohttp's request storage keys).
USER = web.RequestKey("user", User)
# Concurrent password checks: each is a few ms of one core by design; more only queue.
CHECKS = 4


class Resource(NamedTuple):
    project: str | None
    publish: bool = False
    private: bool = False


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusals_counter(registry: CollectorRegistry) -> Counter:
    return Counter("tufproxy_access_refusals_total", "Requests refused by access control, by reason "
                   "(unauthenticated, forbidden, throttled, bad-credentials)", ["reason"], registry=registry)


def respond(refusal: Refusal) -> web.Response:
    return web.Response(status=refusal.status, reason=refusal.message, text=refusal.message + "\n",
                        headers=refusal.headers())


class AccessMiddleware:
    """``app = web.Application(middlewares=[AccessMiddleware(...).middleware, ...])``."""

    def __init__(self, guard: Guard, resource: Callable[[web.Request], Resource | None], audit: AuditLog,
                 counter: Counter) -> None:
        self.guard = guard
        self.resource = resource
        self.audit = audit
        self.counter = counter
        self._checks = asyncio.Semaphore(CHECKS)

    async def user(self, request: web.Request) -> User | Refusal:
        """Who the request is (anonymous without credentials), or why it is refused."""
        headers = request.headers.getall("Authorization", [])
        if len(headers) > 1:
            return Refusal(BAD_CREDENTIALS, "more than one Authorization header")
        found = self.guard.identify(headers[0] if headers else None, request.remote or "")
        if isinstance(found, Pending):
            async with self._checks:
                found = await asyncio.to_thread(self.guard.verify, found)
        return found

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        asked = self.resource(request)
        if asked is None:
            return await handler(request)
        found = await self.user(request)
        if isinstance(found, User):
            refusal = self.guard.authorize(found, asked.project, publish=asked.publish, private=asked.private)
            if refusal is None:
                request[USER] = found
                return await handler(request)
            found = refusal
        return self.refuse(request, found)

    def refuse(self, request: web.Request, refusal: Refusal) -> web.Response:
        self.counter.labels(refusal.reason).inc()
        # The path only (a query could carry anything); a user only once its password was right.
        fields = {"reason": refusal.reason, "target": request.rel_url.path[:300], "client": request.remote,
                  "detail": refusal.message}
        if refusal.user is not None:
            fields["user"] = refusal.user
        try:
            self.audit.refused(**fields)
        except AuditWriteError as e:
            log.error("%s", e)
            return web.Response(status=500, text="audit log unwritable\n")
        log.info("%s %s -> %d %s", request.method, request.rel_url.path[:300], refusal.status, refusal.reason)
        return respond(refusal)
