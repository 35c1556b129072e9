"""The edge's half of the miss protocol: ask the gateway to publish, then trust what it signed.

``tufproxy serve`` in front of a gateway calls :meth:`MissProtocol.on_miss`
when no signed page lists a project, and :meth:`MissProtocol.ask_ahead`
when the lookup that would tell must first read a role (the project's
bin-n): the publish is asked while that read is under way, and a miss
takes its answer, a round trip sooner.  It POSTs
``/_tufproxy/publish/<project>`` to the gateway (one worker at a time per
project, through a cross-process lock file in the cache directory; a worker that
waited asks again and gets the answer at once), then refreshes its
trusted metadata until it trusts at least the timestamp version the
gateway named, and says True so the resolver looks again.  A 404 from
the gateway is :class:`UnknownTarget` carrying the gateway's reason
(``denied by policy``, ``claimed private``, ``no index lists it``), which
the edge's 404 repeats for pip to show; any other refusal is
:class:`GatewayRefused`, whose 502 carries the gateway's reason slug and
one-line fix (``foreign-origin: the index links files on …; start the
gateway with --files-origin …``).  The whole exchange has a
deadline well under pip's 15 s read timeout; past it the request is a
503 with Retry-After (:class:`MetadataPending`).

The gateway's answer is a hint: the page is still verified from the
root, so a lying gateway can only make an edge wait (or say 404).  The
bodies it carries (:func:`_given`) are taken only from the gateway the
edge's refreshes read first, and verified as that mirror's: a forged one
is refused as that mirror's lie would be.  The
phases it names in ``Server-Timing`` are relayed, bounded, in the edge's
own answer under ``gw-`` beside the edge's ``publish`` (the whole
exchange) and ``refresh`` (:mod:`proxy.util.timing`).

:meth:`MissProtocol.missing` says why a file is not on a project's signed
page (its 404's detail): the gateway's ``why`` account, asked at most once
per project per :data:`EXPLAIN_TTL` and within :data:`EXPLAIN_DEADLINE`, so
a client asking for absent files cannot make the edge ask the gateway (and
the gateway the index) more than that.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import ssl
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import aiohttp

from proxy.protocol.errors import Fault, MetadataPending, TrustError, UnknownTarget, UpstreamUnreachable
from proxy.protocol.layout import MAX_PUBLISH_ANSWER, version_of_filename
from proxy.transport.credentials import OriginAuth
from proxy.transport.failover import Exhausted, failover
from proxy.transport.upstream import DownloadError, DownloadHTTPError, read_whole
from proxy.util import timing
from proxy.util.locks import FetchLocks
from proxy.util.logs import request_id

log = logging.getLogger(__name__)

DEADLINE = 8.0
RETRY_AFTER = 2
MAX_DETAIL = 240
MAX_BODY = 4096
MAX_WHY = 4 << 20
WHY_DEADLINE = 60.0  # the gateway reads the index page first
EXPLAIN_TTL = 60.0
EXPLAIN_DEADLINE = 3.0  # a 404's detail is worth little more than this wait
EXPLAIN_PROJECTS = 1024
AHEAD_TTL = 5.0  # a publish asked ahead of its lookup is taken by a miss until answered and this long after
AHEAD_PROJECTS = 256  # asks ahead kept at most, under way or answered
MAX_EXPECTED = 8  # roles, and targets, a publish answer may name (a snapshot, a bin-n, the page's formats)
_ROLE = re.compile(r"[a-z][a-z0-9-]{0,63}")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_DIGEST = re.compile(r"[0-9a-f]{64,128}")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


class GatewayRefused(TrustError):
    """The gateway refused to publish a project, for a reason of its own: relayed as ``SLUG: DETAIL``."""

    reason = "gateway-refused"
    fault = Fault.UPSTREAM


class _Refreshable(Protocol):
    async def refresh_until(self, version: int, timeout: float) -> None: ...

    def expect(self, roles: Mapping[str, int], targets: Mapping[str, str], version: int = 0,
               given: Mapping[str, bytes | None] | None = None) -> int: ...

    @property
    def root_version(self) -> int | None: ...

    @property
    def timestamp_version(self) -> int | None: ...

    @property
    def first_mirror(self) -> str: ...

    @property
    def foresees(self) -> bool: ...


@dataclass(frozen=True)
class _Answer:
    """A gateway's publish answer: the timestamp version to wait for, the files it says come next, and where
    its publish spent its time (its ``Server-Timing``)."""

    version: int
    roles: dict[str, int]
    targets: dict[str, str]
    given: dict[str, bytes | None]
    phases: timing.Phases


@dataclass
class _Ahead:
    """A publish asked ahead of a lookup's outcome: when asked, then when answered (``since``), and the ask."""

    since: float
    task: asyncio.Task[_Answer]


