"""Keys by URI: a gateway whose keys live in a PKCS#11 token (SoftHSM2), not under DIR.

Real parts: SoftHSM2 is a real PKCS#11 module; each test makes its own
token store (its own ``SOFTHSM2_CONF``) and generates EC P-256 keys in it
with ``pkcs11-tool``; ``tufproxy gateway init``/``serve``, the edge and pip
are subprocesses.  Cloud KMS schemes are checked offline: URI parsing and
the errors a missing SDK or a malformed URI give.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.protocol.keyuri import KeyURIError, parse_pkcs11, printable, storable
from proxy.repository.sample import build_wheel
from tests.support.clients import install
from tests.support.gatewayproc import GatewayProcess, metric
from tests.support.poll import wait_for
from tests.support.softhsm import SoftHSM, available, isolated_store
from tests.support.testindex import TestIndex

needs_softhsm = pytest.mark.skipif(not available(), reason="softhsm2 and opensc (pkcs11-tool) are not installed")
PIN = "4711"


def tufproxy(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The command failed as a CLI must: exit 2, one line on stderr, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture
def hsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHSM:
    store = isolated_store(tmp_path / "softhsm", monkeypatch)
    store.token("online-token", PIN)
    store.keypair("online-token", PIN, "online")
    return store


@pytest.fixture
def test_index(tmp_path: Path) -> Iterator[TestIndex]:
    dists = tmp_path / "dists"
    index = TestIndex()
    for path in (build_wheel(dists, "app", "1.0", requires=["lib"]), build_wheel(dists, "lib", "1.0")):
        index.add(path)
    with index:
        yield index


def private_keys_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() and b"PRIVATE KEY" in p.read_bytes())


# -- URIs, offline -------------------------------------------------------

def test_pkcs11_uri_parts_and_pin_never_shown_or_stored() -> None:
    uri = "pkcs11:token=My%20Token;object=online;id=%00%01?module-path=/opt/p11.so&pin-value=1234"
    parts = parse_pkcs11(uri)
    assert (parts.token, parts.object, parts.id, parts.module_path, parts.pin_value) == \
        ("My Token", "online", b"\x00\x01", "/opt/p11.so", "1234")
    assert "1234" not in printable(uri) and "pin-value=..." in printable(uri)
    assert storable(uri) == "pkcs11:token=My%20Token;object=online;id=%00%01?module-path=/opt/p11.so"
    assert parse_pkcs11("pkcs11:token=t;id=%01?pin-source=file:/run/pin").pin_source == "/run/pin"
    for bad, why in (("pkcs11:token=t", "object=LABEL or id"), ("pkcs11:token=t;object=o;colour=red", "colour"),
                     ("pkcs11:token=t;object=o;type=cert", "type=private"),
                     ("pkcs11:object=o?pin-value=1&pin-source=file:/p", "not both"),
                     ("pkcs11:object=o?pin-source=https://x/", "file:")):
        with pytest.raises(KeyURIError, match=why):
            parse_pkcs11(bad)


@pytest.mark.parametrize("uri, says", [
    ("awskms:alias/tufproxy-online", "tufproxy[kms]"),
    ("gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", "tufproxy[kms]"),
    ("azurekms://vault/keys", "azurekms://VAULT"),
    ("hv:", "hv:NAME"),
    ("gnupg:", "cannot read the public key of a gnupg: key"),
    ("nosuch:key", "unknown key URI scheme 'nosuch'"),
    ("online.pem", "not a key URI"),
])
def test_kms_and_other_schemes_fail_offline_with_one_line(tmp_path: Path, uri: str, says: str) -> None:
    """Without the cloud SDKs (the test extra has none) nothing reaches a network: the error names the URI."""
    pytest.importorskip("securesystemslib")
    for sdk in ("boto3", "google.cloud.kms", "azure.keyvault.keys", "hvac"):
        try:
            __import__(sdk)
        except ImportError:
            continue
        pytest.skip(f"{sdk} is installed: this test checks the offline path")
    line = one_line_error(tufproxy("gateway", "init", str(tmp_path / "gw"), "--bins", "16", "--online-key", uri))
    assert uri.split(":")[0] in line and says in line, line
    assert not (tmp_path / "gw" / "repository.json").exists()


# -- a token --------------------------------------------------------------

@needs_softhsm
def test_init_with_every_key_in_tokens_writes_no_private_key(tmp_path: Path, hsm: SoftHSM) -> None:
    hsm.token("offline-token", "2468")
    for label, key_id in (("root-a", "11"), ("root-b", "12"), ("targets", "13"), ("bins", "14")):
        hsm.keypair("offline-token", "2468", label, key_id)
    offline = {label: hsm.uri("offline-token", label, pin_value="2468") for label in ("root-a", "root-b", "targets", "bins")}
    gw = tmp_path / "gw"
    r = tufproxy("gateway", "init", str(gw), "--bins", "16", "--online-key", hsm.uri("online-token", "online", pin_value=PIN),
                 "--root-key", offline["root-a"], "--root-key", offline["root-b"], "--root-threshold", "2",
                 "--targets-key", offline["targets"], "--bins-key", offline["bins"])
    assert r.returncode == 0, r.stderr
    assert private_keys_under(gw) == []
    stored = (gw / "keys" / "uris.json").read_text()
    assert PIN not in stored and "2468" not in stored and "pin-value" not in stored
    root = json.loads((gw / "public" / "metadata" / "1.root.json").read_bytes())
    online = json.loads(stored)["online"]["keyid"]
    assert root["signed"]["roles"]["timestamp"]["keyids"] == [online]
    assert root["signed"]["roles"]["root"]["threshold"] == 2 and len(root["signed"]["roles"]["root"]["keyids"]) == 2
    assert all(k["scheme"] == "ecdsa-sha2-nistp256" for k in root["signed"]["keys"].values())
    assert len(root["signatures"]) == 2


@pytest.mark.slow
@needs_softhsm
def test_pip_through_an_edge_in_front_of_a_token_signed_gateway(tmp_path: Path, hsm: SoftHSM, test_index: TestIndex,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gw_dir = tmp_path / "gw"
    r = tufproxy("gateway", "init", str(gw_dir), "--bins", "16", "--online-key", hsm.uri("online-token", "online"))
    assert "no PIN" in one_line_error(r)  # the PIN is nowhere yet
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", PIN)
    r = tufproxy("gateway", "init", str(gw_dir), "--bins", "16", "--online-key", hsm.uri("online-token", "online"))
    assert r.returncode == 0, r.stderr
    assert private_keys_under(gw_dir) == ["keys/bins.pem", f"keys/{next((gw_dir / 'keys').glob('root-*.pem')).name}",
                                          "keys/targets.pem"]
    online = json.loads((gw_dir / "keys" / "uris.json").read_text())["online"]["keyid"]
    # Two workers: each loads the PKCS#11 module after the fork and signs in its turn.
    with GatewayProcess(gw_dir, "--index-url", test_index.url, "--batch-window", "0.05", "--workers", "2") as gw:
        from tests.support.gatewayproc import edge_for

        with edge_for(tmp_path, gw) as edge:
            r = install("pip", edge.url, tmp_path / "target", "app")
            assert r.returncode == 0, r.stdout + r.stderr
        timestamp = json.loads(urllib.request.urlopen(f"{gw.base}metadata/timestamp.json", timeout=10).read())
        assert [s["keyid"] for s in timestamp["signatures"]] == [online]
        assert metric(gw.base, "tufproxy_gateway_published_projects_total") == 2
    assert {p.name for p in (tmp_path / "target").iterdir()} >= {"app", "lib"}


def _serve_fails(gw_dir: Path) -> str:
    r = tufproxy("gateway", "serve", str(gw_dir), "--index-url", "http://127.0.0.1:9/simple/", "--listen", "127.0.0.1:0",
                 timeout=60)
    return one_line_error(r)


@pytest.mark.slow
@needs_softhsm
def test_every_start_up_failure_is_one_line_naming_the_uri(tmp_path: Path, hsm: SoftHSM,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    uri = hsm.uri("online-token", "online")
    # At init: missing token, wrong PIN, missing object, unsupported key type.
    hsm.keypair("online-token", PIN, "edwards", "02", key_type="EC:edwards25519")
    for bad, says in ((hsm.uri("no-such-token", "online", pin_value=PIN), "no token labelled 'no-such-token'"),
                      (hsm.uri("online-token", "online", pin_value="0000"), "wrong PIN"),
                      (hsm.uri("online-token", "missing", pin_value=PIN), "no private key"),
                      (hsm.uri("online-token", "edwards", pin_value=PIN), "unsupported key type")):
        line = one_line_error(tufproxy("gateway", "init", str(tmp_path / "never"), "--bins", "16", "--online-key", bad))
        assert says in line and "pkcs11:token=" in line, line
        assert PIN not in line and "0000" not in line and "pin-value=..." in line
    assert not (tmp_path / "never" / "repository.json").exists()

    # At serve: the same four, each after a good init.
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", PIN)
    gw = tmp_path / "gw"
    assert tufproxy("gateway", "init", str(gw), "--bins", "16", "--online-key", uri).returncode == 0
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", "9999")
    line = _serve_fails(gw)
    assert "wrong PIN" in line and uri in line and "9999" not in line, line
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", PIN)
    [token_dir] = hsm.token_dirs()
    token_dir.rename(tmp_path / "unplugged")
    assert "no token labelled 'online-token'" in _serve_fails(gw)
    (tmp_path / "unplugged").rename(token_dir)
    hsm._tool("--token-label", "online-token", "--login", "--pin", PIN, "--delete-object", "--type", "privkey",
              "--label", "online")
    assert "no private key" in _serve_fails(gw)
    hsm._tool("--token-label", "online-token", "--login", "--pin", PIN, "--delete-object", "--type", "pubkey",
              "--label", "online")
    hsm.keypair("online-token", PIN, "online", "01", key_type="EC:edwards25519")
    assert "unsupported key type" in _serve_fails(gw)


@pytest.mark.slow
@needs_softhsm
def test_token_removed_while_running(tmp_path: Path, hsm: SoftHSM, test_index: TestIndex,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Signing fails: 503 to publishes, the last tree still served, a metric and an audit record, retried with
    back-off; /readyz turns not ready once the timestamp is within a quarter of its lifetime; the token put back
    signs again without a restart."""
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", PIN)
    gw_dir = tmp_path / "gw"
    # 0.0002 days: a 17 s timestamp lifetime, not ready below 4.3 s left.
    r = tufproxy("gateway", "init", str(gw_dir), "--bins", "16", "--online-key", hsm.uri("online-token", "online"),
                 "--online-expiry", "0.0002")
    assert r.returncode == 0, r.stderr
    with GatewayProcess(gw_dir, "--index-url", test_index.url, "--batch-window", "0.05", "--page-ttl", "3600") as gw:
        status, answer = gw.publish("lib")
        assert status == 200, answer
        [token_dir] = hsm.token_dirs()
        token_dir.rename(tmp_path / "unplugged")
        status, answer = gw.publish("app")
        assert status == 503 and answer["reason"] == "signing-unavailable", answer
        assert "pkcs11:token=online-token" in answer["detail"] and PIN not in answer["detail"]
        assert metric(gw.base, "tufproxy_gateway_signing_errors_total") >= 1
        assert any(a.get("reason") == "signing-unavailable" for a in gw.audit())
        # What was signed is still served.
        timestamp = urllib.request.urlopen(f"{gw.base}metadata/timestamp.json", timeout=10).read()
        assert json.loads(timestamp)["signed"]["version"] > 0
        assert urllib.request.urlopen(f"{gw.base}simple/lib/", timeout=10).status == 200

        def readyz() -> tuple[int, dict]:  # type: ignore[type-arg]
            try:
                with urllib.request.urlopen(f"{gw.base}readyz", timeout=10) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, ready = readyz()
        assert ready["signing_error"] and "online-token" in ready["signing_error"]
        status, ready = wait_for(lambda: (r := readyz())[0] == 503 and r, timeout=40, what="readyz not ready")  # type: ignore[misc]
        assert any("expires in" in p for p in ready["problems"]), ready
        (tmp_path / "unplugged").rename(token_dir)
        wait_for(lambda: readyz()[0] == 200, timeout=90, what="ready again after the token came back")
        status, answer = gw.publish("app")
        assert status == 200, answer


