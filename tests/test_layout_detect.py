"""No layout flag: the edge, ``mirror sync`` and ``tufproxy client`` read the layout (tufproxy, gateway,
warehouse) from the signed metadata they verify, and a ``--profile`` the metadata contradicts is one line.

Real ``tufproxy serve``/``gateway serve``/``client`` subprocesses on 127.0.0.1, real pip.
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

from proxy.mirror.manifest import Manifest
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import SampleRepo
from tests.support.clients import install
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex
from tests.support.upstream import Upstream
from tests.test_cli_errors import ERROR_LINE, tufproxy


def _installed(target: Path) -> set[str]:
    return {d.name.split("-")[0] for d in target.glob("*.dist-info")}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tufproxy", "warehouse"], indirect=True)
def test_the_edge_detects_a_signed_repositorys_layout(layout: str, sample_repo: SampleRepo, upstream: Upstream,
                                                      tmp_path: Path) -> None:
    root = sample_repo.repo.metadata_dir / "1.root.json"
    # Two workers: the supervisor's line says the layout its workers detected.
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--workers", "2") as edge:
        line = wait_for(lambda: next((x for x in edge.log().splitlines() if "serving on" in x), None),
                        what="the start-up line")
        assert f"layout {layout} (detected from the signed metadata)" in str(line), edge.log()
        r = install("pip", edge.url, tmp_path / "t", "app")
        assert r.returncode == 0, r.stderr + edge.log()
    assert _installed(tmp_path / "t") == {"app", "lib", "base"}


@pytest.mark.slow
@pytest.mark.parametrize("layout,insisted", [("tufproxy", "warehouse"), ("warehouse", "tufproxy")], indirect=["layout"])
def test_a_profile_the_metadata_contradicts_is_one_line_naming_both(layout: str, insisted: str,
                                                                    sample_repo: SampleRepo, upstream: Upstream,
                                                                    tmp_path: Path) -> None:
    root = sample_repo.repo.metadata_dir / "1.root.json"
    done = tufproxy(["serve", "--upstream", upstream.url, "--root", str(root), "--profile", insisted, "--workers", "1",
                     "--cache-dir", str(tmp_path / "c"), "--listen", "127.0.0.1:0"], tmp_path)
    assert done.returncode == 2, done.stderr
    error = done.stderr.splitlines()[-1]
    assert ERROR_LINE.fullmatch(error), done.stderr
    assert f"--profile {insisted} contradicts the signed metadata, whose targets delegations are the {layout} " \
           f"layout's: drop --profile or give --profile {layout}" in error


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    dists = tmp_path / "dists"
    with TestIndex() as index:
        index.add(build_wheel(dists, "app", "1.0", requires=["lib"]))
        index.add(build_wheel(dists, "lib", "1.0"))
        gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--batch-window", "0.05") as gw:
            yield gw


@pytest.mark.slow
def test_an_edge_and_a_mirror_find_a_gateway_without_a_flag(gateway: GatewayProcess, tmp_path: Path) -> None:
    with ProxyProcess(tmp_path / "edge", "--upstream", gateway.base, "--root", str(gateway.root), "--workers",
                      "1") as edge:
        # Nothing published yet: only the gateway layout's miss protocol gets pip its pages.
        r = install("pip", edge.url, tmp_path / "t", "app")
        assert r.returncode == 0, r.stderr + edge.log()
        assert "layout gateway (detected from the signed metadata)" in edge.log()
    assert _installed(tmp_path / "t") == {"app", "lib"}
    done = tufproxy(["mirror", "sync", "--upstream", gateway.base, "--root", str(gateway.root), "--dest",
                     str(tmp_path / "m"), "--project", "app"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "layout gateway (detected from the signed metadata)" in done.stderr + done.stdout
    manifest = Manifest(tmp_path / "m/.mirror")
    head = manifest.head()
    assert head is not None and head.profile == "gateway"
    assert "packages/app/app-1.0-py3-none-any.whl" in manifest.paths_of(["app"])
    # A gateway's delegations say files are not targets: insisting on the tufproxy layout is refused.
    done = tufproxy(["serve", "--upstream", gateway.base, "--root", str(gateway.root), "--profile", "tufproxy",
                     "--workers", "1", "--cache-dir", str(tmp_path / "c"), "--listen", "127.0.0.1:0"], tmp_path)
    assert done.returncode == 2 and "--profile tufproxy contradicts the signed metadata, whose targets " \
        "delegations are the gateway layout's" in done.stderr, done.stderr


@pytest.mark.slow
def test_the_command_line_client_fetches_a_warehouse_target_under_its_served_name(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=4, layout="warehouse")
    repo.add([build_wheel(tmp_path / "dists", "lib", "1.0")])
    meta = tmp_path / "trusted"
    base = [sys.executable, "-m", "proxy", "client", "--metadata-dir", str(meta)]
    assert subprocess.run([*base, "init", str(repo.metadata_dir / "1.root.json")], timeout=60).returncode == 0
    with Upstream(repo.public_dir) as up:
        done = subprocess.run([*base, "--metadata-url", f"{up.url}tuf-metadata/", "--target-base-url", up.url,
                               "--target-dir", str(tmp_path / "got"), "--target-name", "lib", "download"],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"lib-1.0-py3-none-any.whl" in (tmp_path / "got/lib").read_bytes()


@pytest.mark.slow
def test_an_edge_started_before_its_gateway_says_the_assumed_layout_was_wrong(tmp_path: Path) -> None:
    with TestIndex() as index:
        index.add(build_wheel(tmp_path / "dists", "app", "1.0"))
        gateway_init(tmp_path / "gw")
        gw = GatewayProcess(tmp_path / "gw", "--index-url", index.url)
        # The gateway is not listening yet: nothing verifies, the edge assumes the tufproxy layout.
        with ProxyProcess(tmp_path / "edge", "--upstream", gw.base, "--root", str(gw.root), "--workers", "1",
                          "--refresh-interval", "0.5") as edge:
            assert "layout tufproxy (assumed until the metadata verifies" in wait_for(edge.log, what="a log")
            with gw:
                problem = "the signed metadata has the gateway layout, not the tufproxy layout assumed at start-up"
                wait_for(lambda: problem in edge.log(), what="the edge's error line")
                with pytest.raises(urllib.error.HTTPError) as ready:
                    urllib.request.urlopen(f"{edge.base}readyz", timeout=10)
                assert ready.value.code == 503 and problem in ready.value.read().decode()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["warehouse"], indirect=True)
def test_a_restarted_edge_finds_its_metadata_where_it_is_not_where_it_trusted_before(
        layout: str, sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    root = str(sample_repo.repo.metadata_dir / "1.root.json")
    for _ in range(2):  # the second start has trusted metadata from the first, and metadata/ still answers 404
        with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", root, "--workers", "1") as edge:
            wait_for(lambda: _ready(edge.base), what="ready: a refresh reached the upstream's tuf-metadata/",
                     timeout=15)
            assert "layout warehouse (detected from the signed metadata)" in edge.log()


def _ready(base: str) -> bool:
    try:
        return urllib.request.urlopen(f"{base}readyz", timeout=10).status == 200
    except urllib.error.HTTPError:
        return False
