"""The one way a test waits: poll a condition until it holds, within a deadline (never a bare sleep).

:func:`wait_for` for plain code, :func:`poll` on the event loop (its
condition may be a coroutine function, e.g. a GET).  Both return the value
that satisfied ``done`` (by default: a true value), and fail the test with
an AssertionError naming ``what`` and the last value once ``timeout``
seconds have passed.  The condition is always tried at least once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
INTERVAL = 0.05


def _timed_out(what: str, timeout: float, last: object) -> AssertionError:
    return AssertionError(f"{what}: not reached within {timeout:g}s (last: {repr(last)[:300]})")


def wait_for(condition: Callable[[], T], what: str = "condition", *, timeout: float = 30.0,
             interval: float = INTERVAL, done: Callable[[T], object] = bool) -> T:
    """``condition()`` once it satisfies ``done``, asked every ``interval`` seconds for at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done(value := condition()):
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, value)
        time.sleep(interval)
    return value


async def poll(condition: Callable[[], T | Awaitable[T]], what: str = "condition", *, timeout: float = 30.0,
               interval: float = INTERVAL, done: Callable[[T], object] = bool) -> T:
    """:func:`wait_for` on the event loop; ``condition`` may return an awaitable (it is awaited)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if done(value):
            return value
        if loop.time() >= deadline:
            raise _timed_out(what, timeout, value)
        await asyncio.sleep(interval)
