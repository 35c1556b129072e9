"""``tufproxy serve`` and ``tufproxy demo`` on the command line.

``serve`` resolves the settings and runs :func:`proxy.serving.serve.start` in this
process, or in ``--workers`` processes under :mod:`proxy.serving.workers`.  ``demo``
adds a signed repository of its own, served as an untrusted mirror on
loopback, so one command shows the whole chain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

from aiohttp import web

from proxy.protocol.errors import CommandError
from proxy.protocol.options import ConfigError, parse_listen, parsed
from proxy.serving import workers
from proxy.serving.config import ServeConfig, add_arguments, resolve
from proxy.serving.listener import Limits, Listener
from proxy.serving.serve import run_loop, start, stop_on_signals
from proxy.util import logs


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = resolve(args)
    except ConfigError as e:
        raise CommandError(str(e)) from e
    logs.configure(config.log_level, config.log_format)
    if config.workers > 1:
        return workers.run(config)

    async def main() -> None:
        running = await start(config)
        stop = stop_on_signals()
        scheme = "https" if config.tls_cert else "http"
        print(f"tufproxy serving on {scheme}://{config.listen[0]}:{running.port}/simple/ ({running.layout})", flush=True)
        try:
            await stop.wait()
        finally:
            await running.stop()

    run_loop(main(), config.uvloop)
    return 0


DEMO_DISTS: tuple[tuple[str, str, list[str]], ...] = (
    # (name, version, requires): a dependency chain pip must resolve through the proxy.
    ("demo-app", "1.0", ["demo-lib>=1.0"]),
    ("demo-lib", "1.0", ["demo-base"]),
    ("demo-lib", "1.1", ["demo-base"]),
    ("demo-base", "2.0", []),
)


def _demo_repository(directory: Path, dists: Path | None) -> Path:
    """Create (or reuse and refresh) the demo's signed repository."""
    from proxy.repository import Repository, RepositoryError
    from proxy.repository.sample import build_sdist, build_wheel

    repo_dir = directory / "repo"
    try:
        if (repo_dir / "repository.json").exists():
            repo = Repository.open(repo_dir)
            repo.refresh()
            print(f"reusing signed repository {repo_dir}")
        else:
            repo = Repository.init(repo_dir, bins=1024)
            print(f"created signed repository {repo_dir} (1024 bins)")
        if dists is not None:
            files = sorted(p for p in dists.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip")))
            if not files:
                raise CommandError(f"no wheels or sdists in {dists}")
        else:
            made = directory / "dists"
            files = [build_wheel(made, n, v, requires=r) for n, v, r in DEMO_DISTS]
            files.append(build_sdist(made, "demo-base", "2.0"))
        report = repo.add(files)
    except RepositoryError as e:
        raise CommandError(str(e)) from e
    print(f"signed {len(report.added)} new file(s), {len(report.unchanged)} already there")
    return repo_dir


def _cmd_demo(args: argparse.Namespace) -> int:
    try:
        listen = parsed("--listen", parse_listen, args.listen)
    except ConfigError as e:
        raise CommandError(str(e)) from e
    directory = Path(args.dir)
    repo_dir = _demo_repository(directory, Path(args.dists) if args.dists else None)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as opened:
            mirror = web.Application()
            mirror.router.add_static("/", repo_dir / "public", show_index=False)
            mirror_listener = Listener(mirror, Limits())
            port = await mirror_listener.start()
            opened.push_async_callback(mirror_listener.stop)
            await _demo(args, directory, repo_dir, listen, f"http://127.0.0.1:{port}/")

    asyncio.run(main())
    return 0


async def _demo(args: argparse.Namespace, directory: Path, repo_dir: Path, listen: tuple[str, int], mirror_url: str) -> None:
    config = ServeConfig(
        upstream=[mirror_url], root=repo_dir / "public/metadata/1.root.json",
        cache_dir=directory / "cache", listen=listen, refresh_interval=60.0, audit_log=directory / "audit.log",
    )
    running = await start(config)
    stop = stop_on_signals()
    index_url = f"http://{listen[0]}:{running.port}/simple/"
    first = DEMO_DISTS[0][0] if args.dists is None else "<project>"
    print(f"untrusted mirror: {mirror_url} (the signed tree in {repo_dir / 'public'})")
    print(f"tufproxy:         {index_url} (cache {directory / 'cache'}, audit log {directory / 'audit.log'})")
    venv = directory / "client"
    print("try, in another shell (in a virtual environment: a distribution's Python refuses pip outside one):")
    print(f"  python3 -m venv {venv} && . {venv}/bin/activate")
    print("  pip install uv    # for the uv line: uv is not in a new venv")
    print(f"  pip install --index-url {index_url} {first}")
    print(f"  uv pip install --index-url {index_url} {first}")
    print("Ctrl-C stops both.", flush=True)
    try:
        await stop.wait()
    finally:
        await running.stop()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy serve`` and ``tufproxy demo``."""
    p = subparsers.add_parser(
        "serve",
        description="Serve the Simple API (PEP 503/691) to pip and uv. Every page and file is "
        "verified against TUF metadata rooted in the pinned --root before it is cached or served. "
        "Settings come from flags, then TUFPROXY_* environment variables, then --config FILE (TOML).",
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_serve)

    p = subparsers.add_parser(
        "demo",
        description="Build (or reuse) a signed repository of real distributions in DIR, serve it as an "
        "untrusted mirror on a loopback port, start tufproxy in front of it, and print the pip line to try.",
    )
    p.add_argument("--dir", default="tufproxy-demo",
                   help="where the repository, cache and audit log go (default: ./tufproxy-demo)")
    p.add_argument("--dists", metavar="DIR", help="sign these wheels/sdists instead of the built-in sample set")
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="proxy address (default: 127.0.0.1:8080; port 0 picks one)",
    )
    p.set_defaults(func=_cmd_demo)
