"""Signing cost of one gateway publish batch: a key file beside a SoftHSM2 token key.

A batch signs the timestamp, the snapshot and every bin-n it changed.  For
each key this measures

* **signing only**: ``Metadata.sign`` of a real timestamp, snapshot and k
  bin-n roles (k = 1, 4, 16) of a gateway repository, median of ``--repeats``
  (the token opens a session and logs in per signature: securesystemslib's
  ``HSMSigner`` does, and tufproxy keeps it);
* **whole publishes**: ``Repository.publish_pages`` of one new project page
  (page rendering, signing, writing, ``os.sync``, timestamp last), as the
  gateway's publisher runs it, back to back for ``--seconds``: batches a second.

Keys: the default online key (an Ed25519 file), an ECDSA P-256 file (the token's
algorithm, so the token's own cost shows apart from the algorithm's), and an ECDSA
P-256 key in a SoftHSM2 token (``pkcs11:`` URI).  Needs ``softhsm2`` and ``opensc``
(``apt-get install softhsm2 opensc``) and ``pip install -e '.[hsm]'``.

Usage: ``python bench/signing.py [--repeats 50] [--seconds 5] [--out bench/results/signing.md]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = "/usr/lib/softhsm/libsofthsm2.so"
PIN = "4711"


def _token(directory: Path) -> str:
    """A SoftHSM2 store of our own with one EC P-256 key; its pkcs11: URI."""
    (directory / "tokens").mkdir(parents=True)
    conf = directory / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {directory / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    os.environ["SOFTHSM2_CONF"] = str(conf)  # before python-pkcs11 loads the module: it reads this once
    subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", "bench", "--so-pin", "8642", "--pin", PIN],
                   check=True, capture_output=True)
    subprocess.run(["pkcs11-tool", "--module", MODULE, "--token-label", "bench", "--login", "--pin", PIN, "--keypairgen",
                    "--key-type", "EC:prime256v1", "--label", "online", "--id", "01"], check=True, capture_output=True)
    from proxy.protocol.keyuri import pkcs11_uri

    return pkcs11_uri("bench", object="online", module_path=MODULE, pin_value=PIN)


def _repo(directory: Path, online: str | None):  # type: ignore[no-untyped-def]
    from proxy.repository import Expiry, Repository
    from proxy.repository.keys import KeyURIs

    return Repository.init(directory, bins=1024, layout="gateway", clock_versions=True, expiry=Expiry(),
                           key_uris=KeyURIs(online=online))


def _file_p256(directory: Path) -> str:
    from securesystemslib.signer import CryptoSigner

    signer = CryptoSigner.generate_ecdsa()
    path = directory / "online-p256.pem"
    path.write_bytes(signer.private_bytes)
    return f"file2:{path}"


def _sign_only(repo, repeats: int) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """Median seconds to sign timestamp + snapshot + k bins with the repository's online key."""
    from tuf.api.metadata import Metadata

    from proxy.repository.keys import ONLINE

    signer = repo.keys.load(ONLINE)
    meta = repo.metadata_dir
    timestamp = Metadata.from_bytes((meta / "timestamp.json").read_bytes())
    snapshot = Metadata.from_bytes((meta / f"{timestamp.signed.snapshot_meta.version}.snapshot.json").read_bytes())
    bins = [Metadata.from_bytes(p.read_bytes()) for p in sorted(meta.glob("*.bin-*.json"))[:16]]
    out = {}
    for k in (1, 4, 16):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for md in (*bins[:k], snapshot, timestamp):
                md.sign(signer)
            times.append(time.perf_counter() - t0)
        out[k] = statistics.median(times)
    return out


def _publishes(repo, seconds: float) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Back-to-back one-project publishes for ``seconds``: (batches, seconds taken)."""
    from proxy.protocol import index

    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        name = f"project-{n}"
        page = index.ProjectPage(name=name, files=(index.DistFile(
            filename=f"{name}-1.0-py3-none-any.whl", url=f"../../packages/{name}/{name}-1.0-py3-none-any.whl",
            hashes={"sha256": "0" * 64}),))
        repo.publish_pages({name: page})
        n += 1
    return n, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tufproxy-signing-") as tmp:
        base = Path(tmp)
        token = _token(base / "softhsm")
        keys = [("Ed25519 file (default)", None), ("ECDSA P-256 file", _file_p256(base)), ("ECDSA P-256 SoftHSM2 token", token)]
        for i, (label, uri) in enumerate(keys):
            repo = _repo(base / f"repo-{i}", uri)
            sign = _sign_only(repo, args.repeats)
            batches, took = _publishes(repo, args.seconds)
            rows.append((label, sign, batches / took))
            print(f"{label}: signing 1/4/16 bins {sign[1] * 1e3:.2f}/{sign[4] * 1e3:.2f}/{sign[16] * 1e3:.2f} ms, "
                  f"{batches / took:.1f} publishes/s", file=sys.stderr)
    peer = rows[0]
    lines = [
        "# Signing cost per publish batch: key file vs SoftHSM2 token",
        "",
        f"`python bench/signing.py --repeats {args.repeats} --seconds {args.seconds}` "
        f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end; a shared machine: compare ratios).",
        "",
        "Signing only: timestamp + snapshot + k bin-n roles, median ms (ratio to the Ed25519 file key).",
        "Whole publishes: one new project page per batch, back to back, as the gateway's publisher signs "
        "(render, sign, write, os.sync, timestamp last).",
        "",
        "| online key | k=1 | k=4 | k=16 | batches/s signing only, k=1 | whole publishes/s |",
        "|---|---|---|---|---|---|",
    ]
    for label, sign, rate in rows:
        cells = [f"{sign[k] * 1e3:.2f} ({sign[k] / peer[1][k]:.1f}x)" for k in (1, 4, 16)]
        lines.append(f"| {label} | {' | '.join(cells)} | {1 / sign[1]:.0f} | {rate:.1f} ({rate / peer[2]:.2f}x) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
