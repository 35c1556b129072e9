"""Recognising the simplest HTTP request heads in raw bytes: pure, no I/O, no state.

:func:`recognise` reads the bytes a connection received and answers a
:class:`SimpleHead` only when they are exactly one complete request head of
the plainest kind: ``GET`` or ``HEAD`` of an origin-form path of unreserved
characters (no query, no percent-escapes, no dot segments, no empty
segments), ``HTTP/1.1``, well-formed header lines, nothing that frames a
body or changes the connection (``Content-Length``, ``Transfer-Encoding``,
``Expect``, ``Upgrade``, any ``Connection`` but ``keep-alive``), one plain
``Host``, no repeat of a field it reads or that aiohttp allows once, and
nothing after the head.  Anything else
is None: "not mine", for the full HTTP parser, whose answer a None never
changes.  Being strict here is what makes a fast path safe to have.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

# aiohttp's own bound on a request line; a head longer than this is never simple.
MAX_HEAD = 8190
MAX_FIELDS = 64
_END = b"\r\n\r\n"
_REQUEST_LINE = re.compile(rb"(GET|HEAD) (/[A-Za-z0-9._~/-]*) HTTP/1\.1")
_UNNORMAL_PATH = re.compile(rb"//|/\.\.?(?:/|\Z)")
# RFC 9110 token, a colon, optional whitespace, visible ASCII with inner spaces or tabs, optional whitespace.
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*((?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?)[ \t]*")
_HOST = re.compile(rb"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")
# Fields read here, and the ones aiohttp refuses to see twice (RFC 9110 singletons): never repeated.
_SINGLE = frozenset((b"accept", b"if-none-match", b"x-request-id", b"authorization", b"host", b"connection", b"content-location",
                     b"content-range", b"content-type", b"etag", b"max-forwards", b"server", b"user-agent"))
# Fields that frame a body or change what the connection does next: never simple.
_NOT_SIMPLE = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade", b"http2-settings", b"te"))
# Fields that change a file's answer (a part, a 304 or a 412 by date or tag) but not a page's, which ignores them.
_FILE_CONDITIONS = frozenset((b"range", b"if-range", b"if-modified-since", b"if-match", b"if-unmodified-since"))


class SimpleHead(NamedTuple):
    """A complete, plain ``GET``/``HEAD`` request: what a warm page answer needs to know."""

    method: str
    path: str
    accept: str | None = None
    if_none_match: str | None = None
    request_id: str | None = None
    authorization: str | None = None
    # Any of Range, If-Range, If-Modified-Since, If-Match, If-Unmodified-Since: a file's answer depends on it.
    conditional: bool = False


def recognise(data: bytes) -> SimpleHead | None:
    """The simple request ``data`` is, whole and alone; None for anything else (see the module)."""
    # A client repeats the same few heads byte for byte: short ones are remembered.
    return _recognise_short(data) if len(data) <= _SHORT else _recognise(data)


def _recognise(data: bytes) -> SimpleHead | None:
    if len(data) > MAX_HEAD or not data.endswith(_END) or data.find(_END) != len(data) - 4:
        return None
    lines = data[:-4].split(b"\r\n")
    if len(lines) > MAX_FIELDS + 1:
        return None
    request = _REQUEST_LINE.fullmatch(lines[0])
    if request is None or _UNNORMAL_PATH.search(request[2]):
        return None
    kept: dict[bytes, bytes] = {}
    conditional = False
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            return None
        name = field[1].lower()
        if name in _SINGLE:
            if name in kept:
                return None
            kept[name] = field[2]
        elif name in _NOT_SIMPLE:
            return None
        elif name in _FILE_CONDITIONS:
            conditional = True
    connection = kept.get(b"connection")
    if (connection is not None and connection.lower() != b"keep-alive") or not _HOST.fullmatch(kept.get(b"host", b"")):
        return None
    return SimpleHead(
        request[1].decode("ascii"),
        request[2].decode("ascii"),
        _text(kept.get(b"accept")),
        _text(kept.get(b"if-none-match")),
        _text(kept.get(b"x-request-id")),
        _text(kept.get(b"authorization")),
        conditional,
    )


_SHORT = 1024
_recognise_short = functools.lru_cache(maxsize=2048)(_recognise)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("ascii")
