"""A bounded map of names to times, most recent last: the oldest entry leaves when it is full."""

from __future__ import annotations

from collections import OrderedDict


class Recent(OrderedDict[str, float]):
    """Name -> monotonic time, most recent last, at most ``limit`` entries (the oldest is evicted)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: str, value: float) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        if len(self) > self.limit:
            self.popitem(last=False)
