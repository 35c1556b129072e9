"""Credentials we send: ``user:password@`` in a configured URL, else netrc, each kept to its own origin.

:func:`split_credentials` takes them out of a URL once, where the URL is
configured, so the URL kept, logged, audited and printed never has them;
:class:`OriginAuth` gives them back only for a request to the same
scheme, host and port.
"""

from __future__ import annotations

import base64
import netrc
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL, lower-cased, without credentials."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    default = {"http": 80, "https": 443}.get(parts.scheme)
    port = f":{parts.port}" if parts.port and parts.port != default else ""
    return f"{parts.scheme.lower()}://{host}{port}"


def basic(user: str, password: str) -> str:
    """The ``Authorization`` value of HTTP basic authentication (RFC 7617, UTF-8)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def strip_credentials(url: str) -> tuple[str, str | None]:
    """The URL without ``user:password@``, and the ``Authorization`` value of those credentials if it had them."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    user, password = unquote(parts.username), unquote(parts.password or "")
    return urlunsplit(parts._replace(netloc=netloc)), basic(user, password)


def netrc_auth(host: str) -> str | None:
    """The ``Authorization`` value of ``$NETRC`` (or ``~/.netrc``)'s credentials for ``host``, if any."""
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        found = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if not found:
        return None
    login, _, password = found
    return basic(login or "", password or "")


class OriginAuth:
    """Credentials by origin, from the URLs given (URL first, then netrc for its host)."""

    def __init__(self) -> None:
        self._auth: dict[str, str] = {}  # origin -> Authorization value

    def add(self, url: str) -> str:
        """Remember ``url``'s credentials (or netrc's for its host); the URL without them."""
        clean, auth = strip_credentials(url)
        auth = auth or netrc_auth(urlsplit(clean).hostname or "")
        if auth is not None:
            self._auth.setdefault(origin(clean), auth)
        return clean

    def add_all(self, urls: Iterable[str]) -> list[str]:
        return [self.add(u) for u in urls]

    def headers(self, url: str) -> dict[str, str]:
        """``{"Authorization": ...}`` for a request to ``url``'s origin if we hold its credentials, else ``{}``."""
        value = self._auth.get(origin(url)) if self._auth else None
        return {"Authorization": value} if value is not None else {}

    def has(self, url: str) -> bool:
        return origin(url) in self._auth

    def __bool__(self) -> bool:
        return bool(self._auth)

    def __repr__(self) -> str:
        # The origins only, never a header value (base64 is not encryption).
        return f"OriginAuth({sorted(self._auth)})"
