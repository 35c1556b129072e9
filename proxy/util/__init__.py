"""Rank 0: what every layer needs and that knows nothing of packages or TUF.

Process logs (:mod:`~proxy.util.logs`), Prometheus registries (:mod:`~proxy.util.metrics`), crash-safe
writes (:mod:`~proxy.util.atomic`), cross-process locks
(:mod:`~proxy.util.locks`) and glibc's malloc thresholds for a process that streams bodies
(:mod:`~proxy.util.malloc`). Imports nothing else of ``proxy``.
"""

__all__ = ["atomic", "lifetime", "locks", "logs", "malloc", "metrics"]
