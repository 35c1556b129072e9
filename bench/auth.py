"""Access control's cost: a warm install through an edge with --auth-file against one without, and
warm index pages and wheel bytes over the edge's TLS against nginx with TLS on the same files.

    python bench/auth.py [--projects 20] [--runs 5] [--seconds 5] [--out bench/results/auth.md]

One signed repository (``tufproxy repo``, small wheels plus one 16 MB wheel) served by nginx as the
upstream; in front of it, in turn: tufproxy ``serve --workers 2`` without access control, the same with
``--auth-file`` (bcrypt cost 10) and ``--read-rule '*=authenticated'`` (every request must prove
itself: the worst case), the same with ``--tls-cert``, and nginx (1 worker, TLS, static) serving the
tree's plain pages and files. pip gets the credentials in its index URL in both install runs (an edge
without --auth-file ignores them), so the only difference is the server's check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bcrypt  # noqa: E402
import contenders as C  # noqa: E402
import measure as M  # noqa: E402

from proxy.repository import Repository  # noqa: E402
from proxy.repository.sample import build_wheel  # noqa: E402
from proxy.repository.signer import Expiry  # noqa: E402

PASSWORD = "bench-password-1"
BIG = 16 * 2**20


def build(work: Path, projects: int) -> tuple[Path, list[str], str]:
    """The signed repository; its project names; the big wheel's path under the tree."""
    long = timedelta(days=30)
    repo = Repository.init(work / "repo", bins=256, expiry=Expiry(root=long, targets=long, bins=long, timestamp=long,
                                                                  snapshot=long, bin_n=long))
    names = [f"authbench{i}" for i in range(projects)]
    wheels = [build_wheel(work / "dists", n, "1.0", payload=os.urandom(64 * 1024)) for n in names]
    wheels.append(build_wheel(work / "dists", "authbig", "1.0", payload=os.urandom(BIG)))
    repo.add(wheels)
    big = next((work / "repo" / "public").rglob("authbig-1.0-py3-none-any.whl"))
    return work / "repo", names, "/" + big.relative_to(work / "repo" / "public").as_posix()


def certificates(work: Path) -> tuple[Path, Path, Path]:
    from tests.support.certs import CA

    ca = CA(work / "pki")
    ca.issue(work / "pki" / "server.pem", work / "pki" / "server.key")
    return ca.path, work / "pki" / "server.pem", work / "pki" / "server.key"


def edge(name: str, work: Path, upstream: str, root: Path, *args: str, scheme: str = "http",
         env: dict[str, str] | None = None) -> tuple[C.Server, str]:
    port = C.free_port()
    base = f"{scheme}://127.0.0.1:{port}/"
    argv = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--root", str(root), "--cache-dir",
            str(work / name / "cache"), "--listen", f"127.0.0.1:{port}", "--workers", "2", "--log-level", "warning",
            "--audit-log", str(work / name / "audit.log"), *args]
    return C.Server(name, argv, work / name, f"{base}healthz", env=env), base


def warm_installs(urls: list[str], names: list[str], expect: int, runs: int) -> list[list[float]]:
    """The median warm ``pip download`` time through each URL; runs alternate between them, so a load
    that comes and goes on a shared machine weighs on each alike."""
    for url in urls:
        M.pip_download(url, tuple(names), expect)  # warm every page and file first
    times: list[list[float]] = [[] for _ in urls]
    for _ in range(runs):
        for i, url in enumerate(urls):
            times[i].append(M.pip_download(url, tuple(names), expect))
    return times


