"""The signer's private keys: generated, stored and loaded, never served.

Keys live in ``<repo>/keys/`` (mode 0700), one PKCS#8 PEM file per key
(mode 0600), named by role: ``root-<keyid prefix>.pem`` for each root key,
``targets.pem`` and ``bins.pem`` (offline roles) and ``online.pem`` (the one
key PEP 458 gives timestamp, snapshot and every bin-n role).  An
organisation that keeps offline keys offline moves those files away and
brings them back only for ``rotate-root`` or a targets/bins re-sign.

A role may instead be named by a key URI (a PKCS#11 token, a cloud KMS:
:mod:`proxy.repository.keysource`): ``keys/uris.json`` then keeps its URI
(never a PIN) and public key, no private key of that role is ever written
here, and :meth:`KeyStore.load` gives securesystemslib's signer for it.  The
file is re-read when it changes, so a running signer takes up a key the root
ceremony rotated without a restart.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner, Key, Signer

from proxy.protocol.errors import Fault
from proxy.protocol.keyuri import storable
from proxy.repository.keysource import KeyUnavailable, import_key, open_signer
from proxy.util.atomic import atomic_write

ONLINE = "online"
TARGETS = "targets"
BINS = "bins"
ROOT = "root"
URIS = "uris.json"


@dataclass(frozen=True)
class KeyURIs:
    """The keys ``init`` is given by URI instead of generating files (``root``: all root keys, or none)."""

    online: str | None = None
    targets: str | None = None
    bins: str | None = None
    root: tuple[str, ...] = ()


class MissingKey(Exception):
    """A role's private key is not in the key directory."""

    reason = "missing-key"
    fault = Fault.OPERATOR


class KeyStore:
    """Private keys of one repository, by role."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._opened: dict[tuple[str, str], Signer] = {}  # (uri, keyid) -> a signer that worked
        self._uris: tuple[tuple[int, int] | None, dict[str, object]] = (None, {})
        self._guard = threading.Lock()

    # -- keys named by URI ---------------------------------------------
    def uris(self) -> dict[str, object]:
        """``uris.json``: role -> {"uri", "public_key"} (``root``: a list of them); re-read when it changed."""
        path = self.directory / URIS
        try:
            st = os.stat(path)
            stamp: tuple[int, int] | None = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        with self._guard:
            if stamp != self._uris[0]:
                self._uris = (stamp, json.loads(path.read_bytes()) if stamp is not None else {})
            return self._uris[1]

    def named(self, name: str) -> tuple[str, Key] | None:
        """The URI and public key of role ``name``, when a URI names its key."""
        entry = self.uris().get(name)
        if not isinstance(entry, dict):
            return None
        return entry["uri"], Key.from_dict(entry["keyid"], dict(entry["public_key"]))

    def adopt(self, name: str, uri: str) -> Signer:
        """Read the public key ``uri`` names, prove the key signs, and record it for role ``name`` (``root``: added)."""
        _, public = import_key(uri)
        signer = self.open(uri, public)
        self.record(name, uri, public)
        return signer

    def record(self, name: str, uri: str, public: Key) -> None:
        """Role ``name``'s key is ``uri`` from now on (its key file here, if any, is retired)."""
        current = self.directory / f"{name}.pem"
        if name != ROOT and current.exists():
            retired = self.directory / "retired"
            retired.mkdir(mode=0o700, exist_ok=True)
            os.replace(current, retired / f"{name}-{self.load_file(name).public_key.keyid[:16]}.pem")
        entry = {"uri": storable(uri), "keyid": public.keyid, "public_key": public.to_dict()}
        uris = dict(self.uris())
        if name == ROOT:
            uris[ROOT] = [*[e for e in uris.get(ROOT, []) if e["keyid"] != public.keyid], entry]  # type: ignore[attr-defined]
        else:
            uris[name] = entry
        self._write_uris(uris)

    def forget(self, name: str) -> None:
        """Role ``name`` is no longer named by a URI (its key is a file here again)."""
        uris = dict(self.uris())
        if uris.pop(name, None) is not None:
            self._write_uris(uris)

    def _write_uris(self, uris: dict[str, object]) -> None:
        atomic_write(self.directory / URIS, json.dumps(uris, indent=2, sort_keys=True).encode() + b"\n", mode=0o600)

    def open(self, uri: str, public: Key) -> Signer:
        """A signer for ``uri`` that has signed for ``public`` (``KeyUnavailable`` otherwise); kept for reuse."""
        cached = self._opened.get((storable(uri), public.keyid))
        if cached is None:
            cached = self._opened[(storable(uri), public.keyid)] = open_signer(uri, public)
        return cached

    def check(self, name: str) -> None:
        """Prove role ``name``'s key signs now (a URI's: one probe signature), else ``KeyUnavailable`` saying why."""
        named = self.named(name)
        if named is None:
            try:
                self.load_file(name)
            except MissingKey as e:
                raise KeyUnavailable(str(e)) from None
            return
        self._opened.pop((named[0], named[1].keyid), None)
        self.open(*named)

    # -- key files -----------------------------------------------------

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
        if current.exists():
            old = self.load_file(name)
            keep = retired / f"{name}-{old.public_key.keyid[:16]}.pem"
            if not keep.exists():
                os.link(current, keep)
        # Replace in one step: there is never a moment without a current key.
        os.replace(self.directory / f"{name}.next.pem", current)
        self.forget(name)

    def load(self, name: str) -> Signer:
        """Role ``name``'s signer: the key its URI names, else its file here."""
        named = self.named(name)
        if named is not None:
            return self.open(*named)
        return self.load_file(name)

    def load_file(self, name: str) -> CryptoSigner:
        path = self.directory / f"{name}.pem"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise MissingKey(f"no private key for {name!r} at {path}") from None
        return CryptoSigner(load_pem_private_key(data, password=None))

    def root_signers(self, keyids: list[str]) -> list[Signer]:
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
