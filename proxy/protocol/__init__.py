"""Rank 1: pure decisions, with no asyncio, aiohttp, sockets or file I/O.

The Simple Repository API as data (:mod:`~proxy.protocol.index`), where things live in a repository
(:mod:`~proxy.protocol.layout`, :mod:`~proxy.protocol.profiles`), request heads in raw bytes
(:mod:`~proxy.protocol.requesthead`), TUF verification over python-tuf (:mod:`~proxy.protocol.tufset`,
:mod:`~proxy.protocol.verify`), the one hash check (:mod:`~proxy.protocol.hashing`), the trust core's
value types (:mod:`~proxy.protocol.model`) and every refusal's type (:mod:`~proxy.protocol.errors`).
Everything here is testable with plain bytes; ``import proxy.protocol`` never loads aiohttp.
"""

__all__ = ["errors", "hashing", "index", "layout", "model", "profiles", "requesthead", "tufset", "verify"]
