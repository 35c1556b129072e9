"""PEP 740 provenance at the gateway (issue 30), with real Sigstore bundles, offline.

The real bundles and the real files they attest are in tests/assets/provenance
(see SOURCE.md there).  A test index on 127.0.0.1 serves them as PEP 691 JSON
and as HTML with ``data-provenance``; variants (tampered signature, another
file's provenance, invalid JSON, huge, foreign origin, slow host) are derived
here.  Verification never touches the network: every gateway runs with
``--sigstore-offline yes`` and its own sigstore cache under DIR.  A case that
needs a publisher no real bundle has changes the pin, never the verifier.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from proxy.protocol import index
from proxy.protocol import provenance as rules
from proxy.protocol.errors import Fault
from proxy.protocol.provenance import Outcome, PublisherSpec, decide, parse_spec
from proxy.protocol.refusals import row, rule_fault
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.serving.provenance import EdgeProvenance, ProvenanceUnavailable
from proxy.trust import provenance as sigstore_trust
from proxy.trust.provenance import SigstoreTrust, verify_offline
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex

ASSETS = Path(__file__).parent / "assets" / "provenance"
REAL = "pypi_attestations-0.0.19.tar.gz"
REAL_PUBLISHER = "github:trailofbits/pypi-attestations@release.yml"
GITLAB = "gitlab_oidc_project-0.0.3.tar.gz"
GITLAB_PUBLISHER = "gitlab:facutuesca/gitlab-oidc-project@.gitlab-ci.yml"


def real_provenance() -> bytes:
    return (ASSETS / f"{REAL}.provenance").read_bytes()


def gitlab_provenance() -> bytes:
    """The real GitLab attestation in a PEP 740 provenance object with its publisher."""
    attestation = json.loads((ASSETS / f"{GITLAB}.publish.attestation").read_bytes())
    publisher = {"kind": "GitLab", "repository": "facutuesca/gitlab-oidc-project", "workflow_filepath": ".gitlab-ci.yml"}
    return json.dumps({"version": 1, "attestation_bundles": [{"publisher": publisher, "attestations": [attestation]}]}).encode()


def tampered(data: bytes) -> bytes:
    """The same provenance with one bit of the DSSE signature flipped."""
    obj = json.loads(data)
    envelope = obj["attestation_bundles"][0]["attestations"][0]["envelope"]
    sig = bytearray(base64.b64decode(envelope["signature"]))
    sig[10] ^= 1
    envelope["signature"] = base64.b64encode(bytes(sig)).decode()
    return json.dumps(obj).encode()


# ------------------------------------------------------------ pure decisions

def test_specs_parse_and_match() -> None:
    spec = parse_spec(REAL_PUBLISHER)
    assert spec == PublisherSpec("github", "trailofbits/pypi-attestations", "release.yml")
    assert str(spec) == REAL_PUBLISHER
    assert parse_spec("github:Trailofbits/pypi-attestations").matches(spec)  # no workflow: any workflow
    assert not parse_spec("github:trailofbits/pypi-attestations@other.yml").matches(spec)
    assert parse_spec("gitlab:group/sub/project").identity == "group/sub/project"
    assert parse_spec("google:sa@project.iam.gserviceaccount.com").kind == "google"
    for bad in ("github:onlyowner", "bitbucket:a/b", "google:not-an-email", "github:a/b/c", "", 7):
        with pytest.raises(ValueError, match="github:OWNER/REPO"):
            parse_spec(bad)
    assert rules.parse_trusted_publishers(["Foo_Bar=github:a/b"]) == {"foo-bar": PublisherSpec("github", "a/b")}
    assert rules.ProvenancePolicy("pin", {}, rules.parse_project_modes("internal-*=off,x=require")).mode_for("internal-a") == "off"


def test_decide_covers_every_mode() -> None:
    pin = parse_spec(REAL_PUBLISHER)
    other = parse_spec("github:someone/else")
    verified = Outcome("verified", publisher=pin)
    missing, invalid = Outcome("missing"), Outcome("invalid", "bad")
    assert [decide("off", pin, o) for o in (verified, missing, invalid)] == [None, None, None]
    assert [decide("verify", None, o) for o in (verified, missing, invalid)] == [None, None, rules.RULE_INVALID]
    assert [decide("pin", None, o) for o in (verified, missing, invalid)] == [None, None, rules.RULE_INVALID]
    assert [decide("pin", pin, o) for o in (verified, missing, invalid)] == [None, rules.RULE_MISSING, rules.RULE_INVALID]
    assert decide("pin", other, verified) == rules.RULE_CHANGED
    assert [decide("require", None, o) for o in (verified, missing, invalid)] == [None, rules.RULE_MISSING, rules.RULE_INVALID]
    unavailable = Outcome("unavailable", "not fetched")
    assert [decide(m, pin, unavailable) for m in rules.MODES] == [None, *[rules.RULE_UNAVAILABLE] * 3]
    assert rule_fault(rules.RULE_UNAVAILABLE) is Fault.UPSTREAM and rule_fault(rules.RULE_INVALID) is Fault.REPOSITORY


# ------------------------------------------------------------ the verifier, on real bundles, offline

@pytest.fixture
def offline_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SigstoreTrust:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "unused"))  # restored after the test (prepare sets it)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "unused"))
    trust = SigstoreTrust("production", offline=True)
    trust.prepare(tmp_path / "sigstore")
    return trust


def test_real_bundles_verify_and_variants_do_not(offline_trust: SigstoreTrust, tmp_path: Path) -> None:
    real_sha = hashlib.sha256((ASSETS / REAL).read_bytes()).hexdigest()
    gitlab_sha = hashlib.sha256((ASSETS / GITLAB).read_bytes()).hexdigest()
    good = verify_offline(False, real_provenance(), REAL, real_sha)
    assert good.state == "verified" and str(good.publisher) == REAL_PUBLISHER
    assert good.digest == hashlib.sha256(real_provenance()).hexdigest()
    assert str(verify_offline(False, gitlab_provenance(), GITLAB, gitlab_sha).publisher) == GITLAB_PUBLISHER
    bad = {
        "tampered signature": verify_offline(False, tampered(real_provenance()), REAL, real_sha),
        "wrong digest": verify_offline(False, real_provenance(), REAL, "0" * 64),
        "another file's provenance": verify_offline(False, gitlab_provenance(), REAL, real_sha),
        "invalid JSON": verify_offline(False, b"{not json", REAL, real_sha),
        "no bundle": verify_offline(False, b'{"version": 1, "attestation_bundles": []}', REAL, real_sha),
    }
    assert {k: v.state for k, v in bad.items()} == dict.fromkeys(bad, "invalid"), bad
    assert "digest" in bad["wrong digest"].detail
    assert "subject does not match" in bad["another file's provenance"].detail
    # Production bundles do not verify against the staging trust root (which ships with sigstore-python too).
    assert verify_offline(True, real_provenance(), REAL, real_sha).state == "invalid"
    # The real staging bundle (signed by an e-mail login, no PEP 740 publisher kind): the staging root accepts its
    # chain and only the publisher policy refuses it; the production root refuses the chain itself.
    attestation = json.loads((ASSETS / "rfc8785-0.1.2-py3-none-any.whl.publish.attestation").read_bytes())
    wheel = "rfc8785-0.1.2-py3-none-any.whl"
    as_google = json.dumps({"version": 1, "attestation_bundles": [{"publisher": {"kind": "Google", "email": "william@yossarian.net"},
                                                                   "attestations": [attestation]}]}).encode()
    wheel_sha = hashlib.sha256((ASSETS / wheel).read_bytes()).hexdigest()
    assert "OIDCIssuer does not match" in verify_offline(True, as_google, wheel, wheel_sha).detail
    assert "certificate chain" in verify_offline(False, as_google, wheel, wheel_sha).detail
    # A FILE trust root: the shipped production root, given as a file, verifies; the staging one does not.
    from sigstore._utils import read_embedded

    prod_file, stage_file = tmp_path / "prod.json", tmp_path / "stage.json"
    prod_file.write_bytes(read_embedded("trusted_root.json", "https://tuf-repo-cdn.sigstore.dev"))
    stage_file.write_bytes(read_embedded("trusted_root.json", "https://tuf-repo-cdn.sigstage.dev"))
    for path, state in ((prod_file, "verified"), (stage_file, "invalid")):
        trust = SigstoreTrust(str(path), offline=False)
        trust.prepare(tmp_path / f"home-{path.stem}")
        assert trust.unavailable() is None  # a FILE is offline: nothing to refresh
        assert verify_offline(False, real_provenance(), REAL, real_sha).state == state


# ------------------------------------------------------------ verification in worker processes

@pytest.mark.slow
def test_workers_verify_a_dead_one_costs_one_file_and_none_outlives_its_parent(offline_trust: SigstoreTrust,
                                                                              tmp_path: Path) -> None:
    real_sha = hashlib.sha256((ASSETS / REAL).read_bytes()).hexdigest()

    async def check() -> Outcome:
        return await offline_trust.check(real_provenance(), REAL, real_sha)

    from sigstore._utils import read_embedded

    slot = tmp_path / "sigstore" / "cache" / "sigstore-python" / "tuf" / urllib.parse.quote(
        "https://tuf-repo-cdn.sigstore.dev", safe="") / "trusted_root.json"

    async def scenario() -> list[Outcome]:
        first = await check()
        # A worker keeps its sigstore Verifier while the trust root file stays the same, and builds a new one
        # when a refresh replaces it: here with the staging root, which refuses production's chain.
        production = slot.read_bytes()
        slot.write_bytes(read_embedded("trusted_root.json", "https://tuf-repo-cdn.sigstage.dev"))
        assert "certificate chain" in (await check()).detail
        slot.write_bytes(production)
        assert (await check()).state == "verified"
        pool = offline_trust._pool
        assert pool is not None
        for pid in [p.pid for p in pool._processes.values()]:  # killed as the OOM killer would
            os.kill(pid, signal.SIGKILL)
        return [first, await check(), await check()]

    try:
        first, lost, again = asyncio.run(scenario())
    finally:
        offline_trust.close()
    assert first.state == "verified" and again.state == "verified", (first, again)
    assert lost.state == "unavailable" and "worker died" in lost.detail, lost
    # A parent killed outright (no cleanup runs) takes its verification workers with it.
    script = tmp_path / "parent.py"
    script.write_text(f"""
