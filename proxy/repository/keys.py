"""The signer's private keys: generated, stored and loaded, never served.

Keys live in ``<repo>/keys/`` (mode 0700), one PKCS#8 PEM file per key
(mode 0600), named by role: ``root-<keyid prefix>.pem`` for each root key,
``targets.pem`` and ``bins.pem`` (offline roles) and ``online.pem`` (the one
key PEP 458 gives timestamp, snapshot and every bin-n role).  An
organisation that keeps offline keys offline moves those files away and
brings them back only for ``rotate-root`` or a targets/bins re-sign.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner

from proxy.protocol.errors import Fault
from proxy.util.atomic import atomic_write

ONLINE = "online"
TARGETS = "targets"
BINS = "bins"


class MissingKey(Exception):
    """A role's private key is not in the key directory."""

    reason = "missing-key"
    fault = Fault.OPERATOR


class KeyStore:
    """Private keys of one repository, by role."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def create_dir(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)

    def generate(self, name: str) -> CryptoSigner:
        """Make a new ed25519 key and store it as ``<name>.pem``."""
        signer = CryptoSigner.generate_ed25519()
        atomic_write(self.directory / f"{name}.pem", signer.private_bytes, mode=0o600)
        return signer

    def generate_root(self) -> CryptoSigner:
        signer = CryptoSigner.generate_ed25519()
        atomic_write(self.directory / f"root-{signer.public_key.keyid[:16]}.pem", signer.private_bytes, mode=0o600)
        return signer

    def stage(self, name: str) -> CryptoSigner:
        """A new key for ``name``, stored aside until :meth:`promote` (after its change landed)."""
        signer = CryptoSigner.generate_ed25519()
        atomic_write(self.directory / f"{name}.next.pem", signer.private_bytes, mode=0o600)
        return signer

    def promote(self, name: str) -> None:
        """Make the staged key current; the old one goes to ``retired/``."""
        current = self.directory / f"{name}.pem"
        retired = self.directory / "retired"
        retired.mkdir(mode=0o700, exist_ok=True)
        old = self.load(name)
        keep = retired / f"{name}-{old.public_key.keyid[:16]}.pem"
        if not keep.exists():
            os.link(current, keep)
        # Replace in one step: there is never a moment without a current key.
        os.replace(self.directory / f"{name}.next.pem", current)

    def load(self, name: str) -> CryptoSigner:
        path = self.directory / f"{name}.pem"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise MissingKey(f"no private key for {name!r} at {path}") from None
        return CryptoSigner(load_pem_private_key(data, password=None))

    def root_signers(self, keyids: list[str]) -> list[CryptoSigner]:
        """The root keys present here among ``keyids``."""
        found = []
        for keyid in keyids:
            try:
                found.append(self.load(f"root-{keyid[:16]}"))
            except MissingKey:
                continue
        return found

    def retire_root(self, keyid: str) -> None:
        """Move an old root key out of use (kept, so old roots stay explainable)."""
        retired = self.directory / "retired"
        retired.mkdir(mode=0o700, exist_ok=True)
        src = self.directory / f"root-{keyid[:16]}.pem"
        if src.exists():
            os.replace(src, retired / src.name)
