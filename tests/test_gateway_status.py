"""PEP 792 project status markers: read from the index, passed through signed pages to edges, quarantine unpublishes.

The chain is a test index (JSON and HTML pages with markers) -> ``tufproxy gateway serve``
-> an edge -> current pip and uv.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.protocol import index
from proxy.repository.sample import build_wheel
from tests.support.clients import install, uv_path
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

CLIENTS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(uv_path() is None, reason="uv not installed"))]


def test_markers_parse_and_render_in_json_and_html() -> None:
    page = index.ProjectPage("old", files=()).with_status("archived", "no longer maintained")
    assert page.api_version == "1.4"
    for render, parse in ((index.render_project_json, index.parse_project_json),
                          (index.render_project_html, index.parse_project_html)):
        back = parse(render(page), "old")
        assert (back.status, back.status_reason, back.api_version) == ("archived", "no longer maintained", "1.4")
    assert json.loads(index.render_project_json(page))["project-status"] == {"status": "archived", "reason": "no longer maintained"}
    html = index.render_project_html(page).decode()
    assert '<meta name="pypi:project-status" content="archived">' in html
    assert '<meta name="pypi:project-status-reason" content="no longer maintained">' in html
    plain = index.ProjectPage("new", files=())
    assert plain.with_status(None, "ignored") == plain and "project-status" not in index.render_project_json(plain).decode()
    assert index.ProjectPage("x", files=(), api_version="1.5").with_status("deprecated", None).api_version == "1.5"
    with pytest.raises(index.IndexParseError):
        index.parse_project_json(b'{"meta":{"api-version":"1.4"},"name":"x","files":[],"project-status":{"status":7}}', "x")


@pytest.fixture
def status_index(tmp_path: Path) -> Iterator[TestIndex]:
    idx = TestIndex(separate_files_host=True)
    for project in ("old-lib", "dep-lib", "bad-lib"):
        idx.add(build_wheel(tmp_path / "dists", project, "1.0"))
    idx.status["old-lib"] = ("archived", "no longer maintained")
    idx.status["dep-lib"] = ("deprecated", None)
    idx.status["bad-lib"] = ("quarantined", "malware reported")
    with idx:
        yield idx


def _edge_page(edge_url: str, project: str, accept: str) -> bytes:
    req = urllib.request.Request(f"{edge_url}{project}/", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_archived_and_deprecated_pass_through_and_quarantined_is_never_published(tmp_path: Path, status_index: TestIndex,
                                                                                client: str) -> None:
    gateway_init(tmp_path / "gw")
    with GatewayProcess(tmp_path / "gw", "--index-url", status_index.url, "--files-origin", status_index.files_url,
                        "--batch-window", "0.1", "--page-ttl", "1") as gw, edge_for(tmp_path, gw) as edge:
        r = install(client, edge.url, tmp_path / "t", "old-lib", "dep-lib")
        assert r.returncode == 0, r.stdout + r.stderr
        page = json.loads(_edge_page(edge.url, "old-lib", "application/vnd.pypi.simple.v1+json"))
        assert page["meta"]["api-version"] == "1.4"
        assert page["project-status"] == {"status": "archived", "reason": "no longer maintained"}
        html = _edge_page(edge.url, "dep-lib", "text/html").decode()
        assert '<meta name="pypi:project-status" content="deprecated">' in html and 'content="1.4"' in html
        r = install(client, edge.url, tmp_path / "t2", "bad-lib")
        assert r.returncode != 0
        assert not (gw.directory / "public" / "simple" / "bad-lib").exists()
        quarantine = [a for a in gw.audit() if a.get("reason") == "project-quarantined"]
        assert quarantine and "malware reported" in quarantine[0]["detail"] and quarantine[0]["target"] == "simple/bad-lib/"
        # Quarantined after it was published: unpublished at its next refresh.
        status_index.status["old-lib"] = ("quarantined", None)

        def gone() -> bool:
            try:
                _edge_page(edge.url, "old-lib", "application/vnd.pypi.simple.v1+json")
            except urllib.error.HTTPError as e:
                return e.code == 404
            return False

        wait_for(gone, "the quarantined project leaving the edge", timeout=30)
