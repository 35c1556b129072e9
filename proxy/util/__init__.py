"""Rank 0: what every layer needs and that knows nothing of packages or TUF.

Process logs (:mod:`~proxy.util.logs`), Prometheus registries (:mod:`~proxy.util.metrics`), crash-safe
writes (:mod:`~proxy.util.atomic`) and cross-process locks
(:mod:`~proxy.util.locks`). Imports nothing else of ``proxy``.
"""

__all__ = ["atomic", "lifetime", "locks", "logs", "metrics"]