class MissProtocol:
    """See the module docstring.  ``gateway_urls``: every gateway of the group (each ends in ``/``), asked in order."""

    def __init__(self, gateway_urls: Sequence[str], trust: _Refreshable, locks: FetchLocks, deadline: float = DEADLINE,
                 auth: OriginAuth | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.gateway_urls = list(gateway_urls)
        self.auth = auth
        self.ssl_context = ssl_context
        self.trust = trust
        self.locks = locks
        self.deadline = deadline
        self._session: aiohttp.ClientSession | None = None  # kept open: a cold install misses once per project
        # project -> the publish asked ahead of a lookup's outcome (ask_ahead), the oldest first.
        self._ahead: OrderedDict[str, _Ahead] = OrderedDict()
        # project -> (when asked, the gateway's account or None), the newest last, bounded.
        self._accounts: OrderedDict[str, tuple[float, asyncio.Task[dict[str, Any] | None]]] = OrderedDict()

    def ask_ahead(self, project: str) -> None:
        """Ask the gateway to publish ``project`` now, while the lookup that may yet find it signed reads a role
        it had not (the project's bin-n): a miss then starts a round trip sooner, and :meth:`on_miss` takes the
        answer.  A lookup that finds the project leaves it unused; the gateway answers at once and, when the
        page is in the timestamp the edge trusts (``have=T``), names and carries nothing.  At most
        :data:`AHEAD_PROJECTS` asks are kept, answered ones giving way first: past that, lookups wait as
        before."""
        loop = asyncio.get_running_loop()
        for name in [name for name in self._ahead if self._stale(name)]:
            del self._ahead[name]
        if project in self._ahead:
            return
        if len(self._ahead) >= AHEAD_PROJECTS:
            answered = next((name for name, kept in self._ahead.items() if kept.task.done()), None)
            if answered is None:
                return
            del self._ahead[answered]
        task = loop.create_task(self._ask_ahead(project))
        kept = self._ahead[project] = _Ahead(loop.time(), task)

        def answered_now(t: asyncio.Task[_Answer]) -> None:
            kept.since = asyncio.get_running_loop().time()  # AHEAD_TTL runs from the answer
            if not t.cancelled():
                t.exception()  # an unused answer's failure is nobody's

        task.add_done_callback(answered_now)

    def _stale(self, project: str) -> bool:
        """Whether the ask kept for ``project`` is no answer for a miss now: answered more than AHEAD_TTL ago
        (it names an older timestamp than a new ask would), cancelled, or failed for a reason that may pass (a
        gateway unreachable a moment); a 404 or a refusal of the project is the gateway's answer, kept."""
        kept = self._ahead[project]
        task = kept.task
        if not task.done():
            return False
        if task.cancelled() or asyncio.get_running_loop().time() - kept.since > AHEAD_TTL:
            return True
        failed = task.exception()
        return failed is not None and not isinstance(failed, (UnknownTarget, GatewayRefused))

    def _asked_ahead(self, project: str) -> asyncio.Task[_Answer] | None:
        """The ask for ``project`` under way, or its answer while not stale: every miss meanwhile takes it."""
        if project not in self._ahead:
            return None
        if self._stale(project):
            del self._ahead[project]
            return None
        return self._ahead[project].task

    async def _ask_ahead(self, project: str) -> _Answer:
        timing.detach()  # not the asking request's wait unless on_miss takes it
        async with asyncio.timeout(self.deadline):
            return await self._ask_locked(project, ahead=True)

    async def _ask_locked(self, project: str, ahead: bool = False) -> _Answer:
        async with self.locks.hold(f"gateway-publish:{project}", wait=self.deadline):
            return await self._ask(project, ahead)

    async def on_miss(self, project: str) -> bool:
        """True once the edge trusts a timestamp carrying the project (the gateway's 404 raises UnknownTarget)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        target = f"simple/{project}/"
        try:
            async with asyncio.timeout(self.deadline):
                with timing.phase("publish"):
                    ahead = self._asked_ahead(project)
                    # shield: the answer asked ahead is not this request's to cancel.
                    answer = await (asyncio.shield(ahead) if ahead is not None else self._ask_locked(project))
                    if ahead is not None and answer.version <= (self.trust.timestamp_version or 0):
                        # It named a timestamp the edge trusts already, and the lookup in that found no page:
                        # the page went since (a gateway restored from a backup, a revocation). Asked now.
                        answer = await self._ask_locked(project)
                timing.relay(answer.phases, "gw-")
                self.trust.expect(answer.roles, answer.targets, answer.version, answer.given)
                with timing.phase("refresh"):
                    await self.trust.refresh_until(answer.version, max(0.1, end - loop.time()))
        except TimeoutError:
            raise MetadataPending(target, RETRY_AFTER) from None
        return True

    def _client(self) -> aiohttp.ClientSession:
        """The session every question to the gateways goes through, its connections kept alive between them."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.ssl_context if self.ssl_context is not None else True)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        for kept in self._ahead.values():
            kept.task.cancel()
        self._ahead.clear()
        if self._session is not None:
            await self._session.close()

    async def _ask(self, project: str, ahead: bool = False) -> _Answer:
        """The timestamp version the first gateway that answers names; one that is down, or answers 5xx without
        a reason, is passed over for the next (the one failover loop)."""
        try:
            return await failover(self.gateway_urls, lambda _i, url: self._ask_one(url, project, ahead))
        except Exhausted as e:
            raise UpstreamUnreachable(f"publish {project}", e.tried.failures) from None

    async def _ask_one(self, gateway_url: str, project: str, ahead: bool) -> _Answer:
        url = f"{gateway_url}_tufproxy/publish/{project}"
        # Bodies only from the gateway the edge's refreshes read first: another (a CDN in front, a group's
        # other replica) may not serve that timestamp yet, and would look like a rollback once trusted.
        takes = self.trust.foresees and gateway_url.rstrip("/") == self.trust.first_mirror.rstrip("/")
        root = self.trust.root_version
        try:
            # The edge's request id goes along, so the gateway's log lines and audit records name it too.
            rid = request_id.get()
            headers = {**(self.auth.headers(url) if self.auth else {}), **({"X-Request-Id": rid} if rid != "-" else {})}
            # given=1 asks for the bodies, root=N (the root it trusts) for whether the next root exists, sparing
            # the cycle that probe; ahead of a lookup, have=T (the timestamp it trusts, in which the lookup may
            # yet find the page: the answer then names and carries nothing).
            have = self.trust.timestamp_version if ahead else None
            params = {**({"given": "1"} if takes else {}), **({"root": str(root)} if takes and root is not None else {}),
                      **({"have": str(have)} if have is not None else {})}
            async with self._client().post(url, headers=headers, params=params, allow_redirects=False) as response:
                if response.status != 200:
                    slug, detail = _refusal(await read_whole(response, MAX_BODY) or b"")
                    if response.status == 404:
                        raise UnknownTarget(f"simple/{project}/", detail=f"gateway: {detail}" if detail else None)
                    if response.status == 502 and slug and detail:  # its verdict on the project: another would agree
                        raise GatewayRefused(f"{slug}: {detail}", target=f"simple/{project}/")
                    raise DownloadHTTPError(url, response.status)  # that gateway is failing: ask the next
                body = await read_whole(response, MAX_PUBLISH_ANSWER)
                if body is None:
                    raise DownloadError(url, f"publish answer over {MAX_PUBLISH_ANSWER} bytes")
                answer = json.loads(body)
                phases = timing.parse(response.headers.get("Server-Timing"))
        except aiohttp.ClientError as e:
            raise DownloadError(url, str(e) or type(e).__name__) from e
        except ValueError as e:
            raise DownloadError(url, f"not a JSON answer: {e}") from e
        version = answer.get("timestamp_version") if isinstance(answer, dict) else None
        if not _count(version):
            raise DownloadError(url, "gateway answer has no timestamp_version")
        roles, targets = _expected(answer.get("expect"), project)
        return _Answer(version, roles, targets, _given(answer.get("given")) if takes else {}, phases)


    async def why(self, project: str) -> dict[str, Any]:
        """The first answering gateway's ``/_tufproxy/why/<project>`` (what a publish would offer, what its
        policy hides and by which rule), for ``tufproxy why --edge``: readers who reach only the edge."""
        async def ask(_i: int, gateway_url: str) -> dict[str, Any]:
            url = f"{gateway_url}_tufproxy/why/{project}"
            headers = self.auth.headers(url) if self.auth else {}
            try:
                async with self._client().get(url, headers=headers, allow_redirects=False,
                                              timeout=aiohttp.ClientTimeout(total=WHY_DEADLINE)) as response:
                    if response.status != 200:
                        raise DownloadHTTPError(url, response.status)
                    answer = json.loads(await response.content.read(MAX_WHY))
            except aiohttp.ClientError as e:
                raise DownloadError(url, str(e) or type(e).__name__) from e
            except (ValueError, TimeoutError) as e:
                raise DownloadError(url, f"no answer: {e or type(e).__name__}") from e
            if not isinstance(answer, dict):
                raise DownloadError(url, "not a JSON object")
            return answer

        try:
            return await failover(self.gateway_urls, ask)
        except Exhausted as e:
            raise UpstreamUnreachable(f"why {project}", e.tried.failures) from None


    async def missing(self, project: str, filename: str) -> str:
        """Why ``filename`` is not on ``project``'s signed page, as the gateway accounts for it (a 404's detail)."""
        version = version_of_filename(filename)
        ask = f"`tufproxy why '{project}=={version}' --edge URL`" if version else f"`tufproxy why {project} --edge URL`"
        account = await self._account(project)
        hidden = next((h for h in (account or {}).get("hidden", ()) if isinstance(h, dict)
                       and h.get("filename") == filename), None)
        if hidden is not None:
            rule = _UNPRINTABLE.sub("?", str(hidden.get("rule")))[:64]
            if hidden.get("advisory"):
                rule += f" {_UNPRINTABLE.sub('?', str(hidden['advisory']))[:64]}"
            return f"{filename}: hidden by the gateway's policy ({rule}); {ask} says more"
        if account is not None and account.get("refused"):
            why = _UNPRINTABLE.sub("?", str(account["refused"]))[:MAX_DETAIL]
            return f"{filename}: the gateway does not offer {project}: {why}"
        if account is not None and filename not in account.get("offered", ()):
            return f"{filename}: the index does not list it for {project}"
        return f"{filename}: not on the gateway's signed page of {project}; {ask} says why"

    async def _account(self, project: str) -> dict[str, Any] | None:
        """The gateway's ``why`` answer for ``project`` (None if none came in time), shared for EXPLAIN_TTL."""
        loop = asyncio.get_running_loop()
        kept = self._accounts.get(project)
        if kept is None or loop.time() - kept[0] > EXPLAIN_TTL:
            kept = self._accounts[project] = (loop.time(), loop.create_task(self._ask_why(project)))
            self._accounts.move_to_end(project)
            while len(self._accounts) > EXPLAIN_PROJECTS:
                self._accounts.popitem(last=False)
        try:
            return await asyncio.wait_for(asyncio.shield(kept[1]), EXPLAIN_DEADLINE)
        except TimeoutError:
            return None

    async def _ask_why(self, project: str) -> dict[str, Any] | None:
        try:
            return await self.why(project)
        except TrustError as e:
            log.info("no account of %s from the gateway: %s", project, e)
            return None


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _expected(expect: object, project: str) -> tuple[dict[str, int], dict[str, str]]:
    """The files a publish answer says come next, kept only if well formed and about ``project``'s page: a
    bounded hint, never trusted (a wrong one costs a download), so anything odd is dropped whole."""
    if not isinstance(expect, dict):
        return {}, {}
    roles, targets = expect.get("roles"), expect.get("targets")
    if not isinstance(roles, dict) or not isinstance(targets, dict) or len(roles) > MAX_EXPECTED \
            or len(targets) > MAX_EXPECTED:
        return {}, {}
    good_roles = {r: v for r, v in roles.items() if isinstance(r, str) and _ROLE.fullmatch(r) and _count(v)}
    page = f"simple/{project}/"
    good_targets = {p: d for p, d in targets.items() if isinstance(p, str) and p.startswith(page)
                    and "/" not in p[len(page):] and _NAME.fullmatch(p[len(page):]) and isinstance(d, str)
                    and _DIGEST.fullmatch(d)}
    if len(good_roles) != len(roles) or len(good_targets) != len(targets):
        return {}, {}
    return good_roles, good_targets


def _given(given: object) -> dict[str, bytes | None]:
    """The bodies a publish answer carried (path -> bytes, or None for a file the gateway says it has not),
    base64 in its JSON; like the files it names, a hint (each is verified when used), so anything odd drops all."""
    if not isinstance(given, dict) or len(given) > MAX_EXPECTED + 2:  # beside them, the timestamp and root probe
        return {}
    found: dict[str, bytes | None] = {}
    for path, body in given.items():
        if not isinstance(path, str) or not (body is None or isinstance(body, str)):
            return {}
        try:
            found[path] = None if body is None else base64.b64decode(body, validate=True)
        except ValueError:
            return {}
    return found


def _refusal(body: bytes) -> tuple[str | None, str | None]:
    """The gateway's reason slug and detail in a refusal's JSON, printable and bounded (they reach pip's output)."""
    try:
        answer = json.loads(body)
        slug, detail = answer.get("reason"), answer.get("detail")
    except (ValueError, AttributeError):
        return None, None
    slug = slug if isinstance(slug, str) and _SLUG.fullmatch(slug) else None
    detail = _UNPRINTABLE.sub("?", detail)[:MAX_DETAIL] if isinstance(detail, str) and detail else None
    return slug, detail
