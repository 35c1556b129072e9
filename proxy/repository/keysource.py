"""Keys named by URI: read a public key from where the private key lives, and sign with it.

:func:`import_key` reads the public key a URI's private key belongs to (from
the token, the KMS or the file), for ``init`` to put in root and the ceremony
to add.  :func:`open_signer` makes securesystemslib's signer for a URI and
proves it works with one probe signature checked against the public key the
metadata lists: a missing token, a wrong PIN, a missing object, a key of
another type or another key altogether is a :class:`KeyUnavailable` naming the
URI (PIN elided), before anything is served.  Its signer raises
:class:`SigningError` when a later signature fails (token removed, KMS
unreachable), so callers tell a key's failure from any other.

``pkcs11:`` URIs are registered with securesystemslib as one more private-key
scheme (:class:`~proxy.repository.tokens.Pkcs11Signer`); every other scheme is
securesystemslib's, passed through unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from securesystemslib.exceptions import UnsupportedLibraryError
from securesystemslib.signer import (
    SIGNER_FOR_URI_SCHEME,
    AWSSigner,
    AzureSigner,
    CryptoSigner,
    GCPSigner,
    HSMSigner,
    Key,
    Signature,
    Signer,
    SSlibKey,
    VaultSigner,
)

from proxy.protocol.errors import Fault
from proxy.protocol.keyuri import PIN_ENV, PKCS11, KeyURIError, printable, scheme
from proxy.repository.tokens import Pkcs11Signer
from proxy.repository.tokens import import_key as import_token_key

_PROBE = b"tufproxy: does this key sign?"
_EXTRA = {"hsm": "hsm", PKCS11: "hsm", "awskms": "kms", "gcpkms": "kms", "azurekms": "kms", "hv": "kms"}


class KeyUnavailable(Exception):
    """A key URI that cannot sign now; one line naming the URI with the PIN elided.

    ``retry`` is False when asking again could do harm (a wrong PIN counts towards locking the token);
    ``transient`` is True when asking again a moment later is likely to succeed (a token busy with
    another process).
    """

    reason = "signing-unavailable"
    fault = Fault.OURS  # our key's token or KMS, not the index nor the client

    def __init__(self, message: str, retry: bool = True, transient: bool = False) -> None:
        super().__init__(message)
        self.retry = retry
        self.transient = transient

    @classmethod
    def of(cls, uri: str, e: BaseException) -> KeyUnavailable:
        """``e``, any signer library's failure for ``uri``, as one of these."""
        return cls(_describe(uri, e), getattr(e, "retry", True), getattr(e, "transient", False))


class SigningError(KeyUnavailable):
    """A signature failed at run time (token removed, KMS unreachable): nothing was signed."""


SIGNER_FOR_URI_SCHEME.setdefault(PKCS11, Pkcs11Signer)


def _pin(_what: str) -> str:
    """The PIN securesystemslib's own ``hsm:`` signer asks for."""
    pin = os.environ.get(PIN_ENV)
    if pin is None:
        raise KeyUnavailable(f"hsm: keys need their PIN in {PIN_ENV}")
    return pin


def _describe(uri: str, e: BaseException) -> str:
    """One line: the URI (PIN elided) and why."""
    why = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, UnsupportedLibraryError):
        extra = _EXTRA.get(uri.partition(":")[0].lower())
        why += f": pip install 'tufproxy[{extra}]'" if extra else ""
    shown = printable(uri)
    return why[:400] if why.startswith(shown) else f"{shown}: {why[:300]}"


def _import(uri: str) -> tuple[str, SSlibKey]:
    kind = scheme(uri)
    if kind == PKCS11:
        return uri, import_token_key(uri)
    parts = urlsplit(uri)
    if kind == CryptoSigner.SCHEME:
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        data = Path(parts.path).read_bytes()
        return uri, CryptoSigner(load_pem_private_key(data, password=None)).public_key
    if kind == HSMSigner.SCHEME:
        label = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p).get("label")
        return HSMSigner.import_(int(parts.path) if parts.path else None, label, _pin)
    if kind == AWSSigner.SCHEME:
        return AWSSigner.import_(parts.path)
    if kind == GCPSigner.SCHEME:
        return GCPSigner.import_(parts.path)
    if kind == AzureSigner.SCHEME:
        segments = parts.path.strip("/").split("/")
        if not parts.netloc or len(segments) < 2 or segments[0] != "keys":
            raise KeyURIError("expected azurekms://VAULT.vault.azure.net/keys/NAME[/VERSION]")
        return AzureSigner.import_(parts.netloc.split(".")[0], segments[1])
    if kind == VaultSigner.SCHEME:
        name = parts.path.partition("/")[0]
        if not name:
            raise KeyURIError("expected hv:NAME[/VERSION]")
        return VaultSigner.import_(name)
    if kind in SIGNER_FOR_URI_SCHEME:
        raise KeyURIError(f"tufproxy cannot read the public key of a {kind}: key; use pkcs11:, hsm:, file2:, "
                          "awskms:, gcpkms:, azurekms: or hv:")
    raise KeyURIError(f"unknown key URI scheme {kind!r}; known: " + ", ".join(sorted(SIGNER_FOR_URI_SCHEME)))


def import_key(uri: str) -> tuple[str, SSlibKey]:
    """The URI to sign with later and the public key of the private key ``uri`` names."""
    try:
        return _import(uri)
    except Exception as e:  # noqa: BLE001 - every signer library has its own errors: all mean "cannot use this key"
        raise KeyUnavailable.of(uri, e) from None


class _Guarded(Signer):
    """A URI signer whose failures are :class:`SigningError`."""

    def __init__(self, uri: str, inner: Signer) -> None:
        self.uri = uri
        self.inner = inner

    @property
    def public_key(self) -> Key:
        return self.inner.public_key

    @classmethod
    def from_priv_key_uri(cls, priv_key_uri: str, public_key: Key, secrets_handler: object = None) -> Signer:
        raise NotImplementedError  # only made by open_signer

    def sign(self, payload: bytes) -> Signature:
        try:
            return self.inner.sign(payload)
        except Exception as e:  # noqa: BLE001 - any signer library's failure means "not signed"
            raise SigningError.of(self.uri, e) from None


def open_signer(uri: str, public_key: Key) -> Signer:
    """A signer for ``uri`` that has just made a signature ``public_key`` verifies."""
    try:
        scheme(uri)
        inner = Signer.from_priv_key_uri(uri, public_key, _pin)
        signature = inner.sign(_PROBE)
    except Exception as e:  # noqa: BLE001 - see import_key
        raise KeyUnavailable.of(uri, e) from None
    try:
        public_key.verify_signature(signature, _PROBE)
    except Exception:  # noqa: BLE001 - securesystemslib's VerificationError and friends
        raise KeyUnavailable(f"{printable(uri)}: this key is not the one the metadata lists "
                             f"(keyid {public_key.keyid[:16]}...)") from None
    return _Guarded(uri, inner)
