"""proxy.protocol.index: parsing, rendering and negotiating Simple Repository API pages."""

from __future__ import annotations

import dataclasses
import html
import json
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol import index
from proxy.protocol.index import DistFile, IndexParseError, MediaType, ProjectList, ProjectPage

SHA_A = "813202ace4d9301a3c00740c700e012fb9f3f8c73ddcfe02ab558a8df6f175fd"
SHA_B = "70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6"
SHA_M = "fa1c9ee8b5d3b6c1bd04c46e1d41d8f5d2a4b9c8e8c7d1a1e3f7b2a9c0d4e5f6"
FILES = "https://files.index.example/packages"

# Shaped like the public index's page for requests (trimmed).
PYPI_HTML = f"""<!DOCTYPE html>
<html>
  <head>
    <meta name="pypi:repository-version" content="1.1">
    <title>Links for requests</title>
  </head>
  <body>
    <h1>Links for requests</h1>
    <a href="{FILES}/ab/cd/requests-0.2.0.tar.gz#sha256={SHA_A}" >requests-0.2.0.tar.gz</a><br />
    <a href="{FILES}/ef/01/requests-2.32.0-py3-none-any.whl#sha256={SHA_B}" data-requires-python="&gt;=3.8" data-dist-info-metadata="sha256={SHA_M}" data-core-metadata="sha256={SHA_M}" data-yanked="Yanked due to conflicts with CVE-2024-35195 mitigation">requests-2.32.0-py3-none-any.whl</a><br />
  </body>
</html>
<!--SERIAL 23908135-->
""".encode()

# Shaped like the same page under Accept: application/vnd.pypi.simple.v1+json.
PYPI_JSON = json.dumps(
    {
        "files": [
            {
                "core-metadata": False,
                "data-dist-info-metadata": False,
                "filename": "requests-0.2.0.tar.gz",
                "hashes": {"sha256": SHA_A},
                "requires-python": None,
                "size": 33224,
                "upload-time": "2011-02-14T20:43:19.574811Z",
                "url": f"{FILES}/ab/cd/requests-0.2.0.tar.gz",
                "yanked": False,
            },
            {
                "core-metadata": {"sha256": SHA_M},
                "data-dist-info-metadata": {"sha256": SHA_M},
                "filename": "requests-2.32.0-py3-none-any.whl",
                "hashes": {"sha256": SHA_B},
                "provenance": None,
                "requires-python": ">=3.8",
                "size": 63899,
                "upload-time": "2024-05-20T15:12:02.497064Z",
                "url": f"{FILES}/ef/01/requests-2.32.0-py3-none-any.whl",
                "yanked": "Yanked due to conflicts with CVE-2024-35195 mitigation",
            },
        ],
        "meta": {"_last-serial": 23908135, "api-version": "1.1"},
        "name": "requests",
        "versions": ["0.2.0", "2.32.0"],
    }
).encode()

EXPECTED_FILES = (
    DistFile(
        filename="requests-0.2.0.tar.gz",
        url=f"{FILES}/ab/cd/requests-0.2.0.tar.gz",
        hashes={"sha256": SHA_A},
        size=33224,
        upload_time="2011-02-14T20:43:19.574811Z",
    ),
    DistFile(
        filename="requests-2.32.0-py3-none-any.whl",
        url=f"{FILES}/ef/01/requests-2.32.0-py3-none-any.whl",
        hashes={"sha256": SHA_B},
        requires_python=">=3.8",
        yanked="Yanked due to conflicts with CVE-2024-35195 mitigation",
        core_metadata={"sha256": SHA_M},
        size=63899,
        upload_time="2024-05-20T15:12:02.497064Z",
    ),
)


def html_only(dist: DistFile) -> DistFile:
    """What survives an HTML rendering: PEP 700 fields are JSON-only."""
    return dataclasses.replace(dist, size=None, upload_time=None)


def page_html(*anchors: str, head: str = "") -> bytes:
    return f"<!DOCTYPE html><html><head>{head}</head><body>{''.join(anchors)}</body></html>".encode()


