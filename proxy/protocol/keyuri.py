"""Key URIs: what names a signing key, parsed and made safe to print or store (no I/O).

A key is named by a URI, as ``--online-key``, ``--root-key``, ``--targets-key``
and ``--bins-key`` take it:

* ``pkcs11:token=LABEL;object=LABEL?module-path=/path/module.so&pin-source=file:/path``
  (RFC 7512, as p11-kit, OpenSSL's pkcs11 provider and GnuTLS spell it; ``id=%01``
  instead of or beside ``object=``; ``pin-value=`` for tests; without either, the PIN
  comes from ``TUFPROXY_PKCS11_PIN``);
* any private-key URI scheme securesystemslib's ``Signer.from_priv_key_uri`` knows
  (``hsm:``, ``awskms:``, ``gcpkms:``, ``azurekms:``, ``hv:``, ``file2:`` ...),
  passed to it unchanged.

:func:`printable` elides the PIN (every message and log line names keys by it);
:func:`storable` drops ``pin-value`` (what ``DIR/keys/uris.json`` keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote, unquote_to_bytes

from proxy.protocol.errors import Fault

PKCS11 = "pkcs11"
PIN_ENV = "TUFPROXY_PKCS11_PIN"
# The module when the URI names none: securesystemslib's HSMSigner convention.
MODULE_ENV = "PYKCS11LIB"
_PATH_ATTRS = {"token", "object", "id", "type", "manufacturer", "serial", "model",
               "library-manufacturer", "library-description", "library-version", "slot-id",
               "slot-description", "slot-manufacturer"}
_QUERY_ATTRS = {"module-path", "module-name", "pin-source", "pin-value"}


class KeyURIError(ValueError):
    """A key URI that cannot name a key; the message names it with the PIN elided."""

    reason = "bad-key-uri"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class Pkcs11URI:
    """The parts of an RFC 7512 URI that pick a token, a key on it and the PIN."""

    token: str | None
    object: str | None  # CKA_LABEL
    id: bytes | None  # CKA_ID
    module_path: str | None  # None: $PYKCS11LIB
    pin_source: str | None  # a file: URI
    pin_value: str | None


def scheme(uri: str) -> str:
    head, sep, _ = uri.partition(":")
    if not sep or not head or not head.replace("-", "").replace("+", "").isalnum():
        raise KeyURIError(f"{printable(uri)}: not a key URI (pkcs11:..., awskms:..., file2:PATH, ...)")
    return head.lower()


def parse_pkcs11(uri: str) -> Pkcs11URI:
    """Parse an RFC 7512 ``pkcs11:`` URI naming one private key."""
    if scheme(uri) != PKCS11:
        raise KeyURIError(f"{printable(uri)}: not a pkcs11: URI")
    body = uri.split(":", 1)[1]
    path, _, query = body.partition("?")
    attrs: dict[str, str] = {}
    for part, allowed, sep in ((path, _PATH_ATTRS, ";"), (query, _QUERY_ATTRS, "&")):
        for item in filter(None, part.split(sep)):
            name, eq, value = item.partition("=")
            if not eq or name not in allowed:
                raise KeyURIError(f"{printable(uri)}: unknown or malformed attribute {name!r} (RFC 7512)")
            if name in attrs:
                raise KeyURIError(f"{printable(uri)}: attribute {name!r} given twice")
            attrs[name] = value
    if "type" in attrs and attrs["type"] != "private":
        raise KeyURIError(f"{printable(uri)}: names a {attrs['type']} object; a signing key is type=private")
    if "object" not in attrs and "id" not in attrs:
        raise KeyURIError(f"{printable(uri)}: name the key with object=LABEL or id=%XX")
    if "pin-source" in attrs and "pin-value" in attrs:
        raise KeyURIError(f"{printable(uri)}: give pin-source or pin-value, not both")
    pin_source = unquote(attrs["pin-source"]) if "pin-source" in attrs else None
    if pin_source is not None and not pin_source.startswith(("file:", "/")):
        raise KeyURIError(f"{printable(uri)}: pin-source must be file:/path")
    module = unquote(attrs["module-path"]) if "module-path" in attrs else None
    return Pkcs11URI(
        token=unquote(attrs["token"]) if "token" in attrs else None,
        object=unquote(attrs["object"]) if "object" in attrs else None,
        id=unquote_to_bytes(attrs["id"]) if "id" in attrs else None,
        module_path=module,
        pin_source=pin_source.removeprefix("file:") if pin_source else None,
        pin_value=unquote(attrs["pin-value"]) if "pin-value" in attrs else None,
    )


def _without_pin(uri: str, replacement: str | None) -> str:
    if not uri.lower().startswith(PKCS11 + ":") or "?" not in uri:
        return uri
    head, query = uri.split("?", 1)
    kept = []
    for item in query.split("&"):
        if item.startswith("pin-value="):
            if replacement is None:
                continue
            item = "pin-value=" + replacement
        kept.append(item)
    return head + ("?" + "&".join(kept) if kept else "")


def printable(uri: str) -> str:
    """``uri`` with any PIN elided: what messages, logs and audit records show."""
    return _without_pin(uri, "...")


def storable(uri: str) -> str:
    """``uri`` without ``pin-value``: what the repository's configuration keeps (never a PIN)."""
    return _without_pin(uri, None)


def pkcs11_uri(token: str, *, object: str | None = None, id: bytes | None = None,
               module_path: str | None = None, pin_source: str | None = None, pin_value: str | None = None) -> str:
    """Spell a ``pkcs11:`` URI (tests and docs build theirs with this)."""
    path = [f"token={quote(token, safe='')}"]
    if object is not None:
        path.append(f"object={quote(object, safe='')}")
    if id is not None:
        path.append("id=" + "".join(f"%{b:02x}" for b in id))
    query = []
    if module_path is not None:
        query.append(f"module-path={quote(module_path, safe='/')}")
    if pin_source is not None:
        query.append(f"pin-source={quote('file:' + pin_source, safe='/:')}")
    if pin_value is not None:
        query.append(f"pin-value={quote(pin_value, safe='')}")
    return "pkcs11:" + ";".join(path) + ("?" + "&".join(query) if query else "")
