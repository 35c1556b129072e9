"""TLS on our listeners: a private CA, mTLS between edge and gateway, a certificate rotated while running."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509

from proxy.repository.sample import build_wheel
from tests.support.certs import CA
from tests.support.clients import clean_env
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex


class HTTPSGateway(GatewayProcess):
    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}/"


class HTTPSEdge(ProxyProcess):
    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}/"


def served_serial(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


@pytest.mark.slow
def test_private_ca_mtls_between_edge_and_gateway_and_rotation(tmp_path: Path) -> None:
    ca = CA(tmp_path / "pki")
    pki = tmp_path / "pki"
    ca.issue(pki / "gw.pem", pki / "gw.key")
    ca.issue(pki / "edge-client.pem", pki / "edge-client.key", client=True)
    first = ca.issue(pki / "edge.pem", pki / "edge.key")
    with TestIndex() as index:
        index.add(build_wheel(tmp_path / "dists", "publicpkg", "1.0"))
        big = index.add(build_wheel(tmp_path / "dists", "bigpkg", "1.0", payload=os.urandom(3 * 2**20)))
        gateway_init(tmp_path / "gw")
        gw = HTTPSGateway(tmp_path / "gw", "--index-url", index.url, "--tls-cert", str(pki / "gw.pem"),
                          "--tls-key", str(pki / "gw.key"), "--tls-client-ca", str(ca.path))
        with gw:
            # No client certificate: the gateway does not complete the handshake.
            context = ssl.create_default_context(cafile=str(ca.path))
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                urllib.request.urlopen(f"{gw.base}simple/", timeout=10, context=context).read()
            edge = HTTPSEdge(tmp_path / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                             "--workers", "1", "--ca-bundle", str(ca.path), "--client-cert", str(pki / "edge-client.pem"),
                             "--client-key", str(pki / "edge-client.key"), "--tls-cert", str(pki / "edge.pem"),
                             "--tls-key", str(pki / "edge.key"))
            with edge:
                r = subprocess.run([sys.executable, "-m", "pip", "--no-cache-dir", "--isolated", "download", "--no-deps",
                                    "--index-url", edge.url, "-d", str(tmp_path / "dl"), "publicpkg"],
                                   # pip 26 verifies with the system store (truststore), which reads SSL_CERT_FILE.
                                   capture_output=True, text=True, timeout=180,
                                   env={**clean_env(), "SSL_CERT_FILE": str(ca.path)})
                assert r.returncode == 0, r.stdout + r.stderr + edge.log()
                assert served_serial(edge.port, ca.path) == first
                second = ca.issue(pki / "edge.pem", pki / "edge.key")
                wait_for(lambda: served_serial(edge.port, ca.path) == second, timeout=20, what="the new certificate served")
                body = urllib.request.urlopen(f"{edge.url}publicpkg/", timeout=10, context=context).read()
                assert b"publicpkg-1.0" in body
                # A cold file streamed over TLS (no sendfile there), then the same file warm.
                for _ in range(2):
                    got = urllib.request.urlopen(f"{edge.base}packages/bigpkg/{big.path.name}", timeout=30,
                                                 context=context).read()
                    assert got == big.data
                # The gateway's own copy, warm, over its mTLS: an edge's client certificate gets it.
                as_edge = ssl.create_default_context(cafile=str(ca.path))
                as_edge.load_cert_chain(str(pki / "edge-client.pem"), str(pki / "edge-client.key"))
                got = urllib.request.urlopen(f"{gw.base}packages/bigpkg/{big.path.name}", timeout=30,
                                             context=as_edge).read()
                assert got == big.data