def page_json(files: list) -> bytes:
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": files}).encode()


def json_file(**fields: object) -> dict:
    return {"filename": "demo-1.0.tar.gz", "url": "demo-1.0.tar.gz", "hashes": {}, **fields}


# ---------------------------------------------------------------- PyPI-shaped samples


def test_parse_pypi_shaped_html() -> None:
    page = index.parse_project_html(PYPI_HTML, "Requests")
    assert page.name == "requests"
    assert page.api_version == "1.1"
    assert page.files == tuple(html_only(f) for f in EXPECTED_FILES)


def test_parse_pypi_shaped_json() -> None:
    page = index.parse_project_json(PYPI_JSON, "requests")
    assert page == ProjectPage(name="requests", files=EXPECTED_FILES, versions=("0.2.0", "2.32.0"), api_version="1.1")


def test_parse_pypi_shaped_root_pages() -> None:
    root_html = b"""<!DOCTYPE html>
<html><head><meta name="pypi:repository-version" content="1.1"><title>Simple index</title></head>
<body><a href="/simple/0/">0</a><a href="/simple/zope-interface/">zope.interface</a>
<a href="/simple/requests/">requests</a></body></html>"""
    root_json = json.dumps(
        {
            "meta": {"_last-serial": 5, "api-version": "1.1"},
            "projects": [{"_last-serial": 1, "name": "0"}, {"_last-serial": 2, "name": "zope.interface"}],
        }
    ).encode()
    assert index.parse_project_list_html(root_html).projects == ("0", "zope.interface", "requests")
    assert index.parse_project_list_json(root_json).projects == ("0", "zope.interface")


# ---------------------------------------------------------------- HTML details


def test_relative_hrefs_stay_relative_and_base_href_applies() -> None:
    relative = index.parse_project_html(page_html('<a href="../../packages/demo/demo-1.0.tar.gz">demo-1.0.tar.gz</a>'), "demo")
    assert relative.files[0].url == "../../packages/demo/demo-1.0.tar.gz"
    based = index.parse_project_html(
        page_html('<a href="x/demo-1.0.tar.gz">demo-1.0.tar.gz</a>', head='<base href="https://mirror.test/p/">'), "demo"
    )
    assert based.files[0].url == "https://mirror.test/p/x/demo-1.0.tar.gz"


def test_fragments_entities_and_missing_link_text() -> None:
    page = index.parse_project_html(
        page_html(
            f'<a href="/f/demo-1.0.tar.gz?a=1&amp;b=2#SHA256={SHA_A.upper()}" data-requires-python="&gt;=3.8,&lt;4">demo-1.0.tar.gz</a>',
            '<a href="/f/demo-1.1.tar.gz#egg=demo">demo-1.1.tar.gz</a>',
            '<a href="/f/demo%2B-1.2.tar.gz"></a>',
            "<a>no href</a>",
        ),
        "demo",
    )
    first, second, third = page.files
    assert first.url == "/f/demo-1.0.tar.gz?a=1&b=2"
    assert first.hashes == {"sha256": SHA_A}
    assert first.requires_python == ">=3.8,<4"
    assert second.url == "/f/demo-1.1.tar.gz" and second.hashes == {}
    assert third.filename == "demo+-1.2.tar.gz"


@pytest.mark.parametrize(
    ("attrs", "yanked"),
    [("", False), ('data-yanked=""', True), ("data-yanked", True), ('data-yanked="bad &amp; broken"', "bad & broken")],
)
def test_yanked_attribute(attrs: str, yanked: bool | str) -> None:
    page = index.parse_project_html(page_html(f'<a href="d.whl" {attrs}>d.whl</a>'), "demo")
    assert page.files[0].yanked == yanked


