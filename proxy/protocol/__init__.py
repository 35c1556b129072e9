"""Rank 1: pure decisions, with no asyncio, aiohttp, sockets or file I/O.

The Simple Repository API as data (:mod:`~proxy.protocol.index`), where things live in a repository
(:mod:`~proxy.protocol.layout`, :mod:`~proxy.protocol.profiles`), request heads in raw bytes
(:mod:`~proxy.protocol.requesthead`), TUF verification over python-tuf (:mod:`~proxy.protocol.tufset`,
:mod:`~proxy.protocol.verify`), the one hash check (:mod:`~proxy.protocol.hashing`), the trust core's
value types (:mod:`~proxy.protocol.model`), every error's type and whose fault it is
(:mod:`~proxy.protocol.errors`), and the one table that turns a refusal into a status, an audit
decision and a metric label (:mod:`~proxy.protocol.refusals`), and the one option resolver of every
subcommand (:mod:`~proxy.protocol.options`: flag, then variable, then TOML value, then default).
Everything here is testable with plain bytes; ``import proxy.protocol`` never loads aiohttp.
"""

__all__ = ["access", "errors", "hashing", "index", "layout", "model", "options", "profiles", "refusals", "requesthead",
           "tufset", "verify"]
