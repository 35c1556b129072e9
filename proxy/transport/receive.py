"""A large response body received straight into the reader's buffer.

aiohttp hands a body over as a new ``bytes`` object per socket read, which
the fetch then copies into its batch: every byte is copied twice, and two
fresh allocations are faulted in, before the hash and the write see it.
For a large body of announced length, :class:`Receiver` takes the
response's connection over once aiohttp has parsed the headers
(:meth:`asyncio.BaseTransport.set_protocol`): as an
:class:`asyncio.BufferedProtocol`, the socket's reads (or the TLS layer's
decryption) land in the buffer the reader passes to
:meth:`Receiver.readinto`, one copy out of the kernel and none after.

The transport reads only while a :meth:`~Receiver.readinto` waits and
never past the announced length, so the body is exactly what aiohttp's
parser would have delivered, minus its copies.  Over TLS, the part of a
read that would not fit in the reader's buffer (asyncio's TLS layer must
be offered all it holds) goes through a spill buffer: one copy for that
part.  A connection taken over is
closed after its body (its parser still expects the body it never saw);
which bodies are worth that is the caller's choice
(:data:`proxy.transport.upstream.RECEIVE_MIN`).  The aiohttp internals this
relies on are checked by ``tests/test_aiohttp_interface.py``.
"""

from __future__ import annotations

import asyncio

import aiohttp

# A read returns once this much arrived (or the reader's buffer is full, or the body ended).
_WAKE = 64 * 1024
# Bytes that arrive while no reader's view has room (a TLS layer reading ahead) go here, then to the next reader.
_SPILL = 64 * 1024
# The most plaintext one TLS record carries: what the TLS object may hold already decrypted, beyond the
# ciphertext asyncio's TLS layer counts when it asks for a buffer.
_TLS_RECORD = 16 * 1024


class Receiver(asyncio.BufferedProtocol):
    """The rest of one response's body, read into the caller's buffers (see the module docstring).

    A body cut short raises :class:`ConnectionError` from :meth:`readinto`.
    """

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        # Only for a body aiohttp has not had whole: it releases the connection at the body's end.
        connection = response.connection
        assert connection is not None and connection.protocol is not None and connection.transport is not None
        assert response.content_length is not None
        inner = connection.protocol
        # What aiohttp's parser had already received of the body is read first, as spilled bytes are.
        self._spilled = bytearray(response.content.read_nowait(-1))
        # Paused after that read, which resumes a protocol its buffer had paused: the transport reads only into
        # this receiver's buffers from here on, and aiohttp's read timeout stops (the caller times readinto).
        inner.pause_reading()
        self._remaining = response.content_length - len(self._spilled)  # still in the socket
        self._inner = inner
        self._transport = connection.transport
        self._view: memoryview | None = None
        self._got = 0
        self._wake = 0
        self._spill = bytearray(_SPILL)
        self._into_spill = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: str | None = None
        # Its parser still expects this body: the connection must never serve another request.
        inner.force_close()
        self._transport.set_protocol(self)

    async def readinto(self, view: memoryview) -> int:
        """Bytes of the body written into ``view`` (at least one, or 0 at the body's end)."""
        while True:
            if self._spilled:
                n = min(len(view), len(self._spilled))
                view[:n] = self._spilled[:n]
                del self._spilled[:n]
                return n
            if self._remaining == 0 or not view:
                return 0
            if self._error is not None:
                raise ConnectionError(self._error)
            self._view, self._got, self._wake = view, 0, min(len(view), _WAKE, self._remaining)
            self._waiter = asyncio.get_running_loop().create_future()
            self._transport.resume_reading()
            try:
                await self._waiter
            finally:
                if not self._transport.is_closing():
                    self._transport.pause_reading()
                got, self._view, self._waiter = self._got, None, None
            if got:
                return got
            # Woken with nothing in the view: spilled bytes (taken above), the body's end, or an error.

    # asyncio.BufferedProtocol

    def get_buffer(self, sizehint: int) -> memoryview:
        view = self._view
        room = 0 if view is None else min(len(view) - self._got, self._remaining)
        # asyncio's TLS layer gives as ``sizehint`` the ciphertext it holds (a plain socket: -1); as it shuts
        # down it reads into one buffer only, and what did not fit would be lost.  What it may read is that
        # ciphertext's plaintext and a record the TLS object had already decrypted: the spill, unless the view
        # has room for all of it.
        need = sizehint + _TLS_RECORD if sizehint >= 0 else 0
        self._into_spill = room <= 0 or room < need
        if self._into_spill:
            if len(self._spill) < need:
                self._spill = bytearray(need)
            # Never empty (asyncio refuses that); a memoryview, as TLS reads into slices of it; bytes past the
            # body's end are dropped.
            return memoryview(self._spill)
        assert view is not None
        return view[self._got:self._got + room]

    def buffer_updated(self, nbytes: int) -> None:
        if self._into_spill:
            taken = min(nbytes, self._remaining)
            self._spilled += self._spill[:taken]
            self._remaining -= taken
            self._transport.pause_reading()
        else:
            self._got += nbytes
            self._remaining -= nbytes
            if self._got < self._wake and self._remaining:
                return
        self._wakeup()

    def eof_received(self) -> bool | None:
        self._ended("the connection was closed")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(f"connection lost ({exc})" if exc else "the connection was closed")
        # aiohttp's bookkeeping (a session closing waits for its protocols' ends) still hears of it.
        self._inner.connection_lost(exc)

    def _ended(self, why: str) -> None:
        if self._remaining and self._error is None:
            self._error = f"{why} with {self._remaining} bytes of the body still to come"
        self._wakeup()

    def _wakeup(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