@pytest.mark.parametrize(
    ("attrs", "core"),
    [
        ("", False),
        ('data-core-metadata="true"', True),
        ('data-dist-info-metadata="true"', True),
        (f'data-dist-info-metadata="sha256={SHA_M}"', {"sha256": SHA_M}),
        # PEP 714: the new attribute wins over the legacy one.
        (f'data-core-metadata="sha256={SHA_M}" data-dist-info-metadata="true"', {"sha256": SHA_M}),
        ('data-core-metadata="false"', False),
        ('data-core-metadata="sha256=not-hex"', False),
    ],
)
def test_core_metadata_attributes(attrs: str, core: bool | dict) -> None:
    page = index.parse_project_html(page_html(f'<a href="d.whl" {attrs}>d.whl</a>'), "demo")
    assert page.files[0].core_metadata == core


@pytest.mark.parametrize("bad", ["../evil.whl", "a/b.whl", "a\\b.whl", "a\x00b.whl", "x..y.whl", " ", "a\x07.whl", "x" * 300])
def test_unusable_filenames_are_skipped(bad: str) -> None:
    # The href's last segment is empty, so no fallback name rescues the link.
    anchor = f'<a href="https://evil.test/x/">{bad}</a>'
    page = index.parse_project_html(page_html(anchor, '<a href="ok.whl">ok.whl</a>'), "demo")
    assert [f.filename for f in page.files] == ["ok.whl"]
    jpage = index.parse_project_json(page_json([json_file(filename=bad), json_file(filename="ok.whl")]), "demo")
    assert [f.filename for f in jpage.files] == ["ok.whl"]


def test_duplicate_filenames_keep_the_first() -> None:
    page = index.parse_project_html(page_html('<a href="one">d.whl</a>', '<a href="two">d.whl</a>'), "demo")
    assert [f.url for f in page.files] == ["one"]


def test_html_limits_and_encoding() -> None:
    many = page_html(*['<a href="d.whl">d.whl</a>'] * 11)
    with pytest.raises(IndexParseError, match="more than 10"):
        index.parse_project_html(many, "demo", max_files=10)
    assert len(index.parse_project_html(many, "demo", max_files=11).files) == 1
    with pytest.raises(IndexParseError, match="not UTF-8"):
        index.parse_project_html(b"<a href='x'>caf\xe9.whl</a>", "demo")
    assert index.parse_project_html(b"\xef\xbb\xbf" + page_html('<a href="d.whl">d.whl</a>'), "demo").files


@pytest.mark.parametrize(
    ("content", "ok"),
    [("1.0", True), ("1.4", True), ("2.0", False), ("one", False), ("", False), ("1.0\n", False), ("1.\u0661", False)],
)
def test_html_repository_version(content: str, ok: bool) -> None:
    data = page_html(head=f'<meta name="pypi:repository-version" content="{content}">')
    if ok:
        assert index.parse_project_html(data, "demo").api_version == content
    else:
        with pytest.raises(IndexParseError):
            index.parse_project_html(data, "demo")


def test_html_without_version_meta_is_1_0() -> None:
    assert index.parse_project_html(page_html(), "demo").api_version == "1.0"


# ---------------------------------------------------------------- JSON details


@pytest.mark.parametrize(
    "data",
    [
        b"[]",
        b'"page"',
        b"{}",
        b'{"meta": {"api-version": "2.0"}, "name": "demo", "files": []}',
        b'{"meta": {"api-version": 1.0}, "name": "demo", "files": []}',
        b'{"meta": {"api-version": "1.0"}, "name": "other", "files": []}',
        b'{"meta": {"api-version": "1.0"}, "name": "demo"}',
        b'{"meta": {"api-version": "1.0"}, "name": "demo", "files": {}}',
        b'{"meta": {"api-version": "1.0"}, "name": "demo", "files": ["not an object"]}',
        b'{"meta": {"api-version": "1.0"}, "name": "demo", "files": [], "versions": [1]}',
        b'{"meta": {"api-version": "1.0"}, "name": "demo", "files": [], "versions": [NaN]}',
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe{}",
    ],
)
def test_bad_json_pages_raise(data: bytes) -> None:
    with pytest.raises(IndexParseError):
        index.parse_project_json(data, "demo")


