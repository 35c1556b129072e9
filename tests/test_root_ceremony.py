"""The offline root ceremony and the rotation drill, with keys in SoftHSM2 tokens and a file.

``tufproxy gateway root draft|sign|status|publish`` as key holders run it:
each ``sign`` is a subprocess given only the draft and one key.  The drill:
the online key leaks, an attacker serves a timestamp, snapshot and bin it
signed; the organisation rotates the online key by the ceremony; an edge
that refreshes once refuses the old key's metadata (audit record, metric)
and serves only what the new key signed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner

from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, metric
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.softhsm import SoftHSM, isolated_store
from tests.support.testindex import TestIndex
from tests.support.upstream import Upstream
from tests.test_keys import test_index, tufproxy

PIN_A, PIN_B, PIN_ONLINE = "1111", "2222", "4711"


@pytest.fixture
def hsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHSM:
    store = isolated_store(tmp_path / "softhsm", monkeypatch)
    monkeypatch.setenv("TUFPROXY_PKCS11_PIN", PIN_ONLINE)
    store.token("holder-a", PIN_A)
    store.keypair("holder-a", PIN_A, "root")
    store.token("holder-b", PIN_B)
    store.keypair("holder-b", PIN_B, "root")
    store.token("online-token", PIN_ONLINE)
    store.keypair("online-token", PIN_ONLINE, "online-1", "01")
    store.keypair("online-token", PIN_ONLINE, "online-2", "02")
    return store


def ok(*args: str) -> str:
    r = tufproxy(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def file_key(directory: Path) -> str:
    """A holder's key in a file on their own machine: a file2: URI."""
    directory.mkdir(parents=True)
    signer = CryptoSigner.generate_ecdsa()
    (directory / "root.pem").write_bytes(signer.private_bytes)
    return f"file2:{directory / 'root.pem'}"


def signed_by(url: str) -> list[str]:
    return [s["keyid"] for s in json.loads(urllib.request.urlopen(url, timeout=10).read())["signatures"]]


@pytest.mark.slow
def test_two_of_three_root_ceremony_rotates_the_online_key_under_a_running_gateway(
        tmp_path: Path, hsm: SoftHSM, test_index: TestIndex) -> None:
    holder_a = hsm.uri("holder-a", "root", pin_value=PIN_A)
    holder_b = hsm.uri("holder-b", "root", pin_value=PIN_B)
    holder_c = file_key(tmp_path / "holder-c")
    gw_dir = tmp_path / "gw"
    ok("gateway", "init", str(gw_dir), "--bins", "16", "--root-key", holder_a, "--root-key", holder_b, "--root-key", holder_c,
       "--root-threshold", "2", "--online-key", hsm.uri("online-token", "online-1"))
    root1 = json.loads((gw_dir / "public" / "metadata" / "1.root.json").read_bytes())
    assert len(root1["signatures"]) == 3 and root1["signed"]["roles"]["root"]["threshold"] == 2
    draft = tmp_path / "next-root.json"
    with GatewayProcess(gw_dir, "--index-url", test_index.url, "--batch-window", "0.05", "--page-ttl", "3600") as gw:
        assert gw.publish("lib")[0] == 200
        [old_online] = root1["signed"]["roles"]["timestamp"]["keyids"]
        assert signed_by(f"{gw.base}metadata/timestamp.json") == [old_online]

        out = ok("gateway", "root", "draft", str(gw_dir), "--online-key", hsm.uri("online-token", "online-2"), "-o", str(draft))
        assert "root v2" in out and "bins v" in out and "2 missing" in out
        # Each holder signs on their own: the draft and one key; twice is a no-op.
        assert "signed root" in ok("gateway", "root", "sign", str(draft), "--key", holder_a)
        before = draft.read_bytes()
        assert "nothing to do" in ok("gateway", "root", "sign", str(draft), "--key", holder_a)
        assert draft.read_bytes() == before
        status = ok("gateway", "root", "status", str(draft))
        assert "root v2 under root v1: 1/2 (1 missing)" in status and "ready to publish" not in status
        # Not enough signatures: publish refuses, saying what is missing.
        r = tufproxy("gateway", "root", "publish", str(gw_dir), str(draft))
        assert r.returncode == 2 and "root needs 1 more signature(s) under root v1" in r.stderr, r.stderr
        assert "bins needs 1 more" in r.stderr
        # A key that may sign nothing of the draft is refused.
        stranger = file_key(tmp_path / "stranger")
        r = tufproxy("gateway", "root", "sign", str(draft), "--key", stranger)
        assert r.returncode == 2 and "signs no role of this draft" in r.stderr
        ok("gateway", "root", "sign", str(draft), "--key", holder_c)
        # bins delegates every bin-n to the online key: its holder signs the new bins too.
        ok("gateway", "root", "sign", str(draft), "--key", f"file2:{gw_dir / 'keys' / 'bins.pem'}")
        assert "ready to publish" in ok("gateway", "root", "status", str(draft))
        out = ok("gateway", "root", "publish", str(gw_dir), str(draft), "--audit-log", str(tmp_path / "keys-audit.log"))
        assert "root v2" in out
        [record] = _audit(tmp_path / "keys-audit.log")
        assert record["event"] == "root-published" and record["versions"]["root"] == 2
        assert len(record["signed_by"]["root"]) == 2 and "online-2" in record["new_keys"]["online"]["uri"]

        uris = json.loads((gw_dir / "keys" / "uris.json").read_text())
        new_online = uris["online"]["keyid"]
        assert new_online != old_online and "online-2" in uris["online"]["uri"]
        root2 = json.loads((gw_dir / "public" / "metadata" / "2.root.json").read_bytes())
        assert root2["signed"]["roles"]["timestamp"]["keyids"] == [new_online]
        assert signed_by(f"{gw.base}metadata/timestamp.json") == [new_online]
        # The running gateway signs with the new key without a restart.
        assert gw.publish("app")[0] == 200
        assert signed_by(f"{gw.base}metadata/timestamp.json") == [new_online]
        # An edge pinned on root v1 follows the chain to v2 and installs.
        from tests.support.clients import install
        from tests.support.gatewayproc import edge_for

        with edge_for(tmp_path, gw) as edge:
            r = install("pip", edge.url, tmp_path / "target", "app")
            assert r.returncode == 0, r.stdout + r.stderr
    # The draft is spent: publishing it again is refused.
    r = tufproxy("gateway", "root", "publish", str(gw_dir), str(draft))
    assert r.returncode == 2 and "draft again" in r.stderr, r.stderr


