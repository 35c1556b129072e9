"""The benchmark's upstream: a signed tufproxy repository of real-sized wheels.

Built once with ``tufproxy repo``'s own code (16384 bins, like PyPI's PEP 458
plan) from wheels whose payload is random, so their sizes are real on the
wire and on disk, and cached under ``bench/.cache/repo``; a spec digest
tells a stale cache from a good one.  Online roles get a long expiry so a
cached tree stays valid between runs; ``refresh`` re-signs it when due.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.repository.signer import Expiry

BINS = 16384
KB, MB = 1000, 1000**2
# (project, wheel size): a spread like a real requirements set, from a few KB
# to one very large wheel (think torch).  Sizes are approximate (deflate).
PROJECTS: tuple[tuple[str, int], ...] = (
    ("torchlike", 210 * MB), ("scipy", 35 * MB), ("numpy", 16 * MB), ("pandas", 12 * MB),
    ("botocore", 12 * MB), ("lxml", 8 * MB), ("matplotlib", 8 * MB), ("grpcio", 5 * MB),
    ("pillow", 4500 * KB), ("cryptography", 4 * MB), ("pip", 1800 * KB), ("aiohttp", 1300 * KB),
    ("setuptools", 1200 * KB), ("pygments", 1200 * KB), ("pyyaml", 750 * KB), ("pytz", 505 * KB),
    ("protobuf", 300 * KB), ("yarl", 300 * KB), ("frozenlist", 270 * KB), ("rich", 240 * KB),
    ("python-dateutil", 230 * KB), ("certifi", 160 * KB), ("boto3", 139 * KB), ("jinja2", 133 * KB),
    ("urllib3", 128 * KB), ("multidict", 125 * KB), ("click", 98 * KB), ("s3transfer", 82 * KB),
    ("tqdm", 78 * KB), ("wheel", 72 * KB), ("idna", 70 * KB), ("requests", 64 * KB),
    ("attrs", 63 * KB), ("packaging", 54 * KB), ("charset-normalizer", 50 * KB),
    ("typing-extensions", 37 * KB), ("markupsafe", 25 * KB), ("jmespath", 20 * KB), ("six", 11 * KB),
)
# One project with a long history, so one index page is PyPI-sized (many links).
HISTORY_PROJECT, HISTORY_VERSIONS, HISTORY_SIZE = "pytz", 120, 30 * KB
LARGE_PROJECT = "torchlike"
# base64 text deflates to about 3/4 of its length: the payload that makes a wheel of size N.
_DEFLATED = 0.752


@dataclass(frozen=True)
class Corpus:
    """The built repository and what the scenarios need to know about it."""

    repo_dir: Path
    public_dir: Path
    root_file: Path
    projects: tuple[str, ...]
    large_file: str  # file name of the large wheel
    large_size: int
    total_bytes: int  # the latest wheel of every project: what `pip download` fetches


def _spec_digest() -> str:
    spec = json.dumps([BINS, PROJECTS, HISTORY_PROJECT, HISTORY_VERSIONS, HISTORY_SIZE, _DEFLATED])
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def _payload(size: int) -> bytes:
    """Payload for a wheel of about ``size`` bytes: base64 of random bytes, which
    repr() keeps 1:1 and deflate cannot shrink below 3/4."""
    return base64.b64encode(os.urandom(int(size / _DEFLATED * 3 / 4)))


def _wheels(dest: Path) -> list[Path]:
    files = [build_wheel(dest, name, "1.0", payload=_payload(size)) for name, size in PROJECTS]
    files += [build_wheel(dest, HISTORY_PROJECT, f"0.{i}", payload=_payload(HISTORY_SIZE))
              for i in range(HISTORY_VERSIONS)]
    return files


def build(cache: Path, log=print) -> Corpus:  # type: ignore[no-untyped-def]
    """Return the cached corpus, building it first when missing or stale."""
    repo_dir = cache / "repo"
    stamp = cache / "repo.spec"
    if not (stamp.exists() and stamp.read_text() == _spec_digest() and (repo_dir / "repository.json").exists()):
        log(f"building the upstream corpus in {cache} (once; a few minutes) ...")
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        long = timedelta(days=3650)
        repo = Repository.init(repo_dir, bins=BINS, expiry=Expiry(root=long, targets=long, bins=long,
                                                                 timestamp=long, snapshot=long, bin_n=long))
        dists = cache / "dists"
        repo.add(_wheels(dists))
        shutil.rmtree(dists)
        stamp.write_text(_spec_digest())
    else:
        Repository.open(repo_dir).refresh()
    public = repo_dir / "public"
    large = next((public / "packages" / LARGE_PROJECT).glob(f"{LARGE_PROJECT}-1.0-*.whl"))
    names = tuple(sorted(name for name, _ in PROJECTS))
    total = sum(next((public / "packages" / n).glob(f"{n.replace('-', '_')}-1.0-*.whl")).stat().st_size for n in names)
    return Corpus(repo_dir, public, public / "metadata" / "1.root.json", names, large.name, large.stat().st_size, total)


if __name__ == "__main__":
    c = build(Path(__file__).resolve().parent / ".cache")
    print(
        f"{len(c.projects)} projects, {c.total_bytes / MB:.0f} MB latest wheels, large {c.large_file} {c.large_size / MB:.0f} MB"
    )