@pytest.mark.parametrize(
    "fields",
    [
        {"filename": 1},
        {"url": None},
        {"hashes": ["sha256"]},
        {"hashes": {"sha256": 5}},
        {"requires-python": 3},
        {"yanked": 1},
        {"core-metadata": "true"},
        {"size": True},
        {"size": -1},
        {"size": 1.5},
        {"upload-time": 0},
    ],
)
def test_wrong_types_in_json_file_entries_raise(fields: dict) -> None:
    with pytest.raises(IndexParseError):
        index.parse_project_json(page_json([json_file(**fields)]), "demo")


def test_json_name_normalised_and_legacy_metadata_keys() -> None:
    data = json.dumps(
        {
            "meta": {"api-version": "1.0"},
            "name": "Demo_Pkg",
            "files": [
                json_file(filename="a.whl", **{"dist-info-metadata": {"sha256": SHA_M}}),
                json_file(filename="b.whl", **{"data-dist-info-metadata": True}),
                json_file(filename="c.whl", **{"core-metadata": {}, "dist-info-metadata": False}),
                json_file(filename="d.whl", url=f"d.whl#sha256={SHA_A}", yanked=""),
            ],
        }
    ).encode()
    page = index.parse_project_json(data, "demo.pkg")
    assert page.name == "demo-pkg" and page.versions == () and page.api_version == "1.0"
    assert [f.core_metadata for f in page.files] == [{"sha256": SHA_M}, True, True, False]
    assert page.files[3].url == "d.whl" and page.files[3].yanked is True


def test_json_max_files() -> None:
    data = page_json([json_file(filename=f"f{i}.whl") for i in range(6)])
    with pytest.raises(IndexParseError, match="more than 5"):
        index.parse_project_json(data, "demo", max_files=5)
    assert len(index.parse_project_json(data, "demo", max_files=6).files) == 6


@pytest.mark.parametrize(
    "data",
    [b"[]", b'{"meta": {"api-version": "1.0"}, "projects": [1]}', b'{"meta": {"api-version": "1.0"}, "projects": [{"name": 1}]}'],
)
def test_bad_json_project_lists_raise(data: bytes) -> None:
    with pytest.raises(IndexParseError):
        index.parse_project_list_json(data)


# ---------------------------------------------------------------- rendering


def test_render_html_shape() -> None:
    page = ProjectPage(name="requests", files=EXPECTED_FILES)
    text = index.render_project_html(page).decode()
    assert '<meta name="pypi:repository-version" content="1.1">' in text
    assert f'href="{FILES}/ef/01/requests-2.32.0-py3-none-any.whl#sha256={SHA_B}"' in text
    assert 'data-requires-python="&gt;=3.8"' in text
    assert f'data-core-metadata="sha256={SHA_M}" data-dist-info-metadata="sha256={SHA_M}"' in text
    assert 'data-yanked="Yanked due to conflicts' in text
    assert text.count("<a ") == 2


def test_render_json_shape() -> None:
    page = ProjectPage(name="requests", files=(DistFile("d.whl", "d.whl", {}),), versions=("1.0",))
    obj = json.loads(index.render_project_json(page))
    assert obj["meta"] == {"api-version": "1.1"} and obj["versions"] == ["1.0"]
    (entry,) = obj["files"]
    # Absent PEP 700 fields are left out, not null; PEP 714 forbids the plain legacy key.
    assert entry == {
        "filename": "d.whl",
        "url": "d.whl",
        "hashes": {},
        "yanked": False,
        "core-metadata": False,
        "data-dist-info-metadata": False,
    }


def test_rendering_is_deterministic_regardless_of_dict_order() -> None:
    one = DistFile("d.whl", "d.whl", {"sha256": SHA_A, "md5": "ab"}, core_metadata={"sha256": SHA_M, "blake2b_256": "cd"})
    two = DistFile("d.whl", "d.whl", {"md5": "ab", "sha256": SHA_A}, core_metadata={"blake2b_256": "cd", "sha256": SHA_M})
    assert one == two
    for render in (index.render_project_html, index.render_project_json):
        assert render(ProjectPage("demo", (one,))) == render(ProjectPage("demo", (two,)))
    html_text = index.render_project_html(ProjectPage("demo", (one,))).decode()
    assert f"#sha256={SHA_A}" in html_text and f'data-core-metadata="sha256={SHA_M}"' in html_text