import asyncio, os, signal, sys
from pathlib import Path
from proxy.trust.provenance import SigstoreTrust
async def main():
    trust = SigstoreTrust("production", offline=True, processes=2)
    trust.prepare(Path({str(tmp_path / "home")!r}))
    await asyncio.gather(*(trust.check(b"{{}}", "a-1.tar.gz", "0" * 64) for _ in range(4)))
    print(*[p.pid for p in trust._pool._processes.values()], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if __name__ == "__main__":  # the spawned workers import this file again
    asyncio.run(main())
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[1])
    workers = [int(pid) for pid in done.stdout.split()]
    assert len(workers) == 2, done.stderr

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie has exited

    wait_for(lambda: all(gone(pid) for pid in workers), "verification workers gone with their parent")


def test_the_seam_a_worker_keeps_its_verifier_through_is_still_there() -> None:
    """Workers keep a Verifier by wrapping ``Verifier.production``/``staging``; pypi-attestations must still build
    its verifier through them (else each attestation pays for parsing the trust root again: slower, not wrong)."""
    import inspect

    import pypi_attestations._impl as impl
    from sigstore.verify import Verifier

    assert impl.Verifier is Verifier
    source = inspect.getsource(impl.Attestation.verify)
    assert "Verifier.production(offline=offline)" in source and "Verifier.staging(offline=offline)" in source


