"""PKCS#11 keys named by RFC 7512 ``pkcs11:`` URIs, signed with securesystemslib's ``HSMSigner``.

This module only finds things: the module (``module-path=`` or ``$PYKCS11LIB``),
the token (``token=``), the key (``object=`` label and/or ``id=``) and the PIN
(``pin-value=``, ``pin-source=file:``, else ``$TUFPROXY_PKCS11_PIN``), through
python-pkcs11, the library securesystemslib's ``[hsm]`` extra brings.  Hashing,
the signing mechanism and the signature's encoding are ``HSMSigner.sign``'s.

A token that vanished (unplugged, its SoftHSM2 store moved) leaves the
library's state stale; after a failed signature the next one re-initialises
the module first, so a token put back is used again without a restart.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from securesystemslib.signer import ECDSA_SHA2_NISTP256, ECDSA_SHA2_NISTP384, HSMSigner, Key, SSlibKey

from proxy.protocol.errors import Fault
from proxy.protocol.keyuri import MODULE_ENV, PIN_ENV, KeyURIError, Pkcs11URI, parse_pkcs11, printable

_SCHEMES = {"secp256r1": ECDSA_SHA2_NISTP256, "secp384r1": ECDSA_SHA2_NISTP384}
# Modules (by path) whose process-wide state a failure may have left stale: re-initialised before next use.
_STALE: set[str] = set()
# One token operation at a time in a process: a re-initialisation must not pull a module from under a
# signature another thread (the publisher's batch, its back-off probe) is making.
_LOCK = threading.RLock()


class TokenError(Exception):
    """A token, key or PIN a ``pkcs11:`` URI names cannot be used; one line naming the URI (PIN elided).

    ``retry`` is False for a wrong or locked PIN: trying it again would count
    against the token's PIN retry limit and lock it. ``transient`` is True for
    the module's generic failures (``CKR_GENERAL_ERROR`` and kin), which SoftHSM2
    returns while another process logs in to the same token: asked again a moment
    later, it answers.
    """

    reason = "signing-unavailable"
    fault = Fault.OURS

    def __init__(self, message: str, retry: bool = True, transient: bool = False) -> None:
        super().__init__(message)
        self.retry = retry
        self.transient = transient


def _pkcs11() -> Any:
    try:
        import pkcs11
        import pkcs11.util.ec
    except ImportError:
        raise TokenError("PKCS#11 keys need python-pkcs11: pip install 'tufproxy[hsm]'") from None
    return pkcs11


class _Token:
    """One ``pkcs11:`` URI resolved: the module, the token, the PIN source."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.shown = printable(uri)
        try:
            self.parts: Pkcs11URI = parse_pkcs11(uri)
        except KeyURIError as e:
            raise TokenError(str(e)) from None
        module = self.parts.module_path or os.environ.get(MODULE_ENV)
        if not module:
            raise TokenError(f"{self.shown}: name the PKCS#11 module with module-path= (or set {MODULE_ENV})")
        self.module: str = module

    def fail(self, why: str, stale: bool = False, retry: bool = True, transient: bool = False) -> TokenError:
        if stale:
            _STALE.add(self.module)
        return TokenError(f"{self.shown}: {why}", retry, transient)

    def pin(self, _what: str = "pin") -> str:
        if self.parts.pin_value is not None:
            return self.parts.pin_value
        if self.parts.pin_source is not None:
            try:
                return Path(self.parts.pin_source).read_text().rstrip("\r\n")
            except OSError as e:
                raise self.fail(f"cannot read the PIN from {self.parts.pin_source}: {e.strerror}") from None
        pin = os.environ.get(PIN_ENV)
        if pin is None:
            raise self.fail(f"no PIN: give pin-source=file:/path in the URI or set {PIN_ENV}")
        return pin

    def lib(self) -> Any:
        pkcs11 = _pkcs11()
        try:
            lib = pkcs11.lib(self.module)
        except RuntimeError as e:  # python-pkcs11's "cannot open" (a missing file, not a module)
            raise self.fail(f"cannot load the PKCS#11 module {self.module}: {e}") from None
        if self.module in _STALE:
            lib.reinitialize()
            _STALE.discard(self.module)
        return lib

    def token(self) -> Any:
        pkcs11 = _pkcs11()
        try:
            return self.lib().get_token(token_label=self.parts.token)
        except pkcs11.exceptions.NoSuchToken:
            # Stale too: some modules (SoftHSM2) see a token plugged in later only after re-initialising.
            raise self.fail(f"no token labelled {self.parts.token!r} in {self.module}", stale=True) from None
        except pkcs11.exceptions.MultipleTokensReturned:
            raise self.fail("more than one token matches: name it with token=LABEL") from None
        except pkcs11.exceptions.PKCS11Error as e:
            raise self.fail(f"token not reachable ({type(e).__name__})", stale=True, transient=True) from None

    def open(self) -> Any:
        """A logged-in session (a context manager)."""
        pkcs11 = _pkcs11()
        token = self.token()
        try:
            return token.open(user_pin=self.pin())
        except (pkcs11.exceptions.PinIncorrect, pkcs11.exceptions.PinLenRange):
            raise self.fail("wrong PIN", retry=False) from None
        except pkcs11.exceptions.PinLocked:
            raise self.fail("the token's PIN is locked", retry=False) from None
        except pkcs11.exceptions.PKCS11Error as e:
            raise self.fail(f"cannot log in to the token ({type(e).__name__})", stale=True, transient=True) from None

    def find(self, session: Any, object_class: Any) -> Any:
        pkcs11 = _pkcs11()
        attrs: dict[str, Any] = {}
        if self.parts.object is not None:
            attrs["label"] = self.parts.object
        if self.parts.id is not None:
            attrs["id"] = self.parts.id
        try:
            return session.get_key(object_class, **attrs)
        except pkcs11.exceptions.NoSuchKey:
            kind = "private key" if object_class == pkcs11.ObjectClass.PRIVATE_KEY else "public key"
            raise self.fail(f"no {kind} with that object=/id= on token {self.parts.token!r}") from None
        except pkcs11.exceptions.MultipleObjectsReturned:
            raise self.fail("more than one key matches: name it with object= and id=") from None