def test_render_html_refuses_url_with_fragment() -> None:
    with pytest.raises(ValueError, match="fragment"):
        index.render_project_html(ProjectPage("demo", (DistFile("d.whl", "d.whl#x", {}),)))


def test_with_urls_rewrites_only_urls() -> None:
    page = ProjectPage(name="requests", files=EXPECTED_FILES, versions=("0.2.0",))
    moved = index.with_urls(page, lambda f: f"/packages/requests/{f.filename}")
    assert [f.url for f in moved.files] == [f"/packages/requests/{f.filename}" for f in EXPECTED_FILES]
    assert [dataclasses.replace(f, url="") for f in moved.files] == [dataclasses.replace(f, url="") for f in page.files]
    assert moved.versions == page.versions


def test_project_list_round_trips_and_links() -> None:
    plist = ProjectList(projects=("Zope.Interface", "requests", '"><script>x'))
    assert index.parse_project_list_json(index.render_project_list_json(plist)) == plist
    rendered = index.render_project_list_html(plist)
    assert index.parse_project_list_html(rendered) == plist
    assert b'href="zope-interface/"' in rendered
    assert b"<script>" not in rendered


def test_pypi_pages_round_trip() -> None:
    json_page = index.parse_project_json(PYPI_JSON, "requests")
    assert index.parse_project_json(index.render_project_json(json_page), "requests") == json_page
    html_page = index.parse_project_html(PYPI_HTML, "requests")
    assert index.parse_project_html(index.render_project_html(html_page), "requests") == html_page


# ---------------------------------------------------------------- negotiation

PIP = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"
UV = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, MediaType.HTML),
        ("", MediaType.HTML),
        ("   ", MediaType.HTML),
        ("*/*", MediaType.HTML),
        ("text/*", MediaType.HTML),
        ("application/*", MediaType.HTML_V1),
        ("text/html", MediaType.HTML),
        ("TEXT/HTML; charset=utf-8", MediaType.HTML),
        (PIP, MediaType.JSON_V1),
        (UV, MediaType.JSON_V1),
        (BROWSER, MediaType.HTML),
        ("application/vnd.pypi.simple.v1+json", MediaType.JSON_V1),
        ("application/vnd.pypi.simple.latest+json", MediaType.JSON_V1),
        ("application/vnd.pypi.simple.latest+html", MediaType.HTML_V1),
        ("application/vnd.pypi.simple.v1+html", MediaType.HTML_V1),
        # Ties between named types go to the most expressive one.
        ("text/html, application/vnd.pypi.simple.v1+html, application/vnd.pypi.simple.v1+json", MediaType.JSON_V1),
        ("text/html, application/vnd.pypi.simple.v1+html", MediaType.HTML_V1),
        # A named type beats a wildcard at the same quality.
        ("*/*, text/html", MediaType.HTML),
        ("*/*, application/vnd.pypi.simple.v1+json", MediaType.JSON_V1),
        # Quality decides before anything else.
        ("application/vnd.pypi.simple.v1+json;q=0.5, text/html", MediaType.HTML),
        ("application/vnd.pypi.simple.v1+json;q=0.5, */*;q=0.6", MediaType.HTML),
        ("application/vnd.pypi.simple.v1+json;q=0.999, text/html;q=0.998", MediaType.JSON_V1),
        ("application/vnd.pypi.simple.v1+json; Q=1.000, text/html;q=0.5", MediaType.JSON_V1),
        # q=0 excludes, and the most specific range overrides a wildcard.
        ("*/*, text/html;q=0", MediaType.HTML_V1),
        ("*/*, text/html;q=0, application/vnd.pypi.simple.v1+html;q=0", MediaType.JSON_V1),
        ("text/html;q=0", None),
        ("application/vnd.pypi.simple.v1+json;q=0, application/vnd.pypi.simple.v1+html;q=0.0, text/html;q=0.000", None),
        ("*/*;q=0", None),
        # Nothing we serve.
        ("application/json", None),
        ("image/png, application/xml", None),
        ("application/vnd.pypi.simple.v2+json", None),
        # Bogus items are dropped; an all-bogus header counts as absent.
        ("garbage", MediaType.HTML),
        (";;;,,,", MediaType.HTML),
        ("text/html;q=2", MediaType.HTML),
        ("text/html;q=abc, application/vnd.pypi.simple.v1+json;q=0.1", MediaType.JSON_V1),
        ("text/html;q=0.1234, application/json", None),
        ("text/html;q=0.\u0661, application/json", None),
        ("*/html", MediaType.HTML),
    ],
)
def test_negotiate(accept: str | None, expected: MediaType | None) -> None:
    assert index.negotiate(accept) is expected