@needs_softhsm
def test_repo_init_takes_the_same_key_uris_and_securesystemslib_schemes_pass_through(
        tmp_path: Path, hsm: SoftHSM, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tufproxy repo init`` shares gateway init's key options; an ``hsm:`` URI is securesystemslib's own HSMSigner."""
    hsm.keypair("online-token", PIN, "targets", "07")
    pin_file = tmp_path / "pin"
    pin_file.write_text(PIN + "\n")
    # A PIN from the file its URI names, nothing in the environment.
    r = tufproxy("repo", "init", str(tmp_path / "by-pin-file"), "--bins", "16",
                 "--targets-key", hsm.uri("online-token", "targets", pin_source=str(pin_file)))
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", PIN)
    monkeypatch.setenv("PYKCS11LIB", "/usr/lib/softhsm/libsofthsm2.so")
    repo = tmp_path / "repo"
    r = tufproxy("repo", "init", str(repo), "--bins", "16", "--online-key", "hsm:1?label=online-token",
                 "--targets-key", hsm.uri("online-token", "targets", pin_source=str(pin_file)))
    assert r.returncode == 0, r.stderr
    assert not (repo / "keys" / "online.pem").exists() and not (repo / "keys" / "targets.pem").exists()
    r = tufproxy("repo", "add", str(repo), str(build_wheel(tmp_path / "dists", "lib", "1.0")))
    assert r.returncode == 0, r.stderr
    uris = json.loads((repo / "keys" / "uris.json").read_text())
    assert uris["online"]["uri"] == "hsm:1?label=online-token"
    assert uris["targets"]["uri"].endswith(f"pin-source=file:{pin_file}")
    timestamp = json.loads((repo / "public" / "metadata" / "timestamp.json").read_bytes())
    assert [s["keyid"] for s in timestamp["signatures"]] == [uris["online"]["keyid"]]
    root = json.loads((repo / "public" / "metadata" / "root.json").read_bytes())
    assert root["signed"]["roles"]["targets"]["keyids"] == [uris["targets"]["keyid"]]


def test_a_gateway_without_its_online_key_file_does_not_start(tmp_path: Path) -> None:
    gw = tmp_path / "gw"
    assert tufproxy("gateway", "init", str(gw), "--bins", "16").returncode == 0
    (gw / "keys" / "online.pem").rename(tmp_path / "online.pem")
    assert "no private key for 'online'" in _serve_fails(gw)


@pytest.mark.slow
@needs_softhsm
def test_a_wrong_pin_at_run_time_is_not_tried_again(tmp_path: Path, hsm: SoftHSM, test_index: TestIndex) -> None:
    """Each wrong PIN counts towards locking a real token: the gateway stops asking until it is restarted."""
    pin_file = tmp_path / "pin"
    pin_file.write_text(PIN)
    gw_dir = tmp_path / "gw"
    uri = hsm.uri("online-token", "online", pin_source=str(pin_file))
    assert tufproxy("gateway", "init", str(gw_dir), "--bins", "16", "--online-key", uri).returncode == 0
    args = ("--index-url", test_index.url, "--batch-window", "0.05", "--page-ttl", "3600")
    with GatewayProcess(gw_dir, *args) as gw:
        assert gw.publish("lib")[0] == 200
        pin_file.write_text("0000")  # the PIN changed under the running gateway
        status, answer = gw.publish("app")
        assert status == 503 and "wrong PIN" in answer["detail"], answer
        pin_file.write_text(PIN)
        status, answer = gw.publish("app")  # not asked again: still the same refusal, nothing sent to the token
        assert status == 503 and "wrong PIN" in answer["detail"], answer
        assert metric(gw.base, "tufproxy_gateway_signing_errors_total") == 1
        assert "not retried" in gw.log()
    with GatewayProcess(gw_dir, *args) as gw:
        assert gw.publish("app")[0] == 200
