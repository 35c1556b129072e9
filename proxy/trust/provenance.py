"""PEP 740 attestations verified with ``pypi-attestations`` on ``sigstore``, and which Sigstore trust root does it.

:meth:`SigstoreTrust.verify` is the one verification of a provenance
object, for the gateway (:mod:`proxy.gateway.provenance`, at a file's first
publish) and the edge (``tufproxy serve --verify-provenance yes``): every
attestation is checked against the file's sha256 and name (the statement's
subject) and its bundle's publisher against the signing certificate.  No
Sigstore, DSSE or in-toto check is written here.

The trust root: ``production`` or ``staging``, refreshed over TUF by
sigstore-python, or with ``--sigstore-offline yes`` the one that ships
inside sigstore-python, never refreshed.  A FILE is a private trust root,
always offline.  Offline, sigstore-python's cache is pointed at a directory
of ours (:meth:`SigstoreTrust.prepare`), so no user cache and no network is
consulted.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from proxy.protocol import provenance as rules
from proxy.protocol.options import Option, yes_no
from proxy.protocol.provenance import Outcome, PublisherSpec

_SIGSTORE_URLS = {"production": "https://tuf-repo-cdn.sigstore.dev", "staging": "https://tuf-repo-cdn.sigstage.dev"}


def parse_trust_root(value: Any) -> str:
    text = str(value)
    if text in _SIGSTORE_URLS:
        return text
    if not Path(text).is_file():
        raise ValueError(f"give production, staging or a trusted_root.json FILE; {text[:200]!r} is no file")
    return str(Path(text).resolve())


SIGSTORE_OPTIONS: tuple[Option, ...] = (
    Option("sigstore_trust_root", "Sigstore trust root for PEP 740 attestations: production, staging, or a "
           "trusted_root.json FILE (always offline)", "production", parse_trust_root, metavar="ROOT"),
    Option("sigstore_offline", "yes: use the trust root shipped with sigstore-python (or FILE), never the network",
           "no", yes_no, metavar="yes|no"),
)


class SigstoreTrust:
    """Which Sigstore trust root verifies attestations, prepared once per process; see the module docstring."""

    def __init__(self, root: str = "production", offline: bool = False) -> None:
        self.staging = root == "staging"
        self.file = None if root in _SIGSTORE_URLS else Path(root)
        self.offline = offline or self.file is not None

    def prepare(self, home: Path) -> None:
        """Point sigstore-python's cache at ``home`` when offline, holding the shipped root (or FILE)."""
        logging.getLogger("sigstore._internal.tuf").setLevel(logging.ERROR)  # "offline mode" on every verify
        if not self.offline:
            return
        os.environ["XDG_CACHE_HOME"] = str(home / "cache")
        os.environ["XDG_DATA_HOME"] = str(home / "data")
        if self.file is not None:
            target = home / "cache" / "sigstore-python" / "tuf" / quote(_SIGSTORE_URLS["production"], safe="")
            target.mkdir(parents=True, exist_ok=True)
            (target / "trusted_root.json").write_bytes(self.file.read_bytes())

    def verify(self, data: bytes, filename: str, sha256: str) -> Outcome:
        """Verify provenance object ``data`` for the file; every attestation in it must hold."""
        # Imported here: pydantic and sigstore load only where provenance is on.
        import pydantic
        from pypi_attestations import AttestationError, Distribution, Provenance

        digest = hashlib.sha256(data).hexdigest()
        try:
            prov = Provenance.model_validate_json(data)
            dist = Distribution(name=filename, digest=sha256)
        except (pydantic.ValidationError, ValueError) as e:
            return Outcome("invalid", f"not a PEP 740 provenance object: {str(e).splitlines()[0][:200]}", digest=digest)
        seen: PublisherSpec | None = None
        for bundle in prov.attestation_bundles:
            try:
                publisher = rules.from_publisher(bundle.publisher.model_dump())
            except (ValueError, KeyError) as e:
                return Outcome("invalid", str(e), digest=digest)
            if not bundle.attestations:
                return Outcome("invalid", "an attestation bundle with no attestation", digest=digest)
            for attestation in bundle.attestations:
                try:
                    attestation.verify(bundle.publisher, dist, staging=self.staging, offline=self.offline)
                except AttestationError as e:
                    return Outcome("invalid", f"{str(e)[:300]}", publisher, digest)
                except Exception as e:  # noqa: BLE001 - sigstore raises others on junk (bad DER, TUF): invalid, never a crash
                    return Outcome("invalid", f"{type(e).__name__}: {str(e)[:300]}", publisher, digest)
            if seen is not None and seen != publisher:
                return Outcome("invalid", f"attestations from two publishers ({seen}, {publisher})", publisher, digest)
            seen = publisher
        if seen is None:
            return Outcome("invalid", "no attestation bundle", digest=digest)
        return Outcome("verified", publisher=seen, digest=digest)
