"""What a distribution file says about itself: project, version, metadata.

Reads wheels and sdists given to ``tufproxy repo add`` without running any
of their code: the file name (PEP 427 / PEP 625, read by ``packaging.utils``)
gives project and version, the embedded core metadata gives
``Requires-Python`` and, for wheels, the PEP 658 ``.metadata`` bytes.
"""

from __future__ import annotations

import email.parser
import re
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from proxy.protocol.errors import Fault
from proxy.protocol.layout import SDIST_SUFFIXES, is_valid_filename, is_valid_project_name, project_and_version

# Core metadata files are small; a bigger one is hostile or broken.
MAX_CORE_METADATA = 16 * 2**20


class NotADistribution(ValueError):
    """The file is not a wheel or sdist we can read."""

    reason = "not-a-distribution"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class Distribution:
    """A distribution file and what we read out of it."""

    path: Path
    filename: str
    project: str  # normalised
    version: str
    requires_python: str | None
    core_metadata: bytes | None  # wheels only (PEP 658)


def _parse_metadata(data: bytes, filename: str) -> email.message.Message:
    if len(data) > MAX_CORE_METADATA:
        raise NotADistribution(f"{filename}: core metadata larger than {MAX_CORE_METADATA} bytes")
    return email.parser.BytesParser().parsebytes(data, headersonly=True)


def _wheel(path: Path) -> Distribution:
    named = project_and_version(path.name)
    if named is None:
        raise NotADistribution(f"{path.name}: not a wheel file name (PEP 427)")
    project, version = named
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise NotADistribution(f"{path.name}: wheel has no single .dist-info/METADATA")
            info = zf.getinfo(names[0])
            if info.file_size > MAX_CORE_METADATA:
                raise NotADistribution(f"{path.name}: METADATA too large")
            core = zf.read(info)
    except (zipfile.BadZipFile, OSError) as e:
        raise NotADistribution(f"{path.name}: not a readable zip file ({e})") from e
    msg = _parse_metadata(core, path.name)
    _check_name(path.name, project, msg)
    return Distribution(path, path.name, project, version, msg.get("Requires-Python"), core)


def _sdist(path: Path) -> Distribution:
    suffix = next(s for s in SDIST_SUFFIXES if path.name.endswith(s))
    named = project_and_version(path.name)
    if named is None:
        raise NotADistribution(f"{path.name}: not an sdist file name (NAME-VERSION{suffix}, PEP 625)")
    project, version = named
    pkg_info: bytes | None = None
    try:
        if suffix == ".zip":
            with zipfile.ZipFile(path) as zf:
                for n in zf.namelist():
                    if re.fullmatch(r"[^/]+/PKG-INFO", n):
                        pkg_info = zf.read(n)
                        break
        else:
            with tarfile.open(path, "r:gz") as tf:
                for member in tf:
                    if member.isfile() and re.fullmatch(r"[^/]+/PKG-INFO", member.name):
                        f = tf.extractfile(member)
                        pkg_info = f.read(MAX_CORE_METADATA + 1) if f else None
                        break
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise NotADistribution(f"{path.name}: not a readable archive ({e})") from e
    if pkg_info is None:
        raise NotADistribution(f"{path.name}: sdist has no PKG-INFO")
    msg = _parse_metadata(pkg_info, path.name)
    _check_name(path.name, project, msg)
    return Distribution(path, path.name, project, version, msg.get("Requires-Python"), None)


def _check_name(filename: str, project: str, msg: email.message.Message) -> None:
    declared = msg.get("Name")
    if not declared or not is_valid_project_name(declared):
        raise NotADistribution(f"{filename}: core metadata has no valid Name")
    if canonicalize_name(declared) != project:
        raise NotADistribution(f"{filename}: file name says {project!r} but metadata says {declared!r}")


def inspect_distribution(path: Path) -> Distribution:
    """Read ``path`` as a wheel or sdist, or raise :class:`NotADistribution`."""
    if not path.is_file():
        raise NotADistribution(f"{path}: no such file")
    if not is_valid_filename(path.name):
        raise NotADistribution(f"{path.name}: file name is not safe as a target path")
    if path.name.endswith(".whl"):
        return _wheel(path)
    if path.name.endswith(SDIST_SUFFIXES):
        return _sdist(path)
    raise NotADistribution(f"{path.name}: not a wheel (.whl) or sdist (.tar.gz, .zip)")
