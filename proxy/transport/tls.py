"""TLS for our listeners and our clients: contexts from files, certificates re-read when the files change.

A server context loads ``--tls-cert``/``--tls-key`` (and, with
``--tls-client-ca``, requires a client certificate signed by that CA).
:func:`keep_loaded` looks at the files every few seconds and loads them
into the same context when they changed (cert-manager and certbot replace
them in place): new handshakes get the new certificate, open connections
keep theirs, and a pair that does not load (half-written, key and
certificate not matching) is logged and the old one kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from proxy.protocol.errors import Fault

log = logging.getLogger(__name__)
CHECK_INTERVAL = 2.0


class TLSConfigError(ValueError):
    """TLS files that cannot be used."""

    reason = "bad-configuration"
    fault = Fault.OPERATOR


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...] | None:
    try:
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in map(os.stat, paths))
    except OSError:
        return None


@dataclass
class ServerTLS:
    cert: Path
    key: Path
    client_ca: Path | None = None
    context: ssl.SSLContext = field(init=False)
    _stamp: object = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_ca is not None:
            try:
                self.context.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as e:
                raise TLSConfigError(f"--tls-client-ca {self.client_ca}: {e}") from None
            self.context.verify_mode = ssl.CERT_REQUIRED
        try:
            self.load()
        except (OSError, ssl.SSLError) as e:
            raise TLSConfigError(f"--tls-cert {self.cert} / --tls-key {self.key}: {e}") from None

    def load(self) -> None:
        stamp = _stamp((self.cert, self.key))
        self.context.load_cert_chain(str(self.cert), str(self.key))
        self._stamp = stamp

    def reload_if_changed(self) -> bool:
        stamp = _stamp((self.cert, self.key))
        if stamp is None or stamp == self._stamp:
            return False
        try:
            self.load()
        except (OSError, ssl.SSLError) as e:
            log.warning("TLS files %s, %s changed but do not load (%s): keeping the certificate in use",
                        self.cert, self.key, e)
            self._stamp = stamp  # tried once per change; the next change is tried again
            return False
        log.info("TLS certificate re-read from %s", self.cert)
        return True

    async def keep_loaded(self, interval: float = CHECK_INTERVAL) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None = None) -> ServerTLS | None:
    """The listener's TLS, or None for plain HTTP; both files or neither."""
    if cert is None and key is None:
        if client_ca is not None:
            raise TLSConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise TLSConfigError("give both --tls-cert and --tls-key")
    return ServerTLS(Path(cert), Path(key), Path(client_ca) if client_ca else None)


def client_context(ca_bundle: Path | None = None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A context verifying servers (against ``ca_bundle``, else the system's CAs), presenting ``cert`` if given."""
    try:
        context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
        if cert is not None:
            context.load_cert_chain(str(cert), str(key) if key else None)
    except (OSError, ssl.SSLError) as e:
        raise TLSConfigError(f"client TLS files ({ca_bundle or 'system CAs'}, {cert or 'no client certificate'}): "
                             f"{e}") from None
    return context
