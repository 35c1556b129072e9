"""CPU of the one fetch-and-verify alone: a file fetched again and again from a local server into a temp file.

A server process on 127.0.0.1 (aiohttp, sendfile) serves ``--mb`` MB of random
bytes; for each tree (``--tree NAME=DIR[:VAR=VALUE...]``, as in bench/uvab.py;
default: this one), a fresh process fetches it ``--count`` times through
``proxy.trust.fetch.fetch_verified`` into a temp file (sha256 checked, as a
cold file is at each hop), after two untimed fetches, having made glibc's
malloc settings as a tufproxy command does (``proxy.util.malloc.tune``, where
the tree has it; ``:BENCH_MALLOC=default`` after a tree's directory keeps glibc's own).  It prints that process's user and system CPU seconds, its
minor page faults and the wall time, per tree, ``--rounds`` times in turn.

    python bench/fetch_cpu.py [--mb 8] [--count 40] [--rounds 3] [--tree NAME=DIR[:VAR=VALUE...] ...]

Bodies of 16 MiB and more are received straight into the fetch's buffers
(``proxy.transport.upstream.RECEIVE_MIN``); smaller ones go through aiohttp's reads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from contenders import free_port  # noqa: E402

SERVER = textwrap.dedent("""
    import sys
    from aiohttp import web
    async def answer(request):
        return web.FileResponse(sys.argv[1])
    app = web.Application()
    app.router.add_get("/f", answer)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=lambda *_: print("ready", flush=True))
""")

CLIENT = textwrap.dedent("""
    import asyncio, hashlib, os, resource, sys, tempfile, time
    if os.environ.get("BENCH_MALLOC") != "default":  # BENCH_MALLOC=default: glibc's own thresholds
        try:
            from proxy.util import malloc
            malloc.tune()
        except ImportError:
            pass
    from proxy.transport.upstream import AiohttpFetcher
    from proxy.trust.fetch import FileSink, Want, fetch_verified
    path, url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # Hashed in small pieces: freeing one large block would raise glibc's thresholds for the whole run.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(65536):
            digest.update(piece)
    want = Want("f", {"sha256": digest.hexdigest()}, os.path.getsize(path))
    async def main():
        fetcher = AiohttpFetcher()
        async def once():
            fd, name = tempfile.mkstemp(dir=os.path.dirname(path))
            os.unlink(name)
            try:
                await fetch_verified(fetcher, want, [url], FileSink(fd))
            finally:
                os.close(fd)
        for _ in range(2):
            await once()
        before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(count):
            await once()
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt,
              time.perf_counter() - began)
        await fetcher.close()
    asyncio.run(main())
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR[:VAR=VALUE...]")
    args = ap.parse_args()
    trees: dict[str, dict[str, str]] = {}
    for name, _, rest in (t.partition("=") for t in args.tree):
        tree, *settings = rest.split(":")
        trees[name] = {"PYTHONPATH": str(Path(tree).resolve()), **dict(s.split("=", 1) for s in settings)}
    trees = trees or {"tufproxy": {"PYTHONPATH": str(HERE.parent)}}
    for env in trees.values():  # the tree's own proxy/, but the dependencies of the environment running this
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env["PYTHONPATH"], os.environ.get("PYTHONPATH")]))
    results: dict[str, list[list[float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-fetch-cpu-") as tmp:
        body = Path(tmp) / "body"
        body.write_bytes(os.urandom(int(args.mb * 1e6)))
        port = free_port()
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(body), str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            for r in range(args.rounds):
                for name, env in trees.items():
                    # Run from the temp directory: "python -c" puts the working directory first on sys.path,
                    # where this checkout's proxy/ would shadow the tree's.
                    out = subprocess.run([sys.executable, "-c", CLIENT, str(body), f"http://127.0.0.1:{port}/f",
                                          str(args.count)], env={**os.environ, **env}, check=True, capture_output=True,
                                         text=True, cwd=tmp).stdout
                    results[name].append([float(x) for x in out.split()])
                print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0] + v[-1][1]:.2f} CPU s" for k, v in results.items()),
                      file=sys.stderr)
        finally:
            server.terminate()
            server.wait()
    given = "".join(f" --tree {t}" for t in args.tree)
    print(f"`python bench/fetch_cpu.py --mb {args.mb:g} --count {args.count} --rounds {args.rounds}{given}`; "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; medians of the rounds.\n")
    print("| tree | user (s) | system (s) | CPU per fetch (ms) | page faults | wall (s) |\n|---|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        user, system, faults, wall = (statistics.median(row[i] for row in rows) for i in range(4))
        print(f"| {name} | {user:.3f} | {system:.3f} | {1000 * (user + system) / args.count:.1f} | {faults:.0f} | {wall:.3f} |")


if __name__ == "__main__":
    main()