def import_key(uri: str) -> SSlibKey:
    """The public key of the private key ``uri`` names, read from the token (which must hold both)."""
    pkcs11 = _pkcs11()
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
    from cryptography.hazmat.primitives.serialization import load_der_public_key

    token = _Token(uri)
    with _LOCK, token.open() as session:
        private = token.find(session, pkcs11.ObjectClass.PRIVATE_KEY)
        if private.key_type != pkcs11.KeyType.EC:
            raise token.fail(f"unsupported key type {private.key_type.name}: tufproxy signs with ECDSA P-256 "
                             "or P-384 keys on a PKCS#11 token")
        public = token.find(session, pkcs11.ObjectClass.PUBLIC_KEY)
        try:
            key = load_der_public_key(pkcs11.util.ec.encode_ec_public_key(public))
        except (ValueError, TypeError, pkcs11.exceptions.PKCS11Error) as e:
            raise token.fail(f"unsupported EC key ({e}): tufproxy signs with ECDSA P-256 or P-384") from None
    if not isinstance(key, EllipticCurvePublicKey) or key.curve.name not in _SCHEMES:
        raise token.fail("unsupported key type (Ed25519 or another curve): HSMSigner signs with ECDSA P-256 or P-384")
    return SSlibKey.from_crypto(key, scheme=_SCHEMES[key.curve.name])


class Pkcs11Signer(HSMSigner):
    """securesystemslib's ``HSMSigner``, finding its token and key the way a ``pkcs11:`` URI says."""

    def __init__(self, uri: str, public_key: SSlibKey) -> None:
        self._token = _Token(uri)
        super().__init__(0, public_key, self._token.pin, self._token.parts.token)

    @classmethod
    def from_priv_key_uri(cls, priv_key_uri: str, public_key: Key, secrets_handler: object = None) -> Pkcs11Signer:
        if not isinstance(public_key, SSlibKey):
            raise ValueError("expected an SSlibKey")
        # The token's own answer first: a key of another type, or another key, is named as such.
        if import_key(priv_key_uri).keyid != public_key.keyid:
            raise ValueError(f"the key on the token is not the one the metadata lists (keyid {public_key.keyid[:16]}...)")
        return cls(priv_key_uri, public_key)

    def _find_token(self, token_label: str | None = None) -> Any:  # type: ignore[override]
        return self._token.token()

    def _find_signing_key(self, session: Any, keyid: int) -> Any:  # type: ignore[override]
        return self._token.find(session, _pkcs11().ObjectClass.PRIVATE_KEY)

    def sign(self, payload: bytes) -> Any:
        pkcs11 = _pkcs11()
        try:
            with _LOCK:
                return super().sign(payload)
        except (pkcs11.exceptions.PinIncorrect, pkcs11.exceptions.PinLenRange):
            raise self._token.fail("wrong PIN", retry=False) from None
        except pkcs11.exceptions.PKCS11Error as e:
            raise self._token.fail(f"signing failed ({type(e).__name__})", stale=True, transient=True) from None
