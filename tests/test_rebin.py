"""Bins sized for the job (issue 37 part 5): PEP 458's rule at init, and growing the bin count of a
repository in service (``repo rebin`` / ``gateway rebin``) under clients that trust the old metadata.

The reference client is python-tuf's own ngclient; the end-to-end test runs a real gateway, a real edge
that cached the old metadata, and real pip.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata, SuccinctRoles

from proxy.cli.gateway import DEFAULT_BINS
from proxy.protocol.bins import bins_for_targets
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.support.clients import http_status, install
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex
from tests.support.tree import all_targets
from tests.support.tufclient import reference_updater
from tests.support.upstream import Upstream


def tufproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=120)


def test_the_rule_gives_pep_458s_plan_and_doubles_at_four_times_the_targets() -> None:
    assert bins_for_targets(2_273_481) == 16384  # PEP 458's plan for the public index
    assert bins_for_targets(4 * 2_273_481) == 32768  # "SHOULD double when ... targets increase 4x"
    assert bins_for_targets(2 * 100_000) == 4096  # a 100,000-project gateway: two signed pages a project
    assert bins_for_targets(0) == 2 and bins_for_targets(10**12) == 65536


def test_the_default_is_the_rules_count_for_a_thousand_projects_and_grows_without_leftover_names() -> None:
    # docs/concepts/gateway-design.md, "512 bins": two signed pages a project.
    assert DEFAULT_BINS == bins_for_targets(2 * 1000) == bins_for_targets(2 * 2200) == 512
    # A rebin to the rule's count for 100,000 projects keeps every name: nothing is left listed in the snapshot.
    names = {bins: set(SuccinctRoles([], 1, bins.bit_length() - 1, "bin").get_roles()) for bins in (512, 4096, 8192)}
    assert names[512] < names[4096] and bins_for_targets(2 * 100_000) == 4096
    assert not names[4096] & names[8192]  # one more digit: the old names stay (what the docs warn of)


@pytest.mark.slow
@pytest.mark.parametrize("args, error", [
    (("gateway", "init", "{d}", "--bins", "1000"), "--bins must be a power of two between 2 and 65536, not 1000"),
    (("repo", "init", "{d}", "--expected-projects", "10"), "the tufproxy layout signs every file as a target"),
    (("gateway", "init", "{d}", "--expected-projects", "0"), "--expected-projects must be at least 1"),
])
def test_a_bad_bin_count_is_one_line_and_writes_nothing(tmp_path: Path, args: tuple[str, ...], error: str) -> None:
    r = tufproxy(*(a.format(d=tmp_path / "r") for a in args))
    assert r.returncode == 2 and error in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_expected_projects_picks_the_bins(tmp_path: Path) -> None:
    r = tufproxy("gateway", "init", str(tmp_path / "g"), "--expected-projects", "2000")  # a target each, its page
    assert r.returncode == 0 and "512 bins" in r.stdout, r.stdout + r.stderr
    assert json.loads((tmp_path / "g" / "repository.json").read_text())["bins"] == 512


@pytest.mark.slow
def test_rebin_moves_every_target_and_a_client_holding_the_old_metadata_follows(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=4)
    repo.add([build_wheel(tmp_path / "d", name, "1.0") for name in ("alpha", "beta", "gamma", "delta")])
    before = all_targets(repo)
    old_root = (repo.metadata_dir / "1.root.json").read_bytes()
    with Upstream(repo.public_dir) as up:
        client = reference_updater(tmp_path / "client", up.url, old_root)
        client.refresh()
        assert client.get_targetinfo("packages/alpha/alpha-1.0-py3-none-any.whl") is not None  # caches bins, bin-n
        old_snapshot = Metadata.from_bytes((tmp_path / "client/metadata/snapshot.json").read_bytes()).signed

        r = tufproxy("repo", "rebin", str(repo.path), "--bins", "32")
        assert r.returncode == 0 and "4 -> 32 bins" in r.stdout, r.stdout + r.stderr
        repo = Repository.open(repo.path)
        after = all_targets(repo)
        assert {p: (t["hashes"], t["length"]) for p, t in after.items()} == \
            {p: (t["hashes"], t["length"]) for p, t in before.items()}  # every target kept, none lost or added
        assert {t["bin"] for t in after.values()} <= {f"bin-{i:02x}" for i in range(32)}
        assert repo.status()["bins"]["count"] == 32

        client = reference_updater(tmp_path / "client", up.url, old_root)  # the same cached metadata
        client.refresh()
        for name in ("alpha", "beta", "gamma", "delta"):
            assert client.get_targetinfo(f"packages/{name}/{name}-1.0-py3-none-any.whl") is not None
        new_snapshot = Metadata.from_bytes((tmp_path / "client/metadata/snapshot.json").read_bytes()).signed
        # The old names (bin-0 ... bin-3) stay listed at their versions: a client refuses a snapshot dropping them.
        assert all(new_snapshot.meta[name].version >= meta.version for name, meta in old_snapshot.meta.items())

    r = tufproxy("repo", "rebin", str(repo.path), "--bins", "16")
    assert r.returncode == 2 and "only grows" in r.stderr


@pytest.mark.slow
def test_rebin_of_a_running_gateway_under_an_edge_that_cached_the_old_metadata(tmp_path: Path) -> None:
    directory = tmp_path / "gw"
    gateway_init(directory)  # 16 bins: bin-0 ... bin-f
    dists = tmp_path / "dists"
    with TestIndex() as index:
        for name in ("early", "late"):
            index.add(build_wheel(dists, name, "1.0"))
        gw = GatewayProcess(directory, "--index-url", index.url, "--batch-window", "0.05").start()
        edge = edge_for(tmp_path, gw)
        try:
            with edge:
                r = install("pip", edge.url, tmp_path / "t1", "early")
                assert r.returncode == 0, r.stdout + r.stderr
                r = tufproxy("gateway", "rebin", str(directory), "--bins", "64")  # names get longer: bin-00 ...
                assert r.returncode == 0, r.stderr
                bins_version = json.loads(r.stdout.split("bins v")[1].split(",")[0])
                trusted = tmp_path / "edge" / "metadata"
                wait_for(lambda: _listed(trusted / "snapshot.json", "bins.json") == bins_version,
                         "the edge trusting the snapshot of the re-bin", timeout=30)
                # An old project, and one the gateway publishes after the re-bin, both install through the edge.
                for project, target in (("early", "t2"), ("late", "t3")):
                    r = install("pip", edge.url, tmp_path / target, project)
                    assert r.returncode == 0, r.stdout + r.stderr
                assert _version(trusted / "bins.json") == bins_version  # it looked them up through the new bins
                assert "rollback" not in edge.log().lower() and "refus" not in edge.log().lower(), edge.log()
            # A new edge, pinned to the same first root, starts from the re-binned metadata.
            with edge_for(tmp_path, gw, "edge2") as fresh:
                assert http_status(f"{fresh.url}early/") == 200 and http_status(f"{fresh.url}late/") == 200
        finally:
            gw.stop()
    assert json.loads((directory / "repository.json").read_text())["bins"] == 64


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _version(path: Path) -> int:
    return Metadata.from_bytes(path.read_bytes()).signed.version


def _listed(snapshot: Path, name: str) -> int | None:
    try:
        return Metadata.from_bytes(snapshot.read_bytes()).signed.meta[name].version
    except Exception:  # being replaced: ask again
        return None


JSON = "application/vnd.pypi.simple.v1+json"


def _root_list(edge: ProxyProcess) -> list[str]:
    """The names an edge's /simple/ lists (JSON), in its order, repeats kept."""
    request = urllib.request.Request(edge.url, headers={"Accept": JSON})
    with urllib.request.urlopen(request, timeout=30) as r:
        return [p["name"] for p in json.loads(r.read())["projects"]]


