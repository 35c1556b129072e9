"""SoftHSM2 tokens for tests: a real PKCS#11 module, its store in a temporary directory.

:class:`SoftHSM` writes its own ``softhsm2.conf`` (``SOFTHSM2_CONF``) under the
test's temporary directory, so tests never see each other's tokens or the
machine's; :meth:`SoftHSM.token` initialises a token (``softhsm2-util``) and
:meth:`SoftHSM.keypair` generates a key in it with ``pkcs11-tool``, as an
operator would.  Processes see the store through :attr:`SoftHSM.env`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.protocol.keyuri import pkcs11_uri

MODULE = "/usr/lib/softhsm/libsofthsm2.so"
SO_PIN = "8642"


def available() -> bool:
    return Path(MODULE).is_file() and shutil.which("pkcs11-tool") is not None and shutil.which("softhsm2-util") is not None


def isolated_store(directory: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHSM:
    """A store of the test's own, seen by every process the test starts; skips the test without SoftHSM2."""
    if not available():
        pytest.skip("softhsm2 and opensc (pkcs11-tool) are not installed")
    store = SoftHSM(directory)
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TUFPROXY_PKCS11_PIN", raising=False)
    return store


class SoftHSM:
    """One SoftHSM2 store (any number of tokens) under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tokens = directory / "tokens"
        self.tokens.mkdir(parents=True, exist_ok=True)
        self.conf = directory / "softhsm2.conf"
        self.conf.write_text(f"directories.tokendir = {self.tokens}\nobjectstore.backend = file\nlog.level = ERROR\n")
        self.env = {"SOFTHSM2_CONF": str(self.conf)}

    def _tool(self, *args: str) -> str:
        r = subprocess.run(["pkcs11-tool", "--module", MODULE, *args], capture_output=True, text=True, timeout=60,
                           env={**os.environ, **self.env})
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def token(self, label: str, pin: str) -> None:
        """Initialise a token labelled ``label`` with user PIN ``pin`` in the next free slot."""
        r = subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", SO_PIN, "--pin", pin],
                           capture_output=True, text=True, timeout=60, env={**os.environ, **self.env})
        assert r.returncode == 0, r.stdout + r.stderr

    def keypair(self, token: str, pin: str, label: str, key_id: str = "01", key_type: str = "EC:prime256v1") -> None:
        """Generate a key pair on ``token`` (both halves labelled ``label``, CKA_ID ``key_id`` in hex)."""
        self._tool("--token-label", token, "--login", "--pin", pin, "--keypairgen", "--key-type", key_type,
                   "--label", label, "--id", key_id)

    def token_dirs(self) -> list[Path]:
        return sorted(p for p in self.tokens.iterdir() if p.is_dir())

    @staticmethod
    def uri(token: str, label: str, **kw: str) -> str:
        return pkcs11_uri(token, object=label, module_path=MODULE, **kw)
