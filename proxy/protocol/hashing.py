"""The one hash check: which digests vouch for bytes, and checking bytes as they stream.

Every path that accepts bytes on the strength of signed hashes (a target
from TUF metadata, a file through a verified page's ``sha256=``, a blob
re-read from a cache) checks them here, so there is one list of accepted
algorithms and one way a mismatch is reported:

* :func:`accepted_hashes` keeps the algorithms we check and refuses a
  target that names none of them, or whose digests are not well-formed
  hex of the algorithm's size (a typed refusal, never a ``ValueError``).
* :class:`StreamingVerifier` is fed chunks as they arrive and says at the
  end whether length and every accepted hash matched.  It does no I/O;
  callers that want hashing off the event loop count bytes with
  :meth:`~StreamingVerifier.admit` and run :meth:`~StreamingVerifier.hash`
  in a thread (hashlib releases the GIL for large buffers).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping

from proxy.protocol.errors import HashMismatch, LengthMismatch, RepositoryError

# TUF / securesystemslib spellings; blake2b-256 is BLAKE2b with a 32-byte digest (PyPI's draft).
ACCEPTED = ("sha256", "sha384", "sha512", "blake2b-256")
_DIGEST_HEX_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128, "blake2b-256": 64}
_HEX = re.compile(r"[0-9a-f]+")


class UnsupportedHashes(RepositoryError):
    """The signer vouched for bytes with no hash we check, or with a malformed digest."""

    reason = "unsupported-hash"


def new_hash(algorithm: str) -> hashlib._Hash:
    """A hashlib object for one of :data:`ACCEPTED` (anything else: :class:`UnsupportedHashes`)."""
    if algorithm == "blake2b-256":
        return hashlib.blake2b(digest_size=32)  # type: ignore[return-value]  # typeshed: no common base
    if algorithm not in ACCEPTED:
        raise UnsupportedHashes(f"unsupported hash algorithm {algorithm!r}")
    return hashlib.new(algorithm)


def accepted_hashes(target: str, hashes: Mapping[str, str], role: str | None = None) -> dict[str, str]:
    """The entries of ``hashes`` we check, each a well-formed lowercase digest.

    Algorithms outside :data:`ACCEPTED` are ignored when an accepted one is
    present (python-tuf checks only what it knows, too); none at all, or a
    digest of the wrong shape, is a refusal: the signer vouched for nothing
    we can check.
    """
    kept: dict[str, str] = {}
    for algorithm, value in hashes.items():
        if algorithm not in _DIGEST_HEX_LENGTH:
            continue
        if not isinstance(value, str) or len(value) != _DIGEST_HEX_LENGTH[algorithm] or not _HEX.fullmatch(value):
            raise UnsupportedHashes(f"{target}: malformed {algorithm} digest {str(value)[:140]!r}",
                                    target=target, role=role, actual=str(value)[:140])
        kept[algorithm] = value
    if not kept:
        raise UnsupportedHashes(
            f"{target}: signed with no hash we check (has {', '.join(sorted(hashes)) or 'none'}; "
            f"accepted: {', '.join(ACCEPTED)})",
            target=target, role=role, expected=list(ACCEPTED), actual=sorted(hashes))
    return kept


class StreamingVerifier:
    """Length and hashes of a body, checked chunk by chunk.

    ``length`` is the signed length when ``exact``, otherwise only an upper
    bound (a file trusted through a page that gives no size).  :meth:`update`
    refuses as soon as the bound is passed; :meth:`finish` refuses a short
    body or any differing digest.  Always check ``finish`` before treating
    the bytes as verified.
    """

    def __init__(self, target: str, hashes: Mapping[str, str], length: int, *,
                 exact: bool = True, role: str | None = None, also: tuple[str, ...] = ()) -> None:
        self.target = target
        self.role = role
        self.expected = accepted_hashes(target, hashes, role)
        self.length = length
        self.exact = exact
        self.received = 0
        # ``also``: digests computed besides the signed ones (a store names blobs by sha256).
        self._hashers = {a: new_hash(a) for a in (*self.expected, *also)}

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self.admit(len(chunk))
        self.hash(chunk)

    def admit(self, n: int) -> None:
        """Count ``n`` more bytes; past the bound, refuse before they are kept anywhere.

        Over-long bodies have one ``actual``: the bytes received (or announced) when
        reading stopped, always more than ``expected``.
        """
        self.received += n
        if self.received > self.length:
            raise over_length(self.target, self.length, self.received, exact=self.exact, role=self.role)

    def hash(self, chunk: bytes | bytearray | memoryview) -> None:
        """Hash bytes already counted by :meth:`admit` (safe in a thread: hashlib releases the GIL)."""
        for h in self._hashers.values():
            h.update(chunk)

    def updaters(self) -> list[Callable[[bytes | bytearray | memoryview], None]]:
        """One hashing function per digest, for bytes already admitted: :meth:`hash` split, so
        the digests of one chunk can run in threads of their own at once."""
        return [h.update for h in self._hashers.values()]

    def restart(self) -> None:
        """Forget every byte: the body starts over (from another mirror)."""
        self.received = 0
        self._hashers = {a: new_hash(a) for a in self._hashers}

    def digests(self) -> dict[str, str]:
        return {a: h.hexdigest() for a, h in self._hashers.items()}

    def finish(self) -> dict[str, str]:
        """The digests, once the body is complete and matches; a typed refusal otherwise."""
        if self.exact and self.received != self.length:
            raise LengthMismatch(f"{self.target}: {self.received} bytes, {self.length} signed",
                                 target=self.target, role=self.role, expected=self.length, actual=self.received)
        actual = self.digests()
        for algorithm, expected in self.expected.items():
            if actual[algorithm] != expected:
                raise HashMismatch(f"{self.target}: {algorithm} {actual[algorithm]}, {expected} signed",
                                   target=self.target, role=self.role, expected=expected, actual=actual[algorithm])
        return actual


def over_length(target: str, length: int, actual: int, *, exact: bool = True, role: str | None = None) -> LengthMismatch:
    """The refusal of a body longer than ``length`` (``actual``: bytes received or announced)."""
    return LengthMismatch(f"{target}: {actual} bytes or more, {length} {'signed' if exact else 'allowed'}",
                          target=target, role=role, expected=length, actual=actual)


def verify_bytes(target: str, hashes: Mapping[str, str], length: int, data: bytes, *,
                 exact: bool = True, role: str | None = None) -> None:
    """:class:`StreamingVerifier` over one buffer (pages, metadata-sized things)."""
    verifier = StreamingVerifier(target, hashes, length, exact=exact, role=role)
    verifier.update(data)
    verifier.finish()
