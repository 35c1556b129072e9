"""Rank 5: the HTTP face of an edge: deciding the answer, sending it, running processes.

The resolver decides (no aiohttp), the server sends, :mod:`~proxy.serving.serve` wires a running proxy,
:mod:`~proxy.serving.workers` supervises processes, :mod:`~proxy.serving.edge` is the edge's half of the
gateway's miss protocol, :mod:`~proxy.serving.config` its settings.
"""

__all__ = ["access", "config", "edge", "guard", "hotpath", "listener", "passwords", "refusals", "resolver", "serve", "server",
           "streaming", "workers"]