# ------------------------------------------------------------ online: the trust root refreshed once, not per file

class RefusingProxy:
    """An HTTPS proxy on 127.0.0.1 that refuses every CONNECT and counts them: the Sigstore CDN unreachable."""

    def __init__(self) -> None:
        self.connects = 0
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[socketserver.StreamRequestHandler]:
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                if self.rfile.readline(8192).startswith(b"CONNECT "):
                    proxy.connects += 1
                self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

        return Handler

    def __enter__(self) -> RefusingProxy:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def unreachable_cdn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RefusingProxy]:
    for name in ("XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(name, str(tmp_path / "unused"))  # restored after the test (prepare sets them)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with RefusingProxy() as proxy:
        for name in ("HTTPS_PROXY", "https_proxy"):
            monkeypatch.setenv(name, proxy.url)  # python-tuf's fetcher takes it: nothing leaves 127.0.0.1
        yield proxy


def test_online_verification_refreshes_the_trust_root_once_not_per_attestation(tmp_path: Path,
                                                                               unreachable_cdn: RefusingProxy) -> None:
    """pypi-attestations left to itself refreshes over TUF for each attestation; here one refresh serves all, a
    failed one is not retried per file, and a file that cannot be checked is ``unavailable``, never ``invalid``."""
    from sigstore.models import ClientTrustConfig

    with pytest.raises(Exception, match="TUF"):
        ClientTrustConfig.production(offline=False)  # what one refresh costs at this proxy
    one_refresh, unreachable_cdn.connects = unreachable_cdn.connects, 0
    assert one_refresh >= 1
    real_sha = hashlib.sha256((ASSETS / REAL).read_bytes()).hexdigest()
    trust = SigstoreTrust("production", offline=False)
    trust.prepare(tmp_path / "sigstore")

    async def page_of_files() -> list[Outcome]:  # as the gateway checks a page's files: all at once
        return await asyncio.gather(*(trust.check(real_provenance(), REAL, real_sha) for _ in range(16)))

    outcomes = asyncio.run(page_of_files())
    assert {o.state for o in outcomes} == {"unavailable"}, outcomes[0]
    assert "no current Sigstore trust root" in outcomes[0].detail and "TUF" in outcomes[0].detail
    assert unreachable_cdn.connects == one_refresh
    # The edge refuses such a file as the upstream's fault (502, audited), not as the repository's lie.
    edge = EdgeProvenance(trust, tmp_path / "pins.jsonl")
    with pytest.raises(ProvenanceUnavailable) as refused:
        asyncio.run(edge.check("pypi-attestations", REAL, f"packages/pypi-attestations/{REAL}", real_sha,
                               real_provenance()))
    trust.close()
    assert row(refused.value).fault is Fault.UPSTREAM and row(refused.value).status == 502
    assert unreachable_cdn.connects == one_refresh and not edge.known(f"packages/pypi-attestations/{REAL}", real_sha)


def test_a_recently_refreshed_trust_root_outlives_a_failed_refresh_for_a_day(tmp_path: Path,
                                                                           unreachable_cdn: RefusingProxy) -> None:
    trust = SigstoreTrust("production", offline=False)
    trust.prepare(tmp_path / "sigstore")
    now = time.monotonic()
    trust._refreshed = now - sigstore_trust.REFRESH_SECONDS - 1  # due again, and the CDN does not answer
    assert trust.unavailable() is None
    assert unreachable_cdn.connects >= 1
    trust._refreshed, trust._failed = now - sigstore_trust.STALE_SECONDS - 1, None
    assert "no current Sigstore trust root" in (trust.unavailable() or "")


# ------------------------------------------------------------ end to end, a gateway process

class ProvenanceIndex(TestIndex):
    """The test index plus PEP 740: each file may have a provenance object at the Integrity API path."""

    __test__ = False

    def __init__(self, mode: str = "negotiate") -> None:
        super().__init__(mode, separate_files_host=True)
        self.provenance: dict[str, bytes] = {}  # filename -> the object served
        self.provenance_url: dict[str, str] = {}  # filename -> a URL of the test's choosing
        self.slow: threading.Event = threading.Event()
        self.slow_files: set[str] = set()

    def page(self, project: str) -> index.ProjectPage:
        page = super().page(project)
        files = []
        for f in page.files:
            url = self.provenance_url.get(f.filename)
            if url is None and f.filename in self.provenance:
                url = f"/integrity/{project}/v/{f.filename}/provenance"  # relative: resolved against the page
            files.append(f.__class__(**{**f.__dict__, "provenance": url}))
        return index.ProjectPage(name=page.name, files=tuple(files), versions=page.versions)

    async def _provenance(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.provenance:
            raise web.HTTPNotFound()
        if name in self.slow_files:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b"{")
            await asyncio.get_running_loop().run_in_executor(None, self.slow.wait, 30)
            return response
        return web.Response(body=self.provenance[name], content_type="application/json")

    def _app(self, pages: bool, files: bool) -> web.Application:
        app = super()._app(pages, files)
        if pages:
            app.router.add_get("/integrity/{project}/{version}/{name}/provenance", self._provenance)
        return app


def _fill(idx: ProvenanceIndex, dists: Path) -> None:
    """The real files with their real provenance, and sample wheels for the variants."""
    dists.mkdir(parents=True, exist_ok=True)
    for name in (REAL, GITLAB):
        shutil.copy(ASSETS / name, dists / name)
        idx.add(dists / name)
    idx.provenance[REAL] = real_provenance()
    idx.provenance[GITLAB] = gitlab_provenance()
    variants = {
        "plain": None,  # no provenance at all
        "badjson": b"{not json",
        "huge": b'{"version": 1, "attestation_bundles": [' + b" " * (2 * 2**20) + b"]}",
        "otherfile": real_provenance(),  # another file's (real) provenance
        "slowhost": real_provenance(),
        "foreign": real_provenance(),
    }
    for project, body in variants.items():
        wheel = build_wheel(dists, project, "1.0")
        idx.add(wheel)
        if body is not None:
            idx.provenance[wheel.name] = body
    idx.slow_files.add("slowhost-1.0-py3-none-any.whl")
    idx.provenance_url["foreign-1.0-py3-none-any.whl"] = "http://127.0.0.2:9/integrity/foreign/1.0/x/provenance"


@pytest.fixture(params=["negotiate", "html"])
def prov_index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProvenanceIndex]:
    idx = ProvenanceIndex(request.param)
    _fill(idx, tmp_path / "dists")
    with idx:
        try:
            yield idx
        finally:
            idx.slow.set()  # the stalled provenance answer ends, so the index can stop


