"""A fault-injecting HTTP upstream on 127.0.0.1 that serves a real signed tree.

:class:`FaultyUpstream` speaks just enough HTTP/1.1 over raw asyncio
sockets (in its own thread, with its own loop) to misbehave in ways a
well-mannered server library will not: reset a connection mid-body, close
early, drip one byte at a time, sit on a request, announce the wrong
Content-Length, redirect in a loop or to another host, stream without end,
or send garbage.  Without a fault it serves the files under ``root`` (a
``Repository.public_dir``), optionally throttled, and logs every request
path so tests can count upstream fetches.  Every answer closes its
connection, so one request is one log line.

Helpers for the tests that drive the proxy through these faults:
:func:`sized_wheel` (a real wheel of a chosen size, big enough to fail
mid-body), :func:`get` (one timed request with an aiohttp client) and
:func:`process_tree` (a ``tufproxy serve`` is a supervisor and its workers:
crash or trace all of them).
"""

from __future__ import annotations

import asyncio
import enum
import os
import re
import socket
import struct
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlsplit

import aiohttp

from proxy.repository.sample import build_wheel

_MAX_REQUEST_HEAD = 64 * 1024
# A stalled answer never outlives this, even if a test forgets to release it.
_MAX_STALL = 120.0
# An endless body stops here at the latest: the largest file the proxy accepts by default (--max-file-size 4G).
_ENDLESS_LIMIT = 4 * 2**30


class Fault(str, enum.Enum):
    """What a matching request gets instead of the file."""

    RESET = "reset"  # honest headers, half the body, then a TCP reset
    TRUNCATE = "truncate"  # honest headers, half the body, then a clean close
    DRIP = "drip"  # honest headers, then the body one byte per ``interval``
    DRIP_HEADERS = "drip-headers"  # the status line, then a header byte per ``interval``, forever
    STALL_HEADERS = "stall-headers"  # read the request, answer nothing until released
    WRONG_LENGTH = "wrong-length"  # Content-Length says half, the whole body follows
    STATUS = "status"  # a bare ``status`` (5xx, 404...)
    REDIRECT_LOOP = "redirect-loop"  # 302 to the very same URL
    REDIRECT_FOREIGN = "redirect-foreign"  # 302 to ``location`` on another host
    ENDLESS = "endless"  # 200 with no Content-Length, bytes until the client hangs up
    OVERSIZED = "oversized"  # 200 announcing a terabyte, then bytes until the client hangs up
    GARBAGE = "garbage"  # 200, the right length of the wrong bytes (junk JSON for metadata)


@dataclass
class Hold:
    """A stall the test controls: ``arrived`` is set when a request waits on it."""

    arrived: threading.Event = field(default_factory=threading.Event)
    _release: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def release(self) -> None:
        """Let every waiting (and later) matching request be answered normally."""
        if self._loop is not None and self._release is not None:
            self._loop.call_soon_threadsafe(self._release.set)


@dataclass
class _Rule:
    pattern: re.Pattern[str]
    fault: Fault | None  # None: a Hold, then the normal answer
    status: int = 503
    interval: float = 0.2
    location: str = ""
    hold: Hold | None = None


