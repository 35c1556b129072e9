"""A request's credentials to a verdict: who it is, whether it may, or why not. No HTTP, no I/O of its own.

:meth:`Guard.identify` reads an ``Authorization`` header (HTTP basic only)
and answers one of: the user (a cached success, or anonymous), a
:class:`Refusal`, or a :class:`Pending` check that the caller runs off the
event loop (:meth:`Guard.verify`: bcrypt and argon2 cost milliseconds on
purpose).  :meth:`Guard.authorize` then applies the read or publish rules.

Under attack:

* a success is remembered for ``cache_ttl`` seconds, keyed by an HMAC of
  the header under a key made at start-up (a memory dump shows no
  password, and a guess that misses the cache pays the full hash);
* failures are counted per client address and per user name over a
  sliding minute; past ``max_failures`` the next attempts get 429 without
  a check (a remembered success still passes, so a flood against one name
  does not lock out a client that already proved itself);
* a header of absurd size or encoding is a 400 before anything is checked;
* nothing returned here carries the password: a refusal's ``user`` is set
  only once the password was right (a wrong "user" may be a password typed
  into the wrong field).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from proxy.protocol import refusals
from proxy.protocol.access import Rules
from proxy.serving.passwords import Passwords

MAX_HEADER = 4096
MAX_USER = 256
MAX_PASSWORD = 1024
MAX_TRACKED = 100_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

UNAUTHENTICATED = "unauthenticated"
FORBIDDEN = "forbidden"
THROTTLED = "throttled"
BAD_CREDENTIALS = "bad-credentials"
CHALLENGE = 'Basic realm="tufproxy", charset="UTF-8"'


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str
    user: str | None = None
    retry_after: int | None = None

    @property
    def status(self) -> int:
        return refusals.BY_REASON[self.reason].status

    def headers(self) -> dict[str, str]:
        headers = {"X-Tufproxy-Reason": self.reason}
        if self.reason == UNAUTHENTICATED:
            headers["WWW-Authenticate"] = CHALLENGE
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


@dataclass(frozen=True)
class Pending:
    """A password to check (off the event loop): the user, the password, the cache key."""

    user: str
    password: str
    key: bytes
    client: str


@dataclass(frozen=True)
class User:
    name: str | None  # None: anonymous


ANONYMOUS_USER = User(None)


class _Window:
    """Failures per key over the last ``seconds``, bounded in keys."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit, self.seconds = limit, seconds
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._times.get(key)
        while times and times[0] <= now - self.seconds:
            times.popleft()
        return times

    def blocked_for(self, key: str, now: float) -> float:
        times = self._recent(key, now)
        if not times or len(times) < self.limit:
            return 0.0
        return times[0] + self.seconds - now

    def add(self, key: str, now: float) -> None:
        times = self._recent(key, now)
        if times is None:
            times = self._times[key] = deque(maxlen=self.limit)
            if len(self._times) > MAX_TRACKED:
                self._times.popitem(last=False)
        times.append(now)
        self._times.move_to_end(key)


class Guard:
    """See the module docstring.  Without ``passwords`` nobody can authenticate: all are anonymous."""

    def __init__(self, passwords: Passwords | None, read: Rules, publish: Rules | None = None, *,
                 cache_ttl: float = 300.0, max_failures: int = 10, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.passwords = passwords
        self.read = read
        self.publish = publish or Rules(default=frozenset({"authenticated"}))
        self.cache_ttl = cache_ttl
        self.clock = clock
        self._key = os.urandom(32)
        self._cache: OrderedDict[bytes, tuple[str, float, tuple[int, int]]] = OrderedDict()
        self._by_client = _Window(max_failures, window)
        self._by_user = _Window(max_failures, window)

    def _cache_key(self, header: str) -> bytes:
        return hmac.new(self._key, header.encode("utf-8", "surrogateescape"), hashlib.sha256).digest()

    def remembered(self, header: str | None) -> User | None:
        """The user a header proved itself as lately (the hot path's check: no hashing of passwords)."""
        if header is None:
            return ANONYMOUS_USER
        if self.passwords is None or len(header) > MAX_HEADER:
            return None
        hit = self._cache.get(self._cache_key(header))
        if hit is None or hit[1] < self.clock() or hit[2] != self.passwords.generation:
            return None
        return User(hit[0])

    def identify(self, header: str | None, client: str) -> User | Refusal | Pending:
        if header is None:
            return ANONYMOUS_USER
        if len(header) > MAX_HEADER:
            return Refusal(BAD_CREDENTIALS, "Authorization header too long")
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return Refusal(UNAUTHENTICATED, "only HTTP basic authentication is accepted")
        try:
            text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return Refusal(BAD_CREDENTIALS, "Authorization header is not base64 of UTF-8 user:password")
        user, sep, password = text.partition(":")
        if not sep or not user or len(user) > MAX_USER or len(password) > MAX_PASSWORD or _CONTROL.search(user):
            return Refusal(BAD_CREDENTIALS, "Authorization header is not user:password of a sane size")
        if self.passwords is None:
            return Refusal(UNAUTHENTICATED, "this server has no users (no --auth-file)")
        remembered = self.remembered(header)
        if remembered is not None:
            return remembered
        now = self.clock()
        wait = max(self._by_client.blocked_for(client, now), self._by_user.blocked_for(user, now))
        if wait > 0:
            return Refusal(THROTTLED, "too many failed attempts: try again later", retry_after=max(1, round(wait)))
        return Pending(user, password, self._cache_key(header), client)

    def verify(self, pending: Pending) -> User | Refusal:
        """The expensive check (run it in a thread); remembers a success, counts a failure."""
        assert self.passwords is not None
        generation = self.passwords.generation
        if self.passwords.check(pending.user, pending.password):
            self._cache[pending.key] = (pending.user, self.clock() + self.cache_ttl, generation)
            self._cache.move_to_end(pending.key)
            if len(self._cache) > MAX_TRACKED:
                self._cache.popitem(last=False)
            return User(pending.user)
        now = self.clock()
        self._by_client.add(pending.client, now)
        self._by_user.add(pending.user, now)
        return Refusal(UNAUTHENTICATED, "wrong user name or password")

    def groups(self) -> Mapping[str, frozenset[str]]:
        return self.passwords.groups() if self.passwords is not None else {}

    def authorize(self, user: User, project: str | None, *, publish: bool = False,
                  private: bool = False) -> Refusal | None:
        """None if ``user`` may read (or publish) ``project``; else 401 for anonymous, 403 for a user."""
        rules = self.publish if publish else self.read
        if rules.allows(project, user.name, self.groups(), private):
            return None
        if user.name is None:
            return Refusal(UNAUTHENTICATED, "authentication required")
        return Refusal(FORBIDDEN, f"user {user.name} may not {'publish' if publish else 'read'} this", user=user.name)

    def may_read_private(self, user: User, project: str) -> bool:
        return self.read.allows(project, user.name, self.groups(), private=True)
