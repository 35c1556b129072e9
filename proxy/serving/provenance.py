"""``tufproxy serve --verify-provenance yes``: the edge re-verifies PEP 740 provenance itself.

Before an edge answers with a distribution file of the gateway profile,
:meth:`EdgeProvenance.check` verifies the file's provenance object (the
signed target beside its page, fetched and hash-checked through TUF like a
page) with the edge's own Sigstore trust root
(:class:`proxy.trust.provenance.SigstoreTrust`), against the file's sha256
and name as the signed page gives them, and against the publisher this
edge pinned for the project: the first verified one, kept in
``--cache-dir``'s ``provenance-pins.jsonl`` (append-only, survives
restarts).  So a holder of the gateway's online key who signs a swapped
file, drops a pinned project's provenance, or names another publisher,
still cannot get the file past the edge: that is a
:class:`ProvenanceRefused`, refused and audited by the one refusal table.
A file verified once is not verified again in this process.  One whose
provenance cannot be checked now (online, no current Sigstore trust root)
is a :class:`ProvenanceUnavailable`: refused as the upstream's fault, and
tried again at the next request.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from proxy.protocol import provenance as rules
from proxy.protocol.errors import RepositoryError, TrustError
from proxy.protocol.provenance import PublisherSpec
from proxy.trust.provenance import SigstoreTrust

MAX_VERIFIED = 100_000


class ProvenanceRefused(RepositoryError):
    """A file whose provenance does not hold at the edge; each subclass is one rule."""

    def __init__(self, target: str, message: str, expected: str | None, seen: str | None) -> None:
        super().__init__(f"{target}: {message}", target=target, expected=expected, actual=seen)


class ProvenanceInvalid(ProvenanceRefused):
    reason = rules.RULE_INVALID


class ProvenanceMissing(ProvenanceRefused):
    reason = rules.RULE_MISSING


class PublisherChanged(ProvenanceRefused):
    reason = rules.RULE_CHANGED


class ProvenanceUnavailable(TrustError):
    """The file's provenance cannot be checked now: an upstream's fault (TrustError's), not the repository's."""

    reason = rules.RULE_UNAVAILABLE


class EdgeProvenance:
    """See the module docstring."""

    def __init__(self, trust: SigstoreTrust, pins_path: Path) -> None:
        self.trust = trust
        self.pins_path = pins_path
        self.pins: dict[str, PublisherSpec] = {}
        self._verified: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            lines = self.pins_path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                record = json.loads(line)
                self.pins.setdefault(record["project"], rules.parse_spec(record["spec"]))
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: never fatal

    def _pin(self, project: str, spec: PublisherSpec) -> None:
        with self._lock:
            self._load()  # another worker may have pinned it first: the first pin wins
            if project in self.pins:
                return
            fd = os.open(self.pins_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, json.dumps({"project": project, "spec": str(spec)}).encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            self.pins[project] = spec

    def known(self, target: str, sha256: str) -> bool:
        return (target, sha256) in self._verified

    async def check(self, project: str, filename: str, target: str, sha256: str, data: bytes | None) -> None:
        """Raise :class:`ProvenanceRefused` unless ``data`` (None: the page names no provenance) holds for the file."""
        pinned = self.pins.get(project)
        if data is None:
            if pinned is not None:
                raise ProvenanceMissing(target, f"no provenance, and {project} is pinned to {pinned}",
                                        str(pinned), None)
            return
        outcome = await self.trust.check(data, filename, sha256)
        seen = str(outcome.publisher) if outcome.publisher else None
        if outcome.state == "unavailable":
            raise ProvenanceUnavailable(f"{target}: provenance cannot be checked now: {outcome.detail}", target=target)
        if outcome.state != "verified":
            raise ProvenanceInvalid(target, f"provenance does not verify: {outcome.detail}",
                                    str(pinned) if pinned else None, seen)
        assert outcome.publisher is not None
        if pinned is not None and not pinned.matches(outcome.publisher):
            raise PublisherChanged(target, f"published by {seen}, but {project} is pinned to {pinned}",
                                    str(pinned), seen)
        if pinned is None:
            self._pin(project, outcome.publisher)
        if len(self._verified) >= MAX_VERIFIED:
            self._verified.clear()
        self._verified.add((target, sha256))
