"""OSV advisories at the gateway: ``gateway advisories import``, policy, and blocks reaching edges within seconds.

Records are built here in the form OSV publishes them (tests/test_osv.py has the
builders); the chain is a test index -> ``tufproxy gateway serve`` -> an edge
(``tufproxy serve --profile gateway``) -> pip.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import install
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init, metric
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex
from tests.test_osv import V3_MEDIUM, mal, pysec

FAST = 5.0  # the goal, from import to an edge no longer offering the file
LIMIT = 20.0  # the bound in any case: the assertion (a busy shared machine must not fail the test)


def tufproxy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=timeout)


def write(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


@pytest.mark.slow
def test_import_files_dirs_and_zips_with_malformed_records(tmp_path: Path) -> None:
    gateway_init(tmp_path / "gw")
    single = write(tmp_path / "one" / "MAL-2024-1.json", mal())
    folder = tmp_path / "many"
    write(folder / "PYSEC-2024-7.json", pysec())
    write(folder / "bad-range.json", pysec(ident="PYSEC-2024-8", events=({"fixed": "1.0"},)))
    (folder / "broken.json").write_text("{not json")
    with zipfile.ZipFile(tmp_path / "all.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("GHSA-1111-2222-3333.json", json.dumps(pysec(ident="GHSA-1111-2222-3333", aliases=())))
        zf.writestr("NPM-1.json", json.dumps({"id": "GHSA-npm", "modified": "2024-01-01T00:00:00Z",
                                              "affected": [{"package": {"ecosystem": "npm", "name": "x"}}]}))
        zf.writestr("MAL-2024-2.json", json.dumps(mal(ident="MAL-2024-2", name="other")))
    r = tufproxy("gateway", "advisories", "import", str(tmp_path / "gw"), str(single), str(folder), str(tmp_path / "all.zip"))
    assert r.returncode == 0, r.stderr
    assert "skipped 2 malformed record(s)" in r.stderr and "bad-range.json" in r.stderr and "broken.json" in r.stderr
    assert "read 7 record(s): 4 name PyPI packages, 4 new or newer, 2 skipped" in r.stdout
    listing = json.loads(tufproxy("gateway", "advisories", str(tmp_path / "gw"), "--json").stdout)
    assert listing["records"] == 4 and listing["counts"]["malicious"] == 2 and listing["counts"]["vulnerability"] == 2
    assert listing["newest_modified"] == "2024-06-01T00:00:00Z" and listing["last_import"]
    # An older record of a held id changes nothing; a withdrawn newer one is kept (and lifts the block).
    write(tmp_path / "old.json", mal(modified="2020-01-01T00:00:00Z"))
    write(tmp_path / "gone.json", mal(modified="2025-01-01T00:00:00Z", withdrawn="2025-01-01T00:00:00Z"))
    r = tufproxy("gateway", "advisories", "import", str(tmp_path / "gw"), str(tmp_path / "old.json"), str(tmp_path / "gone.json"))
    assert "2 new or newer" not in r.stdout and "1 new or newer" in r.stdout
    assert json.loads(tufproxy("gateway", "advisories", str(tmp_path / "gw"), "--json").stdout)["counts"]["withdrawn"] == 1
    # Bad input: one line, exit 2, nothing lost.
    for argv in (("import", str(tmp_path / "gw"), str(tmp_path / "missing.zip")), ("import", str(tmp_path / "gw")),
                 (str(tmp_path / "nowhere"),)):
        r = tufproxy("gateway", "advisories", *argv)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "corrupt.zip").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    assert tufproxy("gateway", "advisories", "import", str(tmp_path / "gw"), str(tmp_path / "corrupt.zip")).returncode in (0, 2)
    assert json.loads(tufproxy("gateway", "advisories", str(tmp_path / "gw"), "--json").stdout)["records"] == 4


@pytest.fixture
def evil_index(tmp_path: Path) -> Iterator[TestIndex]:
    index = TestIndex(separate_files_host=True)
    for version in ("1.0", "2.0"):
        index.add(build_wheel(tmp_path / "dists", "evil-pkg", version))
    for version in ("1.0", "2.0"):
        index.add(build_wheel(tmp_path / "dists", "requests-like", version))
    with index:
        yield index


def _gateway(tmp_path: Path, index: TestIndex, *args: str) -> GatewayProcess:
    if not (tmp_path / "gw").exists():
        gateway_init(tmp_path / "gw")
    return GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--files-origin", index.files_url,
                          "--batch-window", "0.1", *args)


def _edge_offers(edge_url: str, project: str) -> set[str]:
    req = urllib.request.Request(f"{edge_url}{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return {f["filename"] for f in json.loads(r.read())["files"]}


def _installed(target: Path, project: str) -> str | None:
    found = [p.name.removesuffix(".dist-info").split("-")[1] for p in target.glob(f"{project.replace('-', '_')}-*.dist-info")]
    return found[0] if found else None


@pytest.mark.slow
def test_import_blocks_at_the_edge_within_seconds_and_withdrawn_lifts(tmp_path: Path, evil_index: TestIndex) -> None:
    bad = "evil_pkg-2.0-py3-none-any.whl"
    with _gateway(tmp_path, evil_index) as gw, edge_for(tmp_path, gw) as edge:
        r = install("pip", edge.url, tmp_path / "t1", "evil-pkg")
        assert r.returncode == 0 and _installed(tmp_path / "t1", "evil-pkg") == "2.0", r.stdout + r.stderr
        record = write(tmp_path / "MAL-2024-9.json", mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",)))
        start = time.monotonic()
        assert tufproxy("gateway", "advisories", "import", str(gw.directory), str(record)).returncode == 0
        wait_for(lambda: bad not in _edge_offers(edge.url, "evil-pkg"), "the edge dropping the blocked file", timeout=LIMIT)
        blocked_after = time.monotonic() - start
        r = install("pip", edge.url, tmp_path / "t2", "evil-pkg")
        assert r.returncode == 0 and _installed(tmp_path / "t2", "evil-pkg") == "1.0", r.stdout + r.stderr
        audit = [a for a in gw.audit() if a.get("reason") == "advisory-malicious"]
        assert audit and audit[0]["advisory"] == "MAL-2024-9" and audit[0]["file"] == bad
        assert audit[0]["project"] == "evil-pkg" and audit[0]["version"] == "2.0" and audit[0]["target"] == f"packages/evil-pkg/{bad}"
        assert metric(gw.base, 'tufproxy_gateway_advisory_blocked_files{rule="advisory-malicious"}') == 1
        listing = json.loads(tufproxy("gateway", "advisories", str(gw.directory), "--json").stdout)
        assert [(b["advisory"], b["file"]) for b in listing["blocks_in_force"]] == [("MAL-2024-9", bad)]
        assert bad not in (gw.directory / "public" / "simple" / "evil-pkg" / "index.json").read_text()
        # Withdrawn: the file comes back as fast.
        write(record, mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",), modified="2024-09-01T00:00:00Z",
                          withdrawn="2024-09-01T00:00:00Z"))
        start = time.monotonic()
        assert tufproxy("gateway", "advisories", "import", str(gw.directory), str(record)).returncode == 0
        wait_for(lambda: bad in _edge_offers(edge.url, "evil-pkg"), "the edge offering the file again", timeout=LIMIT)
        lifted_after = time.monotonic() - start
        assert metric(gw.base, 'tufproxy_gateway_advisory_blocked_files{rule="advisory-malicious"}') == 0
        assert json.loads(tufproxy("gateway", "advisories", str(gw.directory), "--json").stdout)["blocks_in_force"] == []
    print(f"import -> edge blocks in {blocked_after:.2f}s, withdrawn -> edge offers in {lifted_after:.2f}s (goal {FAST}s)")


@pytest.mark.slow
def test_vulnerable_threshold_allow_and_policy_display(tmp_path: Path, evil_index: TestIndex) -> None:
    gateway_init(tmp_path / "gw")
    write(tmp_path / "recs" / "PYSEC-2024-7.json", pysec(events=({"introduced": "0"}, {"fixed": "2.0"})))  # critical, 1.0
    write(tmp_path / "recs" / "GHSA-m.json", pysec(ident="GHSA-mmmm-mmmm-mmmm", aliases=(), name="evil-pkg",
                                                 events=({"introduced": "2.0"},), severity=(("CVSS_V3", V3_MEDIUM),)))
    assert tufproxy("gateway", "advisories", "import", str(tmp_path / "gw"), str(tmp_path / "recs")).returncode == 0
    args = ("--block-vulnerable", "medium", "--allow-advisory", "GHSA-aaaa-bbbb-cccc")  # an alias of PYSEC-2024-7
    with _gateway(tmp_path, evil_index, *args) as gw, edge_for(tmp_path, gw) as edge:
        assert _edge_offers(edge.url, "requests-like") == {"requests_like-1.0-py3-none-any.whl", "requests_like-2.0-py3-none-any.whl"}
        assert _edge_offers(edge.url, "evil-pkg") == {"evil_pkg-1.0-py3-none-any.whl"}
        audit = [a for a in gw.audit() if a.get("reason") == "advisory-vulnerable"]
        assert [(a["advisory"], a["severity"], a["version"]) for a in audit] == [("GHSA-mmmm-mmmm-mmmm", "medium", "2.0")]
        accepted = [a for a in gw.audit() if a.get("reason") == "advisory-allowed"]
        assert [(a["advisory"], a["file"]) for a in accepted] == [("PYSEC-2024-7", "requests_like-1.0-py3-none-any.whl")]
        assert metric(gw.base, 'tufproxy_gateway_advisory_blocked_files{rule="advisory-vulnerable"}') == 1
    shown = tufproxy("gateway", "policy", str(tmp_path / "gw"))
    assert "block-vulnerable (from severity): medium" in shown.stdout and "allow-advisory: GHSA-aaaa-bbbb-cccc" in shown.stdout
    assert "block-malicious (OSV advisories): yes" in shown.stdout
    r = tufproxy("gateway", "serve", str(tmp_path / "gw"), "--index-url", evil_index.url, "--block-vulnerable", "severe")
    assert r.returncode == 2 and "--block-vulnerable" in r.stderr and "severe" in r.stderr


@pytest.mark.slow
def test_a_200_mb_zip_imports_in_bounded_memory(tmp_path: Path) -> None:
    gateway_init(tmp_path / "gw")
    padding = "x" * 100_000  # compresses to almost nothing: 200 MB of records in a small file
    with zipfile.ZipFile(tmp_path / "all.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(2000):
            zf.writestr(f"PYSEC-2024-{i}.json", json.dumps(pysec(ident=f"PYSEC-2024-{i}", name=f"p{i}", details=padding)))
    # VmHWM: this process image's own peak (ru_maxrss would also count pytest's pages it was forked from).
    code = ("import sys\nfrom proxy.cli import main\nrc = main(sys.argv[1:])\n"
            "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "print(hwm, file=sys.stderr)\nsys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code, "gateway", "advisories", "import", str(tmp_path / "gw"), str(tmp_path / "all.zip")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "2000 new or newer" in r.stdout
    rss_mb = int(r.stderr.strip().splitlines()[-1]) / 1024
    assert rss_mb < 150, rss_mb  # the whole uncompressed set is 200 MB
    assert sum(i.file_size for i in zipfile.ZipFile(tmp_path / "all.zip").infolist()) > 200_000_000


@pytest.mark.slow
def test_hash_blocks_a_file_whatever_its_version_says(tmp_path: Path, evil_index: TestIndex) -> None:
    gateway_init(tmp_path / "gw")
    wheel = evil_index.file("evil_pkg-1.0-py3-none-any.whl")
    record = mal(ident="MAL-2024-3", name="evil-pkg", versions=())
    record["database_specific"]["malicious-packages-origins"][0]["sha256"] = hashlib.sha256(wheel.data).hexdigest()
    write(tmp_path / "MAL-2024-3.json", record)
    assert tufproxy("gateway", "advisories", "import", str(tmp_path / "gw"), str(tmp_path / "MAL-2024-3.json")).returncode == 0
    with _gateway(tmp_path, evil_index) as gw, edge_for(tmp_path, gw) as edge:
        assert _edge_offers(edge.url, "evil-pkg") == {"evil_pkg-2.0-py3-none-any.whl"}
        # A client asking for the blocked file by name (an old lock) is told which advisory keeps it out.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{edge.base}packages/evil-pkg/evil_pkg-1.0-py3-none-any.whl", timeout=30)
        body = refused.value.read().decode()
        assert refused.value.code == 404 and "evil_pkg-1.0-py3-none-any.whl: hidden by the gateway's policy " \
            "(advisory-malicious MAL-2024-3)" in body, body
        why = subprocess.run([sys.executable, "-m", "proxy", "why", "evil-pkg==1.0", "--gateway", gw.base],
                             capture_output=True, text=True, timeout=120)
        assert why.returncode == 1 and why.stdout.startswith(
            "hidden  evil_pkg-1.0-py3-none-any.whl: by advisory-malicious MAL-2024-3"), why.stdout


@pytest.mark.slow
def test_a_block_does_not_wait_for_an_unreachable_index(tmp_path: Path, evil_index: TestIndex) -> None:
    with _gateway(tmp_path, evil_index) as gw, edge_for(tmp_path, gw) as edge:
        assert len(_edge_offers(edge.url, "evil-pkg")) == 2
        evil_index.__exit__(None, None, None)  # the index is gone from now on
        record = write(tmp_path / "MAL-2024-5.json", mal(ident="MAL-2024-5", name="evil-pkg", versions=("1.0",)))
        assert tufproxy("gateway", "advisories", "import", str(gw.directory), str(record)).returncode == 0
        wait_for(lambda: _edge_offers(edge.url, "evil-pkg") == {"evil_pkg-2.0-py3-none-any.whl"},
                 "the block taken from the signed page", timeout=LIMIT)


class Feed:
    """An OSV zip over HTTP on 127.0.0.1 with an ETag, answering conditional GETs with 304."""

    def __init__(self) -> None:
        self.body, self.etag, self.answers = b"", '"0"', []  # answers: the status of each GET
        feed = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.headers.get("If-None-Match") == feed.etag:
                    feed.answers.append(304)
                    self.send_response(304)
                    self.send_header("ETag", feed.etag)
                    self.end_headers()
                    return
                feed.answers.append(200)
                self.send_response(200)
                self.send_header("ETag", feed.etag)
                self.send_header("Content-Length", str(len(feed.body)))
                self.end_headers()
                self.wfile.write(feed.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/PyPI/all.zip"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, *records: dict) -> None:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for record in records:
                zf.writestr(f"{record['id']}.json", json.dumps(record))
        self.body, self.etag = buf.getvalue(), f'"{hashlib.sha256(buf.getvalue()).hexdigest()[:16]}"'


@pytest.mark.slow
def test_a_feed_that_changes_between_refreshes(tmp_path: Path, evil_index: TestIndex) -> None:
    feed = Feed()
    feed.publish(mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",)))
    try:
        with _gateway(tmp_path, evil_index, "--advisories-url", feed.url, "--advisories-refresh", "0.5") as gw, \
                edge_for(tmp_path, gw) as edge:
            wait_for(lambda: _edge_offers(edge.url, "evil-pkg") == {"evil_pkg-1.0-py3-none-any.whl"}, "the feed's block", timeout=LIMIT)
            wait_for(lambda: 304 in feed.answers, "a conditional GET answered 304", timeout=LIMIT)
            feed.publish(mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",), modified="2024-09-01T00:00:00Z",
                             withdrawn="2024-09-01T00:00:00Z"))
            wait_for(lambda: len(_edge_offers(edge.url, "evil-pkg")) == 2, "the withdrawn record lifting the block", timeout=LIMIT)
            assert feed.answers.count(200) == 2  # the unchanged feed was never downloaded again
            # Every answer (304 included) moves the feed-freshness gauge that the stale-feed alert reads.
            answered = metric(gw.base, "tufproxy_gateway_advisory_feeds_answered_timestamp_seconds")
            assert time.time() - 60 < answered <= time.time()
            feed.server.shutdown()  # the feed goes away (connections refused): the gauge stops moving
            feed.server.server_close()
            failures = lambda: gw.log().count("keeping what was imported before")  # noqa: E731
            wait_for(lambda: failures() >= 1, "a failed feed check", timeout=LIMIT)
            stale, seen = metric(gw.base, "tufproxy_gateway_advisory_feeds_answered_timestamp_seconds"), failures()
            wait_for(lambda: failures() > seen, "another failed feed check", timeout=LIMIT)
            assert metric(gw.base, "tufproxy_gateway_advisory_feeds_answered_timestamp_seconds") == stale
        listing = json.loads(tufproxy("gateway", "advisories", str(tmp_path / "gw"), "--json").stdout)
        assert listing["counts"]["withdrawn"] == 1 and feed.url in listing["sources"]
    finally:
        feed.server.shutdown()


@pytest.mark.slow
def test_who_got_a_blocked_file_across_two_edges(tmp_path: Path, evil_index: TestIndex) -> None:
    bad = "evil_pkg-2.0-py3-none-any.whl"
    logs = [tmp_path / "edge-a.audit", tmp_path / "edge-b.audit"]
    with _gateway(tmp_path, evil_index) as gw:
        edges = [ProxyProcess(tmp_path / name, "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                              "--workers", "1", "--refresh-interval", "0.5", "--audit-log", str(log), "--audit-accepted", "yes")
                 for name, log in zip(("edge-a", "edge-b"), logs, strict=True)]
        for i, edge in enumerate(edges):
            with edge:
                r = install("pip", edge.url, tmp_path / f"t{i}", "evil-pkg")
                assert r.returncode == 0 and _installed(tmp_path / f"t{i}", "evil-pkg") == "2.0", r.stdout + r.stderr
        record = write(tmp_path / "MAL-2024-9.json", mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",),
                                                         aliases=["GHSA-evil-evil-evil"]))
        assert tufproxy("gateway", "advisories", "import", str(gw.directory), str(record)).returncode == 0
        wait_for(lambda: any(a.get("advisory") == "MAL-2024-9" for a in gw.audit()), "the gateway's block record", timeout=LIMIT)
    every = [*map(str, logs), str(gw.audit_path)]
    for query in (("--advisory", "MAL-2024-9"), ("--advisory", "GHSA-evil-evil-evil"), ("--file", bad),
                  ("--project", "Evil.Pkg==2.0.0")):
        r = tufproxy("audit", "who-got", *query, *every, "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert sorted(g["edge"] for g in got) == sorted(map(str, logs)), query
        assert {g["file"] for g in got} == {bad} and {g["client"] for g in got} == {"127.0.0.1"}
    assert json.loads(tufproxy("audit", "who-got", "--project", "evil-pkg==1.0", *every, "--json").stdout) == []
    assert json.loads(tufproxy("audit", "who-got", "--file", bad, "--since", "2999-01-01T00:00:00Z", *every, "--json").stdout) == []
    text = tufproxy("audit", "who-got", "--file", bad, *every).stdout
    assert text.startswith("2 download(s) by 1 client(s)")
    r = tufproxy("audit", "who-got", "--file", bad, "--project", "x==1", *every)
    assert r.returncode == 2 and "exactly one" in r.stderr
    assert tufproxy("audit", str(logs[0])).returncode == 0  # the summary still works


@pytest.mark.slow
def test_the_advisory_set_crosses_the_air_gap_and_verify_reports_what_it_blocks(tmp_path: Path, evil_index: TestIndex) -> None:
    gateway_init(tmp_path / "gw")
    write(tmp_path / "recs" / "MAL-2024-9.json", mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",)))
    write(tmp_path / "recs" / "PYSEC-2024-7.json", pysec(events=({"introduced": "0"}, {"fixed": "2.0"})))
    assert tufproxy("gateway", "advisories", "import", str(tmp_path / "gw"), str(tmp_path / "recs")).returncode == 0
    dest = tmp_path / "usb"
    with _gateway(tmp_path, evil_index) as gw:  # default policy: malicious blocked, vulnerable kept
        r = tufproxy("mirror", "sync", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                     "--dest", str(dest), "--project", "evil-pkg", "--project", "requests-like")
        assert r.returncode == 0, r.stdout + r.stderr
    carried = dest / "simple" / "advisories.osv.json"
    assert json.loads(carried.read_bytes())["records"][0]["id"] == "MAL-2024-9"
    assert not list(dest.rglob("evil_pkg-2.0*"))  # blocked at the gateway: never carried
    r = tufproxy("mirror", "verify", str(dest), "--root", str(gw.root), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [(b["advisory"], b["file"]) for b in report["blocked"]] == [("PYSEC-2024-7", "requests_like-1.0-py3-none-any.whl")]
    # The carried set is verified like any target: an edit is corrupt, not believed.
    carried.write_bytes(carried.read_bytes().replace(b"MAL-2024-9", b"MAL-2024-8"))
    report = json.loads(tufproxy("mirror", "verify", str(dest), "--root", str(gw.root), "--json").stdout)
    assert not report["sound"] and report["blocked"] == []


@pytest.mark.slow
def test_a_corrupt_store_is_one_line_and_loses_nothing(tmp_path: Path) -> None:
    gateway_init(tmp_path / "gw")
    store = tmp_path / "gw" / "gateway" / "advisories.json"
    store.write_text("{broken")
    write(tmp_path / "MAL-2024-1.json", mal())
    for argv in (("import", str(tmp_path / "gw"), str(tmp_path / "MAL-2024-1.json")), (str(tmp_path / "gw"),)):
        r = tufproxy("gateway", "advisories", *argv)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "advisories.json" in r.stderr, r.stderr
    assert store.read_text() == "{broken"


@pytest.mark.slow
def test_an_import_blocks_under_workers_too(tmp_path: Path, evil_index: TestIndex) -> None:
    """Every worker reloads the store; the worker that leads republishes."""
    bad = "evil_pkg-2.0-py3-none-any.whl"
    with _gateway(tmp_path, evil_index, "--workers", "2") as gw, edge_for(tmp_path, gw) as edge:
        assert bad in _edge_offers(edge.url, "evil-pkg")
        record = write(tmp_path / "MAL-2024-9.json", mal(ident="MAL-2024-9", name="evil-pkg", versions=("2.0",)))
        assert tufproxy("gateway", "advisories", "import", str(gw.directory), str(record)).returncode == 0
        wait_for(lambda: bad not in _edge_offers(edge.url, "evil-pkg"), "the edge dropping the blocked file", timeout=LIMIT)