def test_negotiate_reads_a_bounded_header() -> None:
    filler = ", ".join(["image/png"] * 50)
    assert index.negotiate(f"{filler}, application/vnd.pypi.simple.v1+json") is None
    assert index.negotiate(f"application/vnd.pypi.simple.v1+json, {filler}") is MediaType.JSON_V1
    # "text/html" ends exactly at the 4 KiB mark, its ";q=0.01" beyond it:
    # cutting mid-item would turn it into q=1 and beat the JSON's q=0.5.
    head = "application/vnd.pypi.simple.v1+json;q=0.5, x/"
    pad = "y" * (index.MAX_ACCEPT_LENGTH - len(head) - len(", text/html"))
    cut = f"{head}{pad}, text/html;q=0.01"
    assert cut.index(";q=0.01") == index.MAX_ACCEPT_LENGTH
    assert index.negotiate(cut) is MediaType.JSON_V1
    assert index.negotiate(cut.replace(";q=0.01", "")[: index.MAX_ACCEPT_LENGTH]) is MediaType.HTML


# ---------------------------------------------------------------- properties

HOSTILE = [
    '"><script>alert(1)</script>',
    "' onmouseover='x",
    "&amp;",
    "&lt;b&gt;",
    "</a><a href=x>",
    "<!--",
    "]]>",
    "\u00e9\u2603",
]
hostile_text = st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1, max_size=30), st.text(alphabet="<>&\"' =/;a", min_size=1))
# Names the parsers accept: no separators, control characters, "..", or surrounding blanks.
filenames = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/\\"), min_size=1, max_size=40
).filter(lambda s: s == s.strip() and ".." not in s)
hostile_filenames = st.one_of(st.sampled_from([h for h in HOSTILE if "/" not in h]), filenames)
hex_digests = st.text(alphabet="0123456789abcdef", min_size=1, max_size=64)
one_hash = st.one_of(st.just({}), st.builds(lambda v: {"sha256": v}, hex_digests))
urls = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="#"), min_size=1, max_size=40)


@st.composite
def dist_files(draw: st.DrawFn, *, for_html: bool) -> DistFile:
    text = hostile_text if for_html else st.text(min_size=1, max_size=30)
    hashes = one_hash if for_html else st.dictionaries(st.sampled_from(["sha256", "md5", "blake2b_256"]), hex_digests)
    return DistFile(
        filename=draw(hostile_filenames),
        url=draw(urls if not for_html else urls.filter(lambda u: u.strip() != "")),
        hashes=draw(hashes),
        requires_python=draw(st.none() | text),
        yanked=draw(st.booleans() | text),
        core_metadata=draw(st.booleans() | one_hash.filter(bool)),
        size=None if for_html else draw(st.none() | st.integers(min_value=0, max_value=2**63)),
        upload_time=None if for_html else draw(st.none() | st.text(max_size=30)),
    )


def unique_pages(files: st.SearchStrategy[DistFile], **extra: st.SearchStrategy) -> st.SearchStrategy[ProjectPage]:
    return st.builds(
        ProjectPage,
        name=st.just("demo"),
        files=st.lists(files, max_size=5, unique_by=lambda f: f.filename).map(tuple),
        **extra,
    )