def _audit(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _page(url: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.mark.slow
def test_rotation_drill_edges_refuse_the_leaked_online_key(tmp_path: Path, hsm: SoftHSM, test_index: TestIndex) -> None:
    leaked = hsm.uri("online-token", "online-1", pin_value=PIN_ONLINE)
    gw_dir = tmp_path / "gw"
    ok("gateway", "init", str(gw_dir), "--bins", "16", "--online-key", hsm.uri("online-token", "online-1"))
    audit = tmp_path / "edge-audit.log"
    with GatewayProcess(gw_dir, "--index-url", test_index.url, "--batch-window", "0.05", "--page-ttl", "3600") as gw:
        assert gw.publish("lib")[0] == 200
        # The edge reads the gateway's tree through a path the attacker controls (a CDN, a bucket, the network).
        with Upstream(gw_dir / "public") as path, \
                ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", path.url, "--root", str(gw.root),
                             "--workers", "1", "--refresh-interval", "0.5", "--audit-log", str(audit)) as edge:
            assert "lib-1.0" in _page(f"{edge.url}lib/")[1]

            def attack() -> None:
                out = tmp_path / f"forged-{len(list(tmp_path.glob('forged-*')))}"
                out.mkdir()
                r = subprocess.run([sys.executable, "-m", "tests.support.forge", str(gw_dir / "public"), leaked, "lib", str(out)],
                                   capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, r.stderr
                path.clear()
                for forged in out.rglob("*"):
                    if forged.is_file():
                        path.replace("/" + str(forged.relative_to(out)).replace(".", r"\."), forged.read_bytes())

            # 1. The key leaked: what the attacker signs with it, edges believe (this is why keys are rotated).
            attack()
            wait_for(lambda: "lib-6.6.6" in _page(f"{edge.url}lib/")[1], timeout=30, what="the forged page served")

            # 2. The organisation rotates the online key by the ceremony (root and bins keys are files here).
            draft = tmp_path / "rotate.json"
            ok("gateway", "root", "draft", str(gw_dir), "--online-key", hsm.uri("online-token", "online-2"), "-o", str(draft))
            root_key = next((gw_dir / "keys").glob("root-*.pem"))
            ok("gateway", "root", "sign", str(draft), "--key", f"file2:{root_key}", "--key", f"file2:{gw_dir / 'keys' / 'bins.pem'}")
            ok("gateway", "root", "publish", str(gw_dir), str(draft))

            # 3. The attacker keeps signing with the old key, over the new tree (root v2 included).
            attack()
            _, body = wait_for(lambda: (r := _page(f"{edge.url}lib/"))[0] >= 500 and r, timeout=30,  # type: ignore[misc]
                                    what="the edge refusing the old key's metadata")
            assert "lib-6.6.6" not in body
            refusals = [a for a in _audit(audit) if a.get("event") == "refused" and a.get("role") == "timestamp"]
            assert refusals and all(a["reason"] == "bad-signature" for a in refusals), refusals
            assert metric(edge.base, "tufproxy_verification_failures_total") >= 1
            root_seen = json.loads((tmp_path / "edge").rglob("root.json").__next__().read_bytes())
            assert root_seen["signed"]["version"] == 2

            # 4. The path is honest again: only what the new key signed is served.
            path.clear()
            wait_for(lambda: (r := _page(f"{edge.url}lib/"))[0] == 200 and "lib-6.6.6" not in r[1], timeout=30,
                     what="the new key's page served")
            new_online = json.loads((gw_dir / "keys" / "uris.json").read_text())["online"]["keyid"]
            assert signed_by(f"{path.url}metadata/timestamp.json") == [new_online]


@pytest.mark.slow
def test_ceremony_adds_and_removes_root_keys_with_file_keys_and_a_public_key_file(tmp_path: Path) -> None:
    """No token needed: root keys as files, a new holder known to the draft only by a PEM public key file."""
    gw = tmp_path / "gw"
    ok("gateway", "init", str(gw), "--bins", "16")
    old = f"file2:{next((gw / 'keys').glob('root-*.pem'))}"
    dana = CryptoSigner.generate_ecdsa()
    (tmp_path / "dana.pem").write_bytes(dana.private_bytes)
    new = f"file2:{tmp_path / 'dana.pem'}"
    pub = tmp_path / "dana.pub.pem"
    pub.write_text(dana.public_key.keyval["public"])
    draft = tmp_path / "add.json"
    ok("gateway", "root", "draft", str(gw), "--add-root-key", str(pub), "--root-threshold", "2", "-o", str(draft))
    ok("gateway", "root", "sign", str(draft), "--key", old)
    status = ok("gateway", "root", "status", str(draft))
    assert "under root v1: 1/1 (complete)" in status and "under root v2: 1/2 (1 missing)" in status, status
    ok("gateway", "root", "sign", str(draft), "--key", new)
    ok("gateway", "root", "publish", str(gw), str(draft))
    root2 = json.loads((gw / "public" / "metadata" / "2.root.json").read_bytes())
    assert root2["signed"]["roles"]["root"]["threshold"] == 2 and len(root2["signed"]["roles"]["root"]["keyids"]) == 2

    # Remove the old key: root v2's threshold (both keys) still has to approve root v3.
    old_keyid = next(k for k in root2["signed"]["roles"]["root"]["keyids"] if k != dana.public_key.keyid)
    draft = tmp_path / "remove.json"
    ok("gateway", "root", "draft", str(gw), "--remove-root-key", old_keyid[:12], "--root-threshold", "1", "-o", str(draft))
    ok("gateway", "root", "sign", str(draft), "--key", new)
    r = tufproxy("gateway", "root", "publish", str(gw), str(draft))
    assert r.returncode == 2 and "under root v2" in r.stderr, r.stderr
    ok("gateway", "root", "sign", str(draft), "--key", old)
    ok("gateway", "root", "publish", str(gw), str(draft))
    root3 = json.loads((gw / "public" / "metadata" / "3.root.json").read_bytes())
    assert root3["signed"]["roles"]["root"]["keyids"] == [dana.public_key.keyid]


@pytest.mark.slow
def test_the_same_ceremony_rotates_targets_and_bins_keys_into_a_token(tmp_path: Path, hsm: SoftHSM,
                                                                      test_index: TestIndex) -> None:
    hsm.keypair("holder-a", PIN_A, "targets", "21")
    hsm.keypair("holder-b", PIN_B, "bins", "22")
    gw_dir = tmp_path / "gw"
    ok("gateway", "init", str(gw_dir), "--bins", "16")
    keys = gw_dir / "keys"
    with GatewayProcess(gw_dir, "--index-url", test_index.url, "--batch-window", "0.05", "--page-ttl", "3600") as gw:
        assert gw.publish("lib")[0] == 200
        draft = tmp_path / "offline.json"
        out = ok("gateway", "root", "draft", str(gw_dir), "--targets-key", hsm.uri("holder-a", "targets", pin_value=PIN_A),
                 "--bins-key", hsm.uri("holder-b", "bins", pin_value=PIN_B), "-o", str(draft))
        assert "targets v" in out and "bins v" in out
        ok("gateway", "root", "sign", str(draft), "--key", f"file2:{next(keys.glob('root-*.pem'))}")
        # targets is signed by its new key (root v2 lists it); bins by its new key (the new targets delegates to it).
        assert "signed targets" in ok("gateway", "root", "sign", str(draft), "--key", hsm.uri("holder-a", "targets", pin_value=PIN_A))
        assert "signed bins" in ok("gateway", "root", "sign", str(draft), "--key", hsm.uri("holder-b", "bins", pin_value=PIN_B))
        ok("gateway", "root", "publish", str(gw_dir), str(draft))
        assert not (keys / "targets.pem").exists() and not (keys / "bins.pem").exists()
        uris = json.loads((keys / "uris.json").read_text())
        assert {"targets", "bins"} <= set(uris) and PIN_A not in json.dumps(uris)
        assert gw.publish("app")[0] == 200
        from tests.support.clients import install
        from tests.support.gatewayproc import edge_for

        with edge_for(tmp_path, gw) as edge:
            r = install("pip", edge.url, tmp_path / "target", "app")
            assert r.returncode == 0, r.stdout + r.stderr
