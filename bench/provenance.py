"""Publish latency of a 100-file project page with PEP 740 provenance against one without (issue 30).

A plain index on 127.0.0.1 (aiohttp, in this process) serves PEP 691 pages of
``--files`` files each; half the projects give every file a ``provenance`` URL
whose object is the real production provenance in tests/assets/provenance
(pypi-attestations' test asset).  A real ``tufproxy gateway serve`` (offline
Sigstore trust root, ``--provenance verify``, no prefetch) publishes each
project once on a miss (POST /_tufproxy/publish/<project>); the time of that
POST is the figure: page fetch, provenance fetches (concurrent), Sigstore
verification of every attestation (certificate chain, transparency log
inclusion, signature: the full cost, done before the subject check), signing.
The attestation's subject is another file, so every file here is then left
out as provenance-invalid; its verification cost is exactly a valid one's.

    python bench/provenance.py [--files 100] [--rounds 5] [--out bench/results/provenance.md]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parents[1]
PROVENANCE = (ROOT / "tests" / "assets" / "provenance" / "pypi_attestations-0.0.19.tar.gz.provenance").read_bytes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page(project: str, files: int, base: str, with_provenance: bool) -> bytes:
    entries = []
    for i in range(files):
        name = f"{project.replace('-', '_')}-1.{i}-py3-none-any.whl"
        entry = {"filename": name, "url": f"{base}files/{name}", "hashes": {"sha256": hashlib.sha256(name.encode()).hexdigest()},
                 "size": 1000, "upload-time": "2024-01-01T00:00:00Z"}
        if with_provenance:
            entry["provenance"] = f"{base}integrity/{project}/1.{i}/{name}/provenance"
        entries.append(entry)
    return json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": entries,
                       "versions": [f"1.{i}" for i in range(files)]}).encode()


def serve_index(port: int, files: int) -> None:
    base = f"http://127.0.0.1:{port}/"

    async def project(request: web.Request) -> web.Response:
        name = request.match_info["project"]
        body = page(name, files, base, name.startswith("prov-"))
        return web.Response(body=body, content_type="application/vnd.pypi.simple.v1+json")

    async def provenance(request: web.Request) -> web.Response:
        return web.Response(body=PROVENANCE, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/simple/{project}/", project)
        app.router.add_get("/integrity/{project}/{version}/{name}/provenance", provenance)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()


def publish_seconds(base: str, project: str) -> float:
    start = time.perf_counter()
    request = urllib.request.Request(f"{base}_tufproxy/publish/{project}", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    return time.perf_counter() - start


def ecdsa_verify_seconds(curve: ec.EllipticCurve, digest: hashes.HashAlgorithm, n: int = 2000) -> float:
    key = ec.generate_private_key(curve)
    signature = key.sign(b"statement" * 30, ec.ECDSA(digest))
    public = key.public_key()
    start = time.perf_counter()
    for _ in range(n):
        public.verify(signature, b"statement" * 30, ec.ECDSA(digest))
    return (time.perf_counter() - start) / n


def floor(plain: float, files: int) -> list[str]:
    """What the signature checks alone cost here, and the best ratio a full verification could reach with them.

    One attestation's verification checks the signing certificate's chain (Fulcio's intermediate and root:
    two P-384 signatures), the certificate's SCT, the Rekor entry's SET and checkpoint, and the DSSE envelope
    (four P-256 signatures).  Whatever else a verifier does, it cannot do less than this.
    """
    p384 = ecdsa_verify_seconds(ec.SECP384R1(), hashes.SHA384())
    p256 = ecdsa_verify_seconds(ec.SECP256R1(), hashes.SHA256())
    per_file = 2 * p384 + 4 * p256
    cores = len(os.sched_getaffinity(0))
    best = (plain + files * per_file / cores) / plain
    return [f"Floor on this machine: one P-384 signature check {p384 * 1e3:.2f} ms, one P-256 {p256 * 1e3:.2f} ms, so "
            f"{per_file * 1e3:.2f} ms of signature checks per attestation; {files} files over {cores} cores add at "
            f"least {files * per_file / cores * 1e3:.0f} ms to the {plain * 1e3:.0f} ms publish, a ratio of at "
            f"least **{best:.2f}x** for any verifier that checks every file's attestation in full."]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    index_port, gw_port = free_port(), free_port()
    serve_index(index_port, args.files)
    with tempfile.TemporaryDirectory() as tmp:
        gw = Path(tmp) / "gw"
        subprocess.run([sys.executable, "-m", "proxy", "gateway", "init", str(gw), "--bins", "16"], check=True,
                       capture_output=True, cwd=ROOT)
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "gateway", "serve", str(gw), "--listen",
                                 f"127.0.0.1:{gw_port}", "--index-url", f"http://127.0.0.1:{index_port}/simple/",
                                 "--provenance", "verify", "--sigstore-offline", "yes", "--prefetch-depth", "0",
                                 "--audit-log", os.devnull, "--log-level", "warning"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{gw_port}/"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"{base}healthz", timeout=2).read()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            publish_seconds(base, "warm-up")  # first publish pays imports and the first signature
            publish_seconds(base, "prov-warm-up")
            plain, prov = [], []
            for r in range(args.rounds):  # interleaved, so machine load falls on both alike
                plain.append(publish_seconds(base, f"plain-{r}"))
                prov.append(publish_seconds(base, f"prov-{r}"))
        finally:
            proc.terminate()
            proc.wait(30)
    p, q = statistics.median(plain), statistics.median(prov)
    lines = [
        f"# PEP 740 provenance: publish latency of a {args.files}-file page",
        "",
        f"`python bench/provenance.py --files {args.files} --rounds {args.rounds}`; load average at the end: "
        f"{os.getloadavg()[0]:.1f} (a shared 2-core machine).",
        "",
        "| page | median publish (s) | all rounds (s) |",
        "|---|---|---|",
        f"| without provenance | {p:.3f} | {', '.join(f'{x:.3f}' for x in plain)} |",
        f"| with provenance ({args.files} objects fetched and verified) | {q:.3f} | {', '.join(f'{x:.3f}' for x in prov)} |",
        "",
        f"ratio with / without: **{q / p:.2f}x** (goal <= 1.5x); per file verified: {(q - p) / args.files * 1000:.1f} ms.",
        "",
        *floor(p, args.files),
    ]
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