def nginx_tls(work: Path, public: Path, cert: Path, key: Path) -> tuple[C.Server, str]:
    port = C.free_port()
    conf = C._nginx_conf(work / "nginx-tls", port, f"""
  server {{
    listen 127.0.0.1:{port} ssl backlog=4096;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    root {public};
    index index.html;
    location / {{ try_files $uri $uri/ =404; }}
  }}""")
    base = f"https://127.0.0.1:{port}/"
    return C.Server("nginx-tls", C.nginx_argv(conf, work / "nginx-tls"), work / "nginx-tls", f"{base}simple/",
                    env={"SSL_CERT_FILE": str(work / "pki" / "ca.pem")}), base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--projects", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "auth.md")
    args = parser.parse_args()
    lines: list[str] = []
    # Not a TemporaryDirectory (mode 0700): nginx's workers must read the tree.
    cache = HERE / ".cache"
    cache.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="auth-", dir=cache) as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        repo, names, big = build(work, args.projects)
        public, root = repo / "public", repo / "public" / "metadata" / "1.root.json"
        expect = sum(p.stat().st_size for p in public.rglob("*.whl") if p.name.startswith("authbench"))
        upstream = C.Upstream(public, work / "upstream")
        htpasswd = work / "htpasswd"
        htpasswd.write_text(f"bench:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()}\n")
        ca, cert, key = certificates(work)
        started: list[C.Server] = []
        try:
            plain, plain_url = edge("plain", work, upstream.url, root)
            started.append(plain)
            guarded, guarded_url = edge("guarded", work, upstream.url, root, "--auth-file", str(htpasswd),
                                        "--read-rule", "*=authenticated")
            started.append(guarded)
            creds = f"bench:{PASSWORD}@"
            plain_times, guarded_times = warm_installs([u.replace("://", f"://{creds}") + "simple/" for u in (plain_url, guarded_url)],
                                                       names, expect, args.runs)
            t_plain, t_guarded = statistics.median(plain_times), statistics.median(guarded_times)
            # Paired: each run of one edge beside the run of the other right after it.
            paired = sorted(g / p for p, g in zip(plain_times, guarded_times, strict=True))
            for s in (plain, guarded):
                s.stop()
            started.clear()
            env = {"SSL_CERT_FILE": str(ca)}
            os.environ["SSL_CERT_FILE"] = os.environ["CURL_CA_BUNDLE"] = str(ca)  # our checks, pip and curl trust it
            tls, tls_url = edge("tls", work, upstream.url, root, "--tls-cert", str(cert), "--tls-key", str(key),
                                scheme="https", env=env)
            started.append(tls)
            nginx, nginx_url = nginx_tls(work, public, cert, key)
            started.append(nginx)
            M.pip_download(tls_url + "simple/", tuple(names), expect)  # warm the edge's pages and files
            bigname = big.rsplit("/", 1)[1]
            size = big_size(public)
            M.curl_file(f"{tls_url}packages/authbig/{bigname}", size)  # warm
            pages = [f"/simple/{n}/" for n in names]
            rows = []
            for label, base, file_url in (("tufproxy --tls-cert (2 workers)", tls_url, f"{tls_url}packages/authbig/{bigname}"),
                                          ("nginx TLS, static (1 worker)", nginx_url, f"{nginx_url.rstrip('/')}{big}")):
                load = M.wrk_pages(base, pages, 16, args.seconds, work)
                mbps = M.wrk_file(file_url, size, 8, args.seconds)
                rows.append((label, load.rps, load.p99_ms, mbps))
        finally:
            for s in started:
                s.stop()
            upstream.stop()
    command = "python bench/auth.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()
    lines += [
        "# Access control's cost (bench/auth.py)", "",
        f"`{command.strip()}` on {os.cpu_count()} CPUs, load {load[0]:.1f} at the end, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
        "## Warm install through an edge", "",
        f"`pip download --no-deps` of {len(names)} projects (credentials in the index URL), median of {args.runs} "
        "runs alternating between the two:", "",
        "| edge | median s | min-max s | ratio of medians |", "|---|---|---|---|",
        f"| `serve --workers 2` | {t_plain:.2f} | {min(plain_times):.2f}-{max(plain_times):.2f} | 1.00 |",
        f"| `+ --auth-file (bcrypt 10) --read-rule '*=authenticated'` | {t_guarded:.2f} | "
        f"{min(guarded_times):.2f}-{max(guarded_times):.2f} | {t_guarded / t_plain:.3f} |",
        "", f"Paired ratios (guarded / plain, each pair run back to back): median {statistics.median(paired):.3f}, "
        f"quartiles {paired[len(paired) // 4]:.3f}-{paired[(3 * len(paired)) // 4]:.3f}. Goal: <= 1.05x.", "",
        "## Over TLS, warm", "",
        f"`wrk` pip's Accept over {len(names)} project pages, 16 connections; the 16 MB wheel over 8 connections; "
        f"{args.seconds:.0f} s each:", "",
        "| server | pages req/s | p99 ms | wheel MB/s |", "|---|---|---|---|",
        *(f"| {label} | {rps:.0f} | {p99:.1f} | {mbps:.0f} |" for label, rps, p99, mbps in rows),
        "", f"tufproxy / nginx: pages {rows[0][1] / rows[1][1]:.2f}x, wheel {rows[0][3] / rows[1][3]:.2f}x.", "",
    ]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)
    return 0


def big_size(public: Path) -> int:
    return next(public.rglob("authbig-1.0-py3-none-any.whl")).stat().st_size


if __name__ == "__main__":
    sys.exit(main())