class FaultyUpstream:
    """Serve ``root`` on 127.0.0.1; misbehave for paths given to :meth:`inject`."""

    def __init__(self, root: Path, *, rate: float | None = None, ranges: bool = True) -> None:
        self.root = Path(root).resolve()
        self.rate = rate  # bytes per second per response for normal answers (None: full speed)
        self.ranges = ranges  # honour "Range: bytes=N-" (False: answer 200 with the whole body)
        self.requests: list[str] = []
        self.sent: dict[str, int] = {}  # path -> body bytes an endless or oversized answer got out
        self.completed: list[str] = []  # paths of normal answers sent to their last byte
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    # -- what tests call -------------------------------------------------
    def inject(self, pattern: str, fault: Fault, *, status: int = 503, interval: float = 0.2,
               location: str = "http://192.0.2.1/elsewhere") -> None:
        """Answer paths matching the regex ``pattern`` (full match) with ``fault``."""
        self._add(_Rule(re.compile(pattern), fault, status=status, interval=interval, location=location))

    def hold(self, pattern: str) -> Hold:
        """Stall matching requests until ``release()`` (then answer them normally)."""
        assert self._loop is not None, "start the upstream first"
        hold = Hold(_loop=self._loop)

        async def make() -> asyncio.Event:
            return asyncio.Event()

        hold._release = asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout=10)
        self._add(_Rule(re.compile(pattern), None, hold=hold))
        return hold

    def clear(self) -> None:
        """Drop every fault and release every hold: serve the tree as it is."""
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            if rule.hold is not None:
                rule.hold.release()

    def count(self, pattern: str) -> int:
        """How many requests so far had a path matching ``pattern``."""
        rx = re.compile(pattern)
        with self._lock:
            return sum(1 for p in self.requests if rx.fullmatch(p))

    def done(self, pattern: str) -> int:
        """How many normal answers to paths matching ``pattern`` were sent to their last byte."""
        rx = re.compile(pattern)
        with self._lock:
            return sum(1 for p in self.completed if rx.fullmatch(p))

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.insert(0, rule)

    # -- lifecycle -------------------------------------------------------
    def start(self) -> FaultyUpstream:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._stopping = asyncio.Event()

            async def main() -> None:
                self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
                self.port = self._server.sockets[0].getsockname()[1]
                ready.set()
                assert self._stopping is not None
                await self._stopping.wait()
                self._server.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            loop.run_until_complete(main())
            loop.close()

        self._thread = threading.Thread(target=run, name="faulty-upstream", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("faulty upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server side ---------------------------------------------------
    def _lookup(self, path: str) -> tuple[bytes | None, _Rule | None]:
        with self._lock:
            self.requests.append(path)
            rule = next((r for r in self._rules if r.pattern.fullmatch(path)), None)
        local = (self.root / path.lstrip("/")).resolve()
        data = None
        if local.is_relative_to(self.root):
            if local.is_dir():
                local = local / "index.html"
            if local.is_file():
                data = local.read_bytes()
        return data, rule

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_REQUEST_HEAD:
                return
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("latin-1")
            path = unquote(urlsplit(target).path)
            data, rule = self._lookup(path)
            if rule is not None and rule.hold is not None:
                rule.hold.arrived.set()
                assert rule.hold._release is not None
                try:
                    await asyncio.wait_for(rule.hold._release.wait(), _MAX_STALL)
                except TimeoutError:
                    return
                rule = None
            if rule is None:
                ranged = re.search(rb"\r\nrange: bytes=(\d+)-\r\n", head, re.I)
                await self._serve(writer, data, int(ranged.group(1)) if ranged and self.ranges else 0, path)
            else:
                await self._misbehave(writer, rule, data, path)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, IndexError):
            pass
        except asyncio.CancelledError:
            pass  # the upstream is stopping: this handler is the whole task
        finally:
            writer.close()

    async def _serve(self, writer: asyncio.StreamWriter, data: bytes | None, start: int = 0, path: str = "") -> None:
        if data is None:
            writer.write(_head(404, {"Content-Length": "9"}) + b"not found")
            await writer.drain()
            return
        if start:
            writer.write(_head(206, {"Content-Length": str(len(data) - start),
                                     "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}))
            data = data[start:]
        else:
            writer.write(_head(200, {"Content-Length": str(len(data))}))
        step = 2**20 if self.rate is None else max(1, int(self.rate / 20))
        for i in range(0, len(data), step):
            writer.write(data[i:i + step])
            await writer.drain()
            if self.rate is not None:
                await asyncio.sleep(step / self.rate)
        with self._lock:
            self.completed.append(path)

    async def _misbehave(self, writer: asyncio.StreamWriter, rule: _Rule, data: bytes | None, path: str) -> None:
        body = data if data is not None else b"{}"
        fault = rule.fault
        if fault in (Fault.RESET, Fault.TRUNCATE):
            writer.write(_head(200, {"Content-Length": str(len(body))}) + body[: len(body) // 2])
            await writer.drain()
            if fault is Fault.RESET:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
        elif fault is Fault.DRIP:
            writer.write(_head(200, {"Content-Length": str(len(body))}))
            for i in range(len(body)):
                writer.write(body[i:i + 1])
                await writer.drain()
                await asyncio.sleep(rule.interval)
        elif fault is Fault.DRIP_HEADERS:
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(int(_MAX_STALL / rule.interval)):
                writer.write(b"X-Drip-%d: y\r\n" % i)
                await writer.drain()
                await asyncio.sleep(rule.interval)
        elif fault is Fault.STALL_HEADERS:
            await asyncio.sleep(_MAX_STALL)
        elif fault is Fault.WRONG_LENGTH:
            writer.write(_head(200, {"Content-Length": str(len(body) // 2)}) + body)
        elif fault is Fault.STATUS:
            writer.write(_head(rule.status, {"Content-Length": "0"}))
        elif fault in (Fault.REDIRECT_LOOP, Fault.REDIRECT_FOREIGN):
            location = path if fault is Fault.REDIRECT_LOOP else rule.location
            writer.write(_head(302, {"Location": location, "Content-Length": "0"}))
        elif fault in (Fault.ENDLESS, Fault.OVERSIZED):
            headers = {"Content-Length": str(2**40)} if fault is Fault.OVERSIZED else {}
            writer.write(_head(200, headers))
            chunk = b"z" * 65536
            for _ in range(_ENDLESS_LIMIT // len(chunk)):
                writer.write(chunk)
                await writer.drain()
                # Counted once drained: in the kernel's buffers or beyond, no longer ours.
                with self._lock:
                    self.sent[path] = self.sent.get(path, 0) + len(chunk)
        elif fault is Fault.GARBAGE:
            junk = b'{"signed": {"_type": "timestamp", "version": ]}' if path.endswith(".json") else os.urandom(len(body))
            writer.write(_head(200, {"Content-Length": str(len(junk))}) + junk)
        await writer.drain()


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def sized_wheel(dest: Path, name: str, version: str, size: int) -> Path:
    """A real wheel of about ``size`` bytes: incompressible data in a stored member."""
    wheel = build_wheel(dest, name, version)
    with zipfile.ZipFile(wheel, "a", zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo(f"{name.replace('-', '_')}/data.bin", date_time=(2020, 1, 1, 0, 0, 0)),
                    os.urandom(max(0, size - wheel.stat().st_size)))
    return wheel


@dataclass(frozen=True)
class Got:
    """One response as a test sees it."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float


async def get(session: aiohttp.ClientSession, url: str, **headers: str) -> Got:
    """GET ``url`` (no redirects followed); headers given as Python names (``If_None_Match``)."""
    start = time.monotonic()
    async with session.get(url, allow_redirects=False,
                           headers={k.replace("_", "-"): v for k, v in headers.items()}) as r:
        body = await r.read()
        return Got(r.status, {k.lower(): v for k, v in r.headers.items()}, body, time.monotonic() - start)


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found
