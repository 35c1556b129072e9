"""Which published pages are due for a refresh: a priority queue by due time, not a scan of every project.

The refresher asked, every tick, each published project whether its page
was older than ``--page-ttl``: a walk over all of them, tens of thousands a
gateway at scale.  :class:`DueQueue` keeps each project once in a heap
keyed by the time its page falls due (last fetch + ttl), so a tick pops
only what is due.  Fetch times change behind its back (a client's miss
fetches a page early): a popped entry whose project was fetched since is
pushed back at its new due time, not refreshed (lazy invalidation).  Pure:
the caller passes the clock and the fetch times.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet


class DueQueue:
    """Published projects by the time their page falls due; see the module docstring."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._heap: list[tuple[float, str]] = []
        self._queued: set[str] = set()

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def queued(self) -> AbstractSet[str]:
        """The projects in the queue, not to be changed (``published - queued`` is what to :meth:`add`: a set
        operation, in C)."""
        return self._queued

    def add(self, projects: Iterable[str], fetched: Mapping[str, float]) -> None:
        """Queue projects not queued yet, due ``ttl`` after their last fetch (at once if never fetched)."""
        for project in projects:
            if project not in self._queued:
                self._queued.add(project)
                heapq.heappush(self._heap, (fetched.get(project, -float("inf")) + self.ttl, project))

    def take(self, now: float, fetched: Mapping[str, float], published: Callable[[str], bool],
             limit: int, order: Callable[[str], float]) -> list[str]:
        """At most ``limit`` projects due at ``now``, highest ``order`` first; each taken is queued again at
        ``now + ttl`` (the caller fetches it now); the rest stay due.  Unpublished projects leave the queue."""
        due: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            _, project = heapq.heappop(self._heap)
            if not published(project):
                self._queued.discard(project)
                continue
            actual = fetched.get(project, -float("inf")) + self.ttl
            if actual > now:  # fetched since it was queued: due later
                heapq.heappush(self._heap, (actual, project))
                continue
            due.append(project)
        due.sort(key=order, reverse=True)
        for i, project in enumerate(due):
            heapq.heappush(self._heap, (now + self.ttl if i < limit else now, project))
        return due[:limit]