def _lists(edge: ProxyProcess, projects: set[str], what: str) -> None:
    """Wait until ``edge`` lists exactly ``projects`` at /simple/: each once, nothing else."""
    wait_for(lambda: _root_list(edge), what, timeout=30, done=lambda got: sorted(got) == sorted(projects))


@pytest.mark.slow
def test_rebins_under_live_edges_keep_their_root_list_exact_and_a_revoke_leaves_it(tmp_path: Path) -> None:
    """An edge lists /simple/ from the bins it verified (the gateway signs no root list): through two
    re-bins of the running gateway (16 -> 64 bins renames every bin; 64 -> 128 keeps the names bin-00 ...
    bin-3f with fewer targets each) an edge that listed the old bins, and one that starts after, list
    exactly the public projects, each once, never the private one; pages verify and install; a revoked
    project leaves the list."""
    directory = tmp_path / "gw"
    gateway_init(directory)  # 16 bins
    dists = tmp_path / "dists"
    public = {"early", "late", "doomed", *(f"spread{i}" for i in range(9))}
    secret = _basic("reader", "idx-pass-2291")
    # An index that needs credentials: what the gateway takes from it is private (marked in its target).
    with TestIndex(basic_auth=secret) as internal, TestIndex() as index:
        internal.add(build_wheel(dists, "secretpkg", "1.0"))
        for name in sorted(public):
            index.add(build_wheel(dists, name, "1.0"))
        gw = GatewayProcess(directory, "--index-url", internal.url.replace("http://", "http://reader:idx-pass-2291@"),
                            "--index-url", index.url, "--allow-anonymous-private", "yes", "--batch-window", "0.05",
                            "--prefetch-depth", "0")
        gw.start()
        edge = edge_for(tmp_path, gw)
        fresh = edge_for(tmp_path, gw, "edge2")
        try:
            for project in [*sorted(public - {"late"}), "secretpkg"]:
                assert gw.publish(project)[0] == 200, project
            edge.start()
            _lists(edge, public - {"late"}, "the edge lists the public projects before the re-bin")
            assert gw.listed() == public - {"late"}  # the gateway's own /simple/, from its catalog of its bins
            trusted = tmp_path / "edge" / "metadata"
            for bins in (64, 128):
                r = tufproxy("gateway", "rebin", str(directory), "--bins", str(bins))
                assert r.returncode == 0, r.stdout + r.stderr
                bins_version = json.loads(r.stdout.split("bins v")[1].split(",")[0])
                wait_for(lambda: _listed(trusted / "snapshot.json", "bins.json") == bins_version,  # noqa: B023
                         f"the edge trusting the snapshot of the re-bin to {bins}", timeout=30)
                signed = all_targets(Repository.open(directory))
                moved = {t["bin"] for p, t in signed.items() if p.startswith("simple/")}
                assert len(moved) > 1 and all(len(b) == len("bin-00") for b in moved), moved
                assert "simple/secretpkg/index.json" in signed  # published, and private: never listed
                _lists(edge, public - {"late"}, f"the edge lists the same projects after the re-bin to {bins} bins")
                # The gateway knows them too (what it refreshes, revokes and lists): its catalog followed the moves.
                assert gw.listed() == public - {"late"}, f"the gateway after the re-bin to {bins} bins"
            # A project published after the re-bins joins the list; every page verifies, one installs.
            assert gw.publish("late")[0] == 200
            _lists(edge, public, "the edge lists the project published after the re-bins")
            for project in sorted(public):
                assert http_status(f"{edge.url}{project}/") == 200, project
            r = install("pip", edge.url, tmp_path / "t", "early")
            assert r.returncode == 0, r.stdout + r.stderr
            with fresh:  # pinned to the first root, it starts from the re-binned metadata
                _lists(fresh, public, "an edge started after the re-bins lists the same projects")
                r = tufproxy("gateway", "revoke", str(directory), "doomed", "--reason", "test",
                             "--audit-log", str(tmp_path / "revoke.audit"))
                assert r.returncode == 0, r.stdout + r.stderr
                assert gw.listed() == public - {"doomed"}
                for e in (edge, fresh):
                    _lists(e, public - {"doomed"}, "the revoked project leaves the list")
                    assert http_status(f"{e.url}doomed/") == 404
                    assert http_status(f"{e.url}late/") == 200
            assert "rollback" not in edge.log().lower() and "refus" not in edge.log().lower(), edge.log()
        finally:
            edge.stop()
            gw.stop()
    assert json.loads((directory / "repository.json").read_text())["bins"] == 128