def _gateway(tmp_path: Path, idx: ProvenanceIndex, *args: str) -> GatewayProcess:
    if not (tmp_path / "gw").exists():
        gateway_init(tmp_path / "gw")
    return GatewayProcess(tmp_path / "gw", "--index-url", idx.url, "--files-origin", idx.files_url, "--page-ttl", "1",
                          "--refresh-rate", "100",                          "--batch-window", "0.05", "--read-timeout", "1", "--sigstore-offline", "yes", *args)


def signed_files(gw_dir: Path, project: str) -> list[str]:
    page = Repository.open(gw_dir).current_page(project)
    return [] if page is None else [f.filename for f in page.files]


def signed_target(gw_dir: Path, target: str) -> dict:  # type: ignore[type-arg]
    """The newest signed entry for ``target`` in the gateway's delegated targets metadata (KeyError: none)."""
    found: dict[int, dict] = {}  # type: ignore[type-arg]
    for path in (gw_dir / "public" / "metadata").glob("*.json"):
        signed = json.loads(path.read_bytes())["signed"]
        if target in signed.get("targets", {}):
            found[signed["version"]] = signed["targets"][target]
    return found[max(found)] if found else {}[target]


def refusals(gw: GatewayProcess, rule: str) -> list[dict]:  # type: ignore[type-arg]
    return [r for r in gw.audit() if r.get("reason") == rule]