class _TagCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        self.attributes.update(name for name, _value in attrs)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(unique_pages(dist_files(for_html=True)))
def test_html_round_trip_with_hostile_text(page: ProjectPage) -> None:
    rendered = index.render_project_html(page)
    assert index.render_project_html(page) == rendered
    assert index.parse_project_html(rendered, page.name) == page
    text = rendered.decode()
    # Upstream text can add no tag and no attribute: the markup is ours alone.
    assert "<script" not in text
    for dist in page.files:
        for value in (dist.filename, dist.requires_python, dist.yanked):
            if isinstance(value, str):
                assert html.escape(value, quote=True) in text
    collector = _TagCollector()
    collector.feed(text)
    assert set(collector.tags) <= {"html", "head", "meta", "title", "body", "h1", "a", "br"}
    assert collector.attributes <= {
        "name",
        "content",
        "href",
        "data-requires-python",
        "data-yanked",
        "data-core-metadata",
        "data-dist-info-metadata",
    }
    assert collector.tags.count("a") == len(page.files)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(unique_pages(dist_files(for_html=False), versions=st.lists(st.text(max_size=10), max_size=4).map(tuple)))
def test_json_round_trip(page: ProjectPage) -> None:
    expected = dataclasses.replace(
        page,
        files=tuple(dataclasses.replace(f, yanked=True if f.yanked == "" else f.yanked) for f in page.files),
    )
    rendered = index.render_project_json(page)
    assert index.parse_project_json(rendered, page.name) == expected
    assert index.render_project_json(expected) == rendered


@settings(max_examples=100, deadline=None)
@given(st.lists(hostile_text.filter(lambda s: s.strip() == s), max_size=6).map(tuple))
def test_project_list_round_trip(names: tuple[str, ...]) -> None:
    plist = ProjectList(projects=names)
    assert index.parse_project_list_json(index.render_project_list_json(plist)) == plist
    assert index.parse_project_list_html(index.render_project_list_html(plist)) == plist


PARSERS = [
    lambda data: index.parse_project_html(data, "demo"),
    lambda data: index.parse_project_json(data, "demo"),
    index.parse_project_list_html,
    index.parse_project_list_json,
]
html_like = st.lists(
    st.sampled_from(
        [
            "<a href=",
            "<a ",
            ">",
            "</a>",
            '"',
            "'",
            "&",
            "&#",
            "x;",
            "<!",
            "<![CDATA[",
            "<?",
            "<base href=",
            "data-yanked",
            "data-core-metadata=",
            "#sha256=",
            "/",
            "\x00",
            "<meta name=pypi:repository-version content=",
            "2.0",
            "1.1",
            "-->",
            "<!--",
            "=",
            " ",
            "\ud7ff",
        ]
    ),
    max_size=40,
).map("".join)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "meta",
                    "api-version",
                    "name",
                    "files",
                    "versions",
                    "projects",
                    "filename",
                    "url",
                    "hashes",
                    "yanked",
                    "core-metadata",
                    "size",
                    "sha256",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300)
    | html_like.map(str.encode)
    | st.text(max_size=200).map(str.encode)
    | json_like.map(lambda o: json.dumps(o).encode())
)
def test_parsers_raise_only_index_parse_error(data: bytes) -> None:
    for parse in PARSERS:
        try:
            parse(data)
        except IndexParseError:
            pass


@settings(max_examples=100, deadline=None)
@given(json_like)
def test_json_shaped_garbage_under_a_valid_meta(body: object) -> None:
    obj = {"meta": {"api-version": "1.0"}, "name": "demo", "files": [body], "projects": [body]}
    for parse in PARSERS[1::2]:
        try:
            parse(json.dumps(obj).encode())
        except IndexParseError:
            pass


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=200)
    | st.lists(
        st.sampled_from(["text/html", "*/*", "application/vnd.pypi.simple.v1+json", ";q=", "0.5", ",", " ", "q=0"]), max_size=20
    ).map("".join)
)
def test_negotiate_never_crashes(accept: str) -> None:
    assert index.negotiate(accept) in (*MediaType, None)
