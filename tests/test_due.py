"""The refresher's due queue (proxy.gateway.due): plain values, a fake clock."""

from __future__ import annotations

from pathlib import Path

from proxy.gateway.due import DueQueue


def test_only_what_is_due_is_taken_most_used_first_and_bounded() -> None:
    fetched = {"a": 0.0, "b": 5.0, "c": 8.0}
    used = {"a": 1.0, "b": 3.0, "c": 2.0, "new": 0.0}
    queue = DueQueue(ttl=10.0)
    queue.add(["a", "b", "c", "new"], fetched)
    published = {"a", "b", "c", "new"}.__contains__

    def take(now: float, limit: int) -> list[str]:
        taken = queue.take(now, fetched, published, limit, used.__getitem__)
        fetched.update(dict.fromkeys(taken, now))  # the refresher fetches what it took
        return taken

    assert take(9.0, 10) == ["new"]  # never fetched: due at once
    assert take(16.0, 1) == ["b"]  # a and b due; b used more recently; one a tick
    assert take(16.0, 1) == ["a"]  # the one left over stays due
    fetched["c"] = 17.0  # a client's miss fetched c early: it is due 10 s after that, not at 18
    assert take(18.5, 10) == []
    assert take(26.5, 10) == ["b", "a", "new"]  # each 10 s after its own refresh; c not yet
    assert take(27.0, 10) == ["c"]
    assert len(queue) == 4


def test_unpublished_projects_leave_the_queue() -> None:
    queue = DueQueue(ttl=1.0)
    queue.add(["gone", "kept"], {})
    assert queue.take(0.0, {}, {"kept"}.__contains__, 10, lambda p: 0.0) == ["kept"]
    assert set(queue.queued) == {"kept"}
    queue.add({"gone", "kept"} - queue.queued, {})  # re-published: queued again
    assert set(queue.queued) == {"gone", "kept"}


def test_a_project_past_the_bound_of_fetch_times_is_due_ttl_after_its_page_was_signed(tmp_path: Path) -> None:
    import os
    import time

    from proxy.gateway.freshness import _FetchedOrSigned

    page = tmp_path / "simple" / "old" / "index.json"
    page.parent.mkdir(parents=True)
    page.write_bytes(b"{}")
    os.utime(page, (time.time() - 100, time.time() - 100))  # signed 100 s ago; its fetch time was dropped
    fetched = _FetchedOrSigned({"kept": time.monotonic() - 5}, tmp_path / "simple")
    queue = DueQueue(ttl=1000)
    queue.add(["kept", "old", "never"], fetched)
    now = time.monotonic()
    assert queue.take(now, fetched, lambda p: True, 10, lambda p: 0.0) == ["never"]  # no page, no fetch: due
    assert queue.take(now + 901, fetched, lambda p: True, 10, lambda p: 0.0) == ["old"]
    assert queue.take(now + 996, fetched, lambda p: True, 10, lambda p: 0.0) == ["kept"]
