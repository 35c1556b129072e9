"""``tufproxy mirror sync --profile gateway``: an air-gapped mirror fed by a gateway, then served offline.

Real parts: a test index (aiohttp) serving wheels and sdists built here, a
``tufproxy gateway`` subprocess in front of it that has published nothing,
the sync and ``mirror verify`` run as users run them (the CLI), and pip and
uv installing through ``tufproxy serve`` over the synced tree once the
gateway and the index are gone.  One gateway serves the whole module (its
first test syncs a chain it has never seen); the offline test stops it and
comes last.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.mirror.manifest import Manifest
from proxy.mirror.tree import STATE_DIR
from proxy.repository import Repository
from proxy.repository.sample import build_sdist, build_wheel
from tests.support.clients import install, uv_path
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.net import free_port
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex

CLIENTS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(uv_path() is None, reason="uv not installed"))]


@dataclass
class Setup:
    index: TestIndex
    gateway: GatewayProcess
    dest: Path  # synced once by the fixture
    site: Path  # the site repository the first sync re-signed into
    code: int  # that sync's exit status
    out: str
    published_before: float
    work: Path


def sync(gw: GatewayProcess, dest: Path, *args: str) -> int:
    return main(["mirror", "sync", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                 "--dest", str(dest), *args])


def verify(tree: Path, root: Path, *args: str) -> int:
    return main(["mirror", "verify", str(tree), "--root", str(root), *args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("mirror-gateway")
    dists = work / "dists"
    index = TestIndex(separate_files_host=True)
    for path in (build_wheel(dists, "app", "1.0", requires=["lib>=1.0"]), build_wheel(dists, "lib", "0.9"),
                 build_wheel(dists, "lib", "1.0", requires=["base"]), build_wheel(dists, "base", "2.0"),
                 build_sdist(dists, "base", "2.0"), build_wheel(dists, "evil", "1.0"),
                 build_wheel(dists, "broken", "1.0"), build_wheel(dists, "swapped", "1.0")):
        index.add(path)
    # A page the gateway refuses (an API version it does not speak): it answers the miss protocol with a 502.
    index.raw_pages["broken"] = b'<html><head><meta name="pypi:repository-version" content="9.0"></head><body></body></html>'
    # Requirements as sites keep them: one file including another, with version filters.
    (work / "base.txt").write_text("lib>=1.0  # 0.9 stays out\nbase==2.0\n")
    (work / "requirements.txt").write_text("-r base.txt\napp\n")
    gateway_init(work / "gw")
    with index, GatewayProcess(work / "gw", "--index-url", index.url, "--files-origin", index.files_url,
                               "--deny-project", "evil", "--batch-window", "0.1") as gw:
        published = metric(gw.base, "tufproxy_gateway_published_projects_total")
        dest, site = work / "mirror", work / "site"
        Repository.init(site, bins=16)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = sync(gw, dest, "--requirements", str(work / "requirements.txt"), "--resign-with", str(site))
        yield Setup(index, gw, dest, site, code, out.getvalue(), published, work)


def served(dest: Path) -> set[str]:
    return {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and STATE_DIR not in p.parts}


@pytest.mark.slow
def test_sync_publishes_a_chain_the_gateway_never_saw_and_verifies(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    assert setup.code == 0, setup.out
    assert setup.published_before == 0
    # The sync's own miss protocol published the three projects: nobody else asked the gateway.
    assert metric(setup.gateway.base, "tufproxy_gateway_published_projects_total") == 3
    assert "synced 3 project(s)" in setup.out
    files = served(setup.dest)
    for name in ("app-1.0-py3-none-any.whl", "lib-1.0-py3-none-any.whl", "base-2.0-py3-none-any.whl", "base-2.0.tar.gz",
                 "base-2.0-py3-none-any.whl.metadata"):
        project = name.split("-")[0]
        assert f"packages/{project}/{name}" in files, name
        # Byte for byte what the index served (and the gateway pinned).
        assert (setup.dest / f"packages/{project}/{name}").read_bytes() == (
            setup.index.file(name.removesuffix(".metadata")).core if name.endswith(".metadata")
            else setup.index.file(name).data)
    assert not any("lib-0.9" in n for n in files)  # the requirements' version filter
    manifest = Manifest(setup.dest / STATE_DIR)
    head = manifest.head()
    assert head is not None and head.profile == "gateway"
    assert "packages/lib/lib-1.0-py3-none-any.whl" in manifest.paths_of(manifest.projects())
    capsys.readouterr()
    assert verify(setup.dest, setup.gateway.root) == 0
    # 3 JSON pages (no root list is signed, no HTML page) and 7 files, each under 2 names (sha256 and plain).
    assert "sound: 10 target(s) checked (20 file(s) on disk), 0 missing, 0 corrupt, 0 extra" in capsys.readouterr().out
    # Re-signed (issue 16's rules: only bytes this run verified) into the site's own repository, which verifies too.
    site_public = Repository.open(setup.site).public_dir
    assert verify(site_public, site_public / "metadata/1.root.json") == 0
    assert (site_public / "packages/app/app-1.0-py3-none-any.whl").exists()


def test_a_byte_flipped_in_the_tree_fails_verify(setup: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "carried"
    shutil.copytree(setup.dest, copy)  # hard links become separate files: flip the plain name only
    wheel = copy / "packages/base/base-2.0-py3-none-any.whl"
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    wheel.write_bytes(bytes(data))
    capsys.readouterr()
    assert verify(copy, setup.gateway.root) == 1
    out = capsys.readouterr().out
    assert "corrupt packages/base/base-2.0-py3-none-any.whl: sha256" in out and "NOT SOUND" in out
    # A page altered in the tree: the files it vouches for cannot be checked either.
    page = next((copy / "simple/lib").glob("*.index.json"))
    page.write_bytes(page.read_bytes().replace(b"lib", b"LIB", 1))
    assert verify(copy, setup.gateway.root) == 1
    assert f"corrupt simple/lib/{page.name}" in capsys.readouterr().out


def test_an_edit_in_dest_between_syncs_is_refused_and_never_resigned(setup: Setup, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "mirror"
    site = Repository.init(tmp_path / "site", bins=16)
    assert sync(setup.gateway, dest, "--project", "base") == 0
    wheel = dest / "packages/base/base-2.0-py3-none-any.whl"
    size = wheel.stat().st_size
    with open(wheel, "r+b") as f:  # same size, same inode: every name of it sees the edit
        f.seek(size // 2)
        f.write(b"#EVIL#")
    capsys.readouterr()
    assert sync(setup.gateway, dest, "--project", "base", "--resign-with", str(tmp_path / "site")) == 1
    assert "REFUSED packages/base/base-2.0-py3-none-any.whl: hash-mismatch: the copy in" in capsys.readouterr().err
    assert not (site.public_dir / "packages/base/base-2.0-py3-none-any.whl").exists()
    assert not any(b"#EVIL#" in p.read_bytes() for p in site.public_dir.rglob("*") if p.is_file())
    # The next sync fetches it afresh (verified against the signed page) and signs that.
    assert sync(setup.gateway, dest, "--project", "base", "--resign-with", str(tmp_path / "site")) == 0
    assert b"#EVIL#" not in (site.public_dir / "packages/base/base-2.0-py3-none-any.whl").read_bytes()
    assert verify(dest, setup.gateway.root) == 0


def test_projects_the_gateway_refuses_are_per_project_errors(setup: Setup, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "mirror"
    args = ("--project", "evil", "--project", "no-such-project", "--project", "base")
    capsys.readouterr()
    assert sync(setup.gateway, dest, *args) == 1
    err = capsys.readouterr().err
    assert "not found upstream: evil (gateway: evil: denied by policy (deny-project 'evil'))" in err
    assert "not found upstream: no-such-project" in err
    assert sync(setup.gateway, dest, *args, "--keep-going") == 0
    assert (dest / "packages/base/base-2.0-py3-none-any.whl").exists()
    assert not (dest / "packages/evil").exists()
    # The index's answer refused by the gateway (it answers 502): a failure of that project alone.
    capsys.readouterr()
    assert sync(setup.gateway, dest, "--project", "broken", "--project", "base", "--keep-going") == 1
    out = capsys.readouterr()
    assert "failed broken: the gateway did not publish it: bad-page: " in out.err  # the gateway's own reason
    assert "published upstream snapshot" in out.out  # --keep-going: the rest is published
    assert verify(dest, setup.gateway.root) == 0


def test_a_file_the_index_changed_after_pinning_is_not_synced(setup: Setup, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    gw = setup.gateway
    assert gw.publish("swapped")[0] == 200  # pinned: the signed page names the index's first bytes
    entry = setup.index.file("swapped-1.0-py3-none-any.whl")
    original = entry.data
    entry.data = original[:-1] + bytes([original[-1] ^ 1])  # same name and size, other bytes
    dest = tmp_path / "mirror"
    capsys.readouterr()
    assert sync(gw, dest, "--project", "swapped") == 1
    assert "failed packages/swapped/swapped-1.0-py3-none-any.whl" in capsys.readouterr().err
    assert not any(n.endswith("swapped-1.0-py3-none-any.whl") for n in served(dest))
    assert not (dest / "metadata/timestamp.json").exists()  # an incomplete sync publishes nothing
    wait_for(lambda: any(a.get("reason") == "hash-mismatch" for a in gw.audit()), what="the gateway's audit record")
    # The index serves the pinned bytes again: the same sync completes with exactly them.
    entry.data = original
    assert sync(gw, dest, "--project", "swapped") == 0
    assert (dest / "packages/swapped/swapped-1.0-py3-none-any.whl").read_bytes() == original


def test_every_upstream_is_tried_in_order(setup: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group's gateways, the first of them down: the sync reads, publishes and fetches through the next."""
    gw = setup.gateway
    down = f"http://127.0.0.1:{free_port()}/"
    dest = tmp_path / "mirror"
    assert main(["mirror", "sync", "--upstream", down, "--upstream", gw.base, "--root", str(gw.root), "--dest",
                 str(dest), "--project", "app", "--resolve", "yes"]) == 0, capsys.readouterr()
    assert {"packages/app/app-1.0-py3-none-any.whl", "packages/lib/lib-1.0-py3-none-any.whl",
            "packages/base/base-2.0-py3-none-any.whl"} <= served(dest)
    assert verify(dest, gw.root) == 0
    # A directory is a whole upstream: it does not repeat.
    assert main(["mirror", "sync", "--upstream", str(dest), "--upstream", gw.base, "--root", str(gw.root), "--dest",
                 str(tmp_path / "other"), "--project", "app"]) == 2
    assert "--upstream repeats only with URLs" in capsys.readouterr().err


@pytest.mark.parametrize("client", CLIENTS)
def test_serve_over_the_mirror_installs_offline(setup: Setup, tmp_path: Path, client: str) -> None:
    """Last in this module: the gateway and the index stop for good here.

    No --profile: serve takes the one the sync recorded in DEST.
    """
    setup.gateway.stop()
    setup.index.__exit__(None, None, None)
    with ProxyProcess(tmp_path / "cache", "--repository", str(setup.dest), "--root", str(setup.gateway.root)) as proxy:
        r = install(client, proxy.url, tmp_path / "target", "app")
        assert r.returncode == 0, r.stdout + r.stderr + proxy.log()
    assert {d.name for d in (tmp_path / "target").glob("*.dist-info")} == {
        "app-1.0.dist-info", "lib-1.0.dist-info", "base-2.0.dist-info"}