def provenance_cli(gw_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "gateway", "provenance", str(gw_dir), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_pin_mode_verifies_pins_refuses_bad_input_and_keeps_pins_across_restart(tmp_path: Path,
                                                                                 prov_index: ProvenanceIndex) -> None:
    gw_dir = tmp_path / "gw"
    with _gateway(tmp_path, prov_index) as gw:
        for project in ("pypi-attestations", "gitlab-oidc-project", "plain"):
            assert gw.publish(project)[0] == 200
        assert signed_files(gw_dir, "pypi-attestations") == [REAL]
        assert signed_files(gw_dir, "gitlab-oidc-project") == [GITLAB]
        assert "PEP 740 provenance pin; trusted publishers: none" in gw.log()
        assert signed_files(gw_dir, "plain") == ["plain-1.0-py3-none-any.whl"]  # no provenance, no pin: published
        # Bad input: each file left out with a clear reason; its project page signs without it.
        for project, words in (("badjson", "not a PEP 740 provenance object"), ("huge", "larger than"),
                               ("otherfile", "subject does not match"), ("foreign", "neither the index nor a --files-origin")):
            assert gw.publish(project)[0] == 200, project
            assert signed_files(gw_dir, project) == [], project
            record = next(r for r in refusals(gw, rules.RULE_INVALID) if r["project"] == project)
            assert words in record["detail"] and record["file"] == f"{project}-1.0-py3-none-any.whl", record
            assert record["fault"] == "repository", record
        # A provenance host that does not answer in time: left out too, but as the upstream's fault, not a lie.
        assert gw.publish("slowhost")[0] == 200
        assert signed_files(gw_dir, "slowhost") == []
        record = next(r for r in refusals(gw, rules.RULE_UNAVAILABLE) if r["project"] == "slowhost")
        assert "not fetched" in record["detail"] and record["fault"] == "upstream", record
        # The signed page never carries the index's provenance URL: its own, to the signed provenance target.
        page = Repository.open(gw_dir).current_page("pypi-attestations")
        assert page is not None and page.files[0].provenance == f"../../packages/pypi-attestations/{REAL}.provenance"
        assert Repository.open(gw_dir).current_page("plain").files[0].provenance is None  # type: ignore[union-attr]
        # The verified provenance object is a signed target: its custom field names the publisher and the file.
        target = f"simple/pypi-attestations/{REAL}.provenance"
        info = signed_target(gw_dir, target)
        assert info["hashes"]["sha256"] == hashlib.sha256(real_provenance()).hexdigest()
        assert info["custom"] == {"provenance": {"publisher": REAL_PUBLISHER, "file": REAL, "file_sha256": hashlib.sha256(
            (ASSETS / REAL).read_bytes()).hexdigest()}}
        assert urllib.request.urlopen(f"{gw.base}{target}", timeout=10).read() == real_provenance()
        with pytest.raises(KeyError):
            signed_target(gw_dir, "simple/otherfile/otherfile-1.0-py3-none-any.whl.provenance")  # refused: never signed
    listed = json.loads(provenance_cli(gw_dir, "--json").stdout)
    assert {(p["project"], p["spec"], p["filename"]) for p in listed} == {
        ("pypi-attestations", REAL_PUBLISHER, REAL), ("gitlab-oidc-project", GITLAB_PUBLISHER, GITLAB)}
    # A restart keeps the pins: a new file of a pinned project without provenance is left out at the next refresh.
    build = build_wheel(tmp_path / "dists", "pypi-attestations", "0.0.20")
    prov_index.add(build)
    with _gateway(tmp_path, prov_index) as gw:
        wait_for(lambda: refusals(gw, rules.RULE_MISSING), "provenance-missing after restart")
        record = refusals(gw, rules.RULE_MISSING)[0]
        assert record["file"] == build.name and record["expected"] == REAL_PUBLISHER and record["seen"] is None
        assert signed_files(gw_dir, "pypi-attestations") == [REAL]
        metrics = urllib.request.urlopen(f"{gw.base}metrics", timeout=10).read().decode()
        assert 'tufproxy_gateway_refusals_total{kind="operator",reason="provenance-missing"} 1.0' in metrics


@pytest.mark.slow
def test_a_lost_ledger_gets_the_pinned_publisher_back_from_the_signed_provenance(tmp_path: Path) -> None:
    """Without the rebuild, a gateway that lost its ledger would pin again on first use: a new file without
    provenance (or from another publisher) would be signed.  The signed provenance target names the pin."""
    idx = ProvenanceIndex()
    _fill(idx, tmp_path / "dists")
    gw_dir = tmp_path / "gw"
    with idx:
        with _gateway(tmp_path, idx) as gw:
            assert gw.publish("pypi-attestations")[0] == 200
            assert signed_files(gw_dir, "pypi-attestations") == [REAL]
        (gw_dir / "gateway" / "ledger.jsonl").unlink()
        build = build_wheel(tmp_path / "dists", "pypi-attestations", "0.0.20")
        idx.add(build)
        with _gateway(tmp_path, idx) as gw:
            wait_for(lambda: refusals(gw, rules.RULE_MISSING), "provenance-missing with the ledger gone")
            record = refusals(gw, rules.RULE_MISSING)[0]
            assert record["file"] == build.name and record["expected"] == REAL_PUBLISHER, record
            assert signed_files(gw_dir, "pypi-attestations") == [REAL]
            assert "lacked the publisher pin of pypi-attestations" in gw.log()
    listed = json.loads(provenance_cli(gw_dir, "--json").stdout)
    assert [(p["project"], p["spec"], p["filename"]) for p in listed] == [("pypi-attestations", REAL_PUBLISHER, REAL)]


@pytest.mark.slow
def test_edges_serve_their_verified_copy_of_the_provenance(tmp_path: Path) -> None:
    idx = ProvenanceIndex()
    _fill(idx, tmp_path / "dists")
    with idx, _gateway(tmp_path, idx) as gw, edge_for(tmp_path, gw) as edge:
        page_url = f"{edge.base}simple/pypi-attestations/"
        request = urllib.request.Request(page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        entry = json.loads(urllib.request.urlopen(request, timeout=30).read())["files"][0]
        assert entry["filename"] == REAL and entry["provenance"] == f"{entry['url']}.provenance"
        # PEP 740's key points at the edge's own copy, fetched and checked against the signed target.
        served = urllib.request.urlopen(urllib.parse.urljoin(page_url, entry["provenance"]), timeout=30).read()
        assert served == real_provenance()
        request = urllib.request.Request(f"{edge.base}simple/plain/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        assert "provenance" not in json.loads(urllib.request.urlopen(request, timeout=30).read())["files"][0]
        # A provenance object the gateway never signed is not served.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{edge.base}packages/plain/plain-1.0-py3-none-any.whl.provenance", timeout=30)
        assert refused.value.code == 404


def _get(url: str) -> tuple[int, bytes, str]:
    """(status, body, X-Tufproxy-Reason) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read(), r.headers.get("X-Tufproxy-Reason", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("X-Tufproxy-Reason", "")


@pytest.mark.slow
def test_compromise_drill_an_edge_that_verifies_provenance_refuses_what_the_online_key_signs(tmp_path: Path) -> None:
    """An attacker holding the gateway's online key signs a swapped file, and a file without provenance,
    for a pinned project; an edge with --verify-provenance yes refuses both and audits them."""
    idx = ProvenanceIndex()
    _fill(idx, tmp_path / "dists")
    real_url = f"packages/pypi-attestations/{REAL}"
    audit = tmp_path / "edge.audit"
    with idx, _gateway(tmp_path, idx, "--page-ttl", "3600") as gw, \
            ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                         "--workers", "1", "--refresh-interval", "0.5", "--verify-provenance", "yes",
                         "--sigstore-offline", "yes", "--audit-log", str(audit)) as edge:
        status, body, _ = _get(f"{edge.base}{real_url}")  # the miss protocol publishes it; the edge verifies and pins
        assert status == 200 and body == (ASSETS / REAL).read_bytes()
        pins = (tmp_path / "edge" / "provenance-pins.jsonl").read_text()
        assert json.loads(pins) == {"project": "pypi-attestations", "spec": REAL_PUBLISHER}
        assert _get(f"{edge.base}packages/plain/plain-1.0-py3-none-any.whl")[0] == 200  # unpinned, no provenance: served
        # The attacker: the gateway's online key, signing pages the gateway never rendered.
        repo = Repository.open(tmp_path / "gw")
        page = repo.current_page("pypi-attestations")
        assert page is not None
        evil = b"evil bytes"
        swapped = dataclasses.replace(page.files[0], hashes={"sha256": hashlib.sha256(evil).hexdigest()}, size=len(evil))
        unproven = dataclasses.replace(page.files[0], filename="pypi_attestations-0.0.20.tar.gz",
                                       url="../../packages/pypi-attestations/pypi_attestations-0.0.20.tar.gz",
                                       provenance=None, hashes={"sha256": hashlib.sha256(evil).hexdigest()})
        repo.publish_pages({"pypi-attestations": dataclasses.replace(page, files=(swapped, unproven))})
        wait_for(lambda: _get(f"{edge.base}{real_url}")[0] != 200, "the edge to see the attacker's page")
        status, body, reason = _get(f"{edge.base}{real_url}")
        assert (status, reason) == (502, rules.RULE_INVALID) and b"digest" in body, body
        status, body, reason = _get(f"{edge.base}packages/pypi-attestations/pypi_attestations-0.0.20.tar.gz")
        assert (status, reason) == (502, rules.RULE_MISSING), body
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    refused = {r["reason"]: r for r in records if r.get("event") == "refused"}
    assert refused[rules.RULE_INVALID]["target"] == real_url
    assert refused[rules.RULE_MISSING]["expected"] == REAL_PUBLISHER


@pytest.mark.slow
def test_mirror_sync_carries_provenance_and_verify_checks_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from proxy.cli import main

    idx = ProvenanceIndex()
    _fill(idx, tmp_path / "dists")
    dest = tmp_path / "mirror"

    def sync() -> None:
        with _gateway(tmp_path, idx) as gw:
            assert gw.publish("pypi-attestations")[0] == 200
            assert main(["mirror", "sync", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                         "--dest", str(dest), "--project", "pypi-attestations"]) == 0

    root = str(tmp_path / "gw" / "public" / "metadata" / "1.root.json")
    target = f"simple/pypi-attestations/{REAL}.provenance"
    with idx:
        sync()
        carried = dest / target
        assert carried.read_bytes() == real_provenance()
        capsys.readouterr()
        assert main(["mirror", "verify", str(dest), "--root", root]) == 0
        out = capsys.readouterr().out
        assert "0 missing, 0 corrupt" in out and "1 provenance object(s) verified with Sigstore, 0 refused" in out
        carried.write_bytes(tampered(real_provenance()))  # same length, other bytes: offline, the signed hash says no
        assert main(["mirror", "verify", str(dest), "--root", root]) != 0
        assert f"corrupt {target}" in capsys.readouterr().out
        # A holder of the gateway's online key signs a tampered provenance object: every hash holds, Sigstore does not.
        Repository.open(tmp_path / "gw").publish_target(target, tampered(real_provenance()))
        sync()
    capsys.readouterr()
    assert main(["mirror", "verify", str(dest), "--root", root, "--provenance", "no"]) == 0
    assert main(["mirror", "verify", str(dest), "--root", root]) == 1
    out = capsys.readouterr().out
    assert f"provenance refused {target}: " in out and "NOT SOUND" in out and "0 corrupt" in out, out
    assert main(["mirror", "verify", str(dest), "--root", root, "--sigstore-trust-root", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--sigstore-trust-root" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_publisher_changed_then_accept(tmp_path: Path) -> None:
    idx = ProvenanceIndex()
    _fill(idx, tmp_path / "dists")
    with idx:
        # The operator pins another publisher up front: the real file's verified publisher no longer matches.
        with _gateway(tmp_path, idx, "--trusted-publisher", "pypi-attestations=github:someone/else") as gw:
            assert gw.publish("pypi-attestations")[0] == 200
            assert signed_files(tmp_path / "gw", "pypi-attestations") == []
            record = refusals(gw, rules.RULE_CHANGED)[0]
            assert (record["expected"], record["seen"]) == ("github:someone/else", REAL_PUBLISHER)
        # --accept records the change in the ledger and the audit log (a pin, separate from the flag).
        audit = tmp_path / "accept.audit"
        done = provenance_cli(tmp_path / "gw", "--accept", f"gitlab-oidc-project={GITLAB_PUBLISHER}", "--reason",
                              "moved CI", "--audit-log", str(audit))
        assert done.returncode == 0, done.stderr
        assert json.loads(audit.read_text())["reason"] == "publisher-accepted"
        listed = json.loads(provenance_cli(tmp_path / "gw", "--json").stdout)
        assert listed == [{**listed[0], "project": "gitlab-oidc-project", "spec": GITLAB_PUBLISHER, "accepted": True,
                           "reason": "moved CI"}]
        bad = provenance_cli(tmp_path / "gw", "--accept", "x=bitbucket:a/b", "--reason", "r")
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and "github:OWNER/REPO" in bad.stderr
        assert provenance_cli(tmp_path / "gw", "--accept", "x=github:a/b").returncode == 2  # no --reason
        nowhere = provenance_cli(tmp_path / "nowhere")
        assert nowhere.returncode == 2 and "no gateway here" in nowhere.stderr and not (tmp_path / "nowhere").exists()
        # The accepted pin holds: the real GitLab file verifies against it and publishes.
        with _gateway(tmp_path, idx) as gw:
            assert gw.publish("gitlab-oidc-project")[0] == 200
            assert signed_files(tmp_path / "gw", "gitlab-oidc-project") == [GITLAB]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "plain", "badjson"), [("off", True, True), ("verify", True, False),
                                                          ("require", False, False)])
def test_modes(tmp_path: Path, mode: str, plain: bool, badjson: bool) -> None:
    idx = ProvenanceIndex()
    _fill(idx, tmp_path / "dists")
    with idx, _gateway(tmp_path, idx, "--provenance", mode, "--provenance-project", "gitlab-*=off") as gw:
        for project in ("plain", "badjson", "pypi-attestations"):
            assert gw.publish(project)[0] == 200
        assert bool(signed_files(tmp_path / "gw", "plain")) is plain
        assert bool(signed_files(tmp_path / "gw", "badjson")) is badjson
        assert signed_files(tmp_path / "gw", "pypi-attestations") == [REAL]
        pinned = json.loads(provenance_cli(tmp_path / "gw", "--json").stdout)
        assert bool(pinned) is (mode == "require")  # verify and off pin nothing


@pytest.mark.slow
def test_settings_refuse_bad_values_in_one_line(tmp_path: Path) -> None:
    gateway_init(tmp_path / "gw")
    for args in (["--provenance", "maybe"], ["--trusted-publisher", "x=svn:a"], ["--sigstore-trust-root", "/nonexistent"],
                 ["--sigstore-offline", "perhaps"]):
        done = subprocess.run([sys.executable, "-m", "proxy", "gateway", "serve", str(tmp_path / "gw"), "--index-url",
                               "http://127.0.0.1:9/simple/", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
