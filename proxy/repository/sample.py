"""Real wheels and sdists made on the spot, offline: for ``tufproxy demo`` and the tests.

Wheels are written in the wheel format by hand (a zip with a dist-info
directory and a RECORD), which is all pip and uv need to install them, so
a new machine with no index at all can still try the whole chain.  Both are
reproducible: the same arguments give the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import re
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

# 2020-01-01T00:00:00Z: every member of every archive we build carries this time.
_EPOCH = 1577836800
_ZIP_EPOCH = (2020, 1, 1, 0, 0, 0)


def _metadata(name: str, version: str, requires: Sequence[str], requires_python: str | None) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: test package {name}"]
    if requires_python:
        lines.append(f"Requires-Python: {requires_python}")
    # Installers honour an extra only if the metadata declares it (pip ignores undeclared ones, with a warning).
    extras = dict.fromkeys(e for r in requires for e in re.findall(r"""extra\s*==\s*['"]([^'"]+)['"]""", r))
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + "\n\n"


def build_wheel(
    dest: Path,
    name: str,
    version: str,
    requires: Sequence[str] = (),
    requires_python: str | None = None,
    payload: bytes = b"",
    tag: str = "py3-none-any",
) -> Path:
    """Write ``name-version-tag.whl`` into ``dest`` and return its path.

    ``payload`` lands in the module as a bytes constant, to make files of a
    chosen size or to make two builds of one version differ.
    """
    dist = canonicalize_name(name).replace("-", "_")
    module = dist
    distinfo = f"{dist}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\nPAYLOAD = {payload!r}\n".encode(),
        f"{distinfo}/METADATA": _metadata(name, version, requires, requires_python).encode(),
        f"{distinfo}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tufproxy-tests\nRoot-Is-Purelib: true\nTag: "
        + tag.encode()
        + b"\n",
    }
    record_lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{distinfo}/RECORD,,")
    files[f"{distinfo}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return out


def build_sdist(dest: Path, name: str, version: str, requires: Sequence[str] = ()) -> Path:
    """Write ``name-version.tar.gz`` (PKG-INFO, pyproject.toml, a module) into ``dest``."""
    dist = canonicalize_name(name).replace("-", "_")
    root = f"{dist}-{version}"
    files = {
        f"{root}/PKG-INFO": _metadata(name, version, requires, None).encode(),
        f"{root}/pyproject.toml": (
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\n'
        ).encode(),
        f"{root}/{dist}/__init__.py": f"VERSION = {version!r}\n".encode(),
    }
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{root}.tar.gz"
    # Same inputs, same bytes (so `tufproxy demo` can rerun over its own repository):
    # fixed member times, and a gzip header with no time and no file name.
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = _EPOCH
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return out
