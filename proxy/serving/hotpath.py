"""The warm path's response bytes: what aiohttp sends for a ready page, serialised without aiohttp's web layer.

A warm index page costs aiohttp's whole request pipeline (request and
response objects, the handler task, middleware, header serialisation) for
a few hundred bytes already rendered.  :mod:`proxy.serving.listener`'s
connections answer such a request straight from ``data_received`` (it owns
every use of aiohttp's internals); :func:`response` makes the bytes:
aiohttp's own for the same ``web.Response`` (status line, the given
headers, ``Content-Length``, ``Date``, ``Server``), with the head of each
distinct answer serialised once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

_REASONS = {200: "OK", 304: "Not Modified"}


def response(status: int, headers: Mapping[str, str], body: bytes, request_id: str, head_only: bool) -> bytes:
    """The bytes aiohttp sends for ``web.Response(status, headers, body)`` with ``X-Request-Id``;
    no body for ``HEAD`` or a 304 (whose head has no ``Content-Length``, as aiohttp sends it)."""
    lead = _lead(status, tuple(headers.items()), len(body))
    tail = rfc822_formatted_time()
    parts = (lead, request_id.encode("ascii"), b"\r\nDate: ", tail.encode("ascii"), _SERVER_AND_END)
    if head_only or status == 304:
        return b"".join(parts)
    return b"".join((*parts, body))


_SERVER_AND_END = f"\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode("ascii")


@functools.lru_cache(maxsize=4096)
def _lead(status: int, headers: tuple[tuple[str, str], ...], length: int) -> bytes:
    """A response's head up to the request id's value (serialised once per distinct answer)."""
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}", *(f"{k}: {v}" for k, v in headers)]
    if status != 304:
        lines.append(f"Content-Length: {length}")
    lines.append("X-Request-Id: ")
    return "\r\n".join(lines).encode("latin-1")
