"""What ``tufproxy mirror sync`` takes: requirements, version specifiers and wheel-tag filters."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.mirror.select import (
    MAX_INCLUDE_DEPTH,
    FileFilter,
    SelectionError,
    Wanted,
    merge,
    parse_requirement,
    read_requirements,
)
from proxy.protocol.index import DistFile


def dist(filename: str, **kw: object) -> DistFile:
    return DistFile(filename=filename, url=filename, hashes={"sha256": "0" * 64}, **kw)  # type: ignore[arg-type]


def test_requirements_files_give_names_and_simple_specifiers(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "reqs.txt").write_text(
        "# pinned set\nRequests[socks]>=2.0,<3  # comment\n-r sub/other.txt\n\n"
        "lib==1.0 --hash=sha256:abc\nZope.Interface\n-c constraints.txt\nlib<2\n")
    # Includes are relative to the including file, in every spelling pip accepts.
    (tmp_path / "sub/other.txt").write_text("base>=2\n--requirement more.txt\n-rlast.txt\n")
    (tmp_path / "sub/more.txt").write_text("extra\n")
    (tmp_path / "sub/last.txt").write_text("--requirement=../final.txt\n")
    (tmp_path / "final.txt").write_text("tail<9\n")
    by_name = {w.project: str(w.spec) for w in merge(read_requirements(tmp_path / "reqs.txt"))}
    assert by_name == {"requests": "<3,>=2.0", "lib": "<2,==1.0", "zope-interface": "", "base": ">=2",
                       "extra": "", "tail": "<9"}


def test_requirements_include_cycles_and_depth_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n-r b.txt\n")
    (tmp_path / "b.txt").write_text("-r ./a.txt\n")
    with pytest.raises(SelectionError, match="include each other"):
        read_requirements(tmp_path / "a.txt")
    for i in range(MAX_INCLUDE_DEPTH + 1):
        (tmp_path / f"d{i}.txt").write_text(f"p{i}\n-r d{i + 1}.txt\n")
    (tmp_path / f"d{MAX_INCLUDE_DEPTH + 1}.txt").write_text("end\n")
    with pytest.raises(SelectionError, match="deeper than"):
        read_requirements(tmp_path / "d0.txt")
    with pytest.raises(FileNotFoundError):
        read_requirements(tmp_path / "absent.txt")


def test_parse_requirement_refuses_urls_and_bad_names() -> None:
    with pytest.raises(SelectionError, match="direct URL"):
        parse_requirement("pkg @ https://example.com/pkg.whl")
    with pytest.raises(SelectionError, match="not a requirement"):
        parse_requirement("not a name!")


@pytest.mark.parametrize("filename,kwargs,kept", [
    ("lib-1.0-py3-none-any.whl", {}, True),
    ("lib-1.0.tar.gz", {"sdists": False}, False),
    ("lib-1.0.tar.gz", {"spec": ">=1.0"}, True),
    ("lib-0.9-py3-none-any.whl", {"spec": ">=1.0"}, False),
    ("lib-2.0rc1-py3-none-any.whl", {"spec": ">=1.0"}, True),
    ("lib-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", {"platforms": ["manylinux_2_17_x86_64"]}, True),
    ("lib-1.0-cp311-cp311-win_amd64.whl", {"platforms": ["manylinux_2_17_x86_64"]}, False),
    ("lib-1.0-py3-none-any.whl", {"platforms": ["win_amd64"], "abis": ["cp311"]}, True),
    ("lib-1.0-cp310-cp310-win_amd64.whl", {"abis": ["cp311"]}, False),
    ("lib-1.0-cp311-cp311-win_amd64.whl", {"python_versions": ["3.11"]}, True),
    ("lib-1.0-cp310-cp310-win_amd64.whl", {"python_versions": ["3.11"]}, False),
    ("lib-1.0-cp38-abi3-win_amd64.whl", {"python_versions": ["3.11"]}, True),
    ("lib-1.0-cp312-abi3-win_amd64.whl", {"python_versions": ["3.11"]}, False),
    ("lib-1.0-py2.py3-none-any.whl", {"python_versions": ["3.12"]}, True),
    ("not-a-distribution.exe", {}, False),
])
def test_file_filters(filename: str, kwargs: dict, kept: bool) -> None:
    assert FileFilter.of(**kwargs).keeps(dist(filename), Wanted("lib")) is kept


def test_requires_python_yanked_and_per_project_specifiers() -> None:
    f = FileFilter.of(python_versions=["3.8"])
    assert not f.keeps(dist("lib-1.0-py3-none-any.whl", requires_python=">=3.10"), Wanted("lib"))
    assert f.keeps(dist("lib-1.0-py3-none-any.whl", requires_python=">=3.7"), Wanted("lib"))
    assert not FileFilter.of(yanked=False).keeps(dist("lib-1.0-py3-none-any.whl", yanked="broken"), Wanted("lib"))
    assert FileFilter.of().keeps(dist("lib-1.0-py3-none-any.whl", yanked="broken"), Wanted("lib"))
    pinned = parse_requirement("lib==1.0")
    assert FileFilter.of().keeps(dist("lib-1.0.tar.gz"), pinned)
    assert not FileFilter.of().keeps(dist("lib-1.1.tar.gz"), pinned)
    with pytest.raises(SelectionError, match=r"X\.Y"):
        FileFilter.of(python_versions=["three"])
    with pytest.raises(SelectionError, match="specifier"):
        FileFilter.of(spec="at least 2")
