"""A file host streaming junk toward 4 GiB, through a real warehouse-profile ``tufproxy serve``.

In the warehouse profile a signed HTML page gives a file's sha256 but no
size, so only a bound stops a hostile file host: ``--max-file-size`` (the
upstream lied: 502 ``length-mismatch``) or the space the download may
reserve against ``--cache-size`` (our resources: 503 ``cache-full``),
whichever comes first.  The upstream counts the bytes it got out; a thread
polls the cache directory's ``tmp/`` and ``blobs/`` while the junk flows.
Each case runs twice: streaming (the client already has a 200 and sees the
connection reset) and ``--verify-before-send yes`` (the client gets the
typed status).  Either way the refusal has its metric, the lie its audit
record, nothing is published, and the proxy goes on serving.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from proxy.repository import Repository
from tests.conftest import make_sample_dists
from tests.support.faults import Fault, FaultyUpstream, get
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import assert_cache_clean

MiB = 2**20


def _in_flight() -> int:
    """Bytes the upstream can count as sent that the proxy never read: the kernel's socket buffers
    (tcp_rmem's and tcp_wmem's maximum: the receive side autotunes up to 32 MiB on Linux), plus
    aiohttp's read buffer and the fetch's batches (proxy/trust/fetch.py)."""
    try:
        kernel = sum(int(Path(f"/proc/sys/net/ipv4/{n}").read_text().split()[2]) for n in ("tcp_rmem", "tcp_wmem"))
    except (OSError, IndexError, ValueError):
        kernel = 64 * MiB
    return kernel + 8 * MiB


SLACK = _in_flight()
JUNK = r"/packages/(app|lib)/.*\.whl"
# Asked for at once: three downloads of unsigned length share one cache budget.
WANTED = ("/packages/app/app-1.0-py3-none-any.whl", "/packages/lib/lib-1.0-py3-none-any.whl",
          "/packages/lib/lib-1.1-py3-none-any.whl")
NORMAL = "/packages/base/base-2.0-py3-none-any.whl"


@dataclass(frozen=True)
class Case:
    flags: tuple[str, ...]
    bound: int  # the most the download may take in
    cache_size: int
    status: int
    reason: str  # X-Tufproxy-Reason
    says: str  # how the body (and the status line) begins: proxy/serving/refusals.py's row
    kind: str
    audited: bool  # the table audits lies, not our resources (proxy/serving/refusals.py)


CASES = {
    "max-file-size": Case(("--max-file-size", "24M", "--cache-size", "96M"), 24 * MiB, 96 * MiB,
                          502, "length-mismatch",
                          "refused by TUF verification (length-mismatch)", "repository", True),
    # --max-file-size stays at its 4G default: only the reservation against the cache stops the junk.
    "cache-size": Case(("--cache-size", "40M"), 40 * MiB, 40 * MiB, 503, "cache-full",
                       "cache full, cannot store new files", "ours", False),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("junk")
    repo = Repository.init(tmp / "repo", bins=16, layout="warehouse")
    repo.add(make_sample_dists(tmp / "dists"))
    root = tmp / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with FaultyUpstream(repo.public_dir) as upstream:
        yield repo, root, upstream


class DiskWatch:
    """The most bytes ``tmp/`` plus ``blobs/`` ever held, polled from a thread until stopped."""

    def __init__(self, cache_dir: Path) -> None:
        self.dirs = (cache_dir / "tmp", cache_dir / "blobs")
        self.peak = 0
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.usage())
            self.polls += 1
            self._stop.wait(0.005)

    def usage(self) -> int:
        total = 0
        for d in self.dirs:
            for p in d.rglob("*"):
                try:
                    total += p.stat().st_size if p.is_file() else 0
                except FileNotFoundError:
                    pass  # published or removed between the listing and the look
        return total

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], bytes | None]:
    """Status, headers and body; body None when the transfer broke off."""
    async with session.get(url) as r:
        try:
            body: bytes | None = await r.read()
        except aiohttp.ClientPayloadError:
            body = None
        return r.status, {k.lower(): v for k, v in r.headers.items()}, body


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{want}}} in /metrics")


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "verify-before-send"])
@pytest.mark.parametrize("case_id", list(CASES))
async def test_junk_streams_are_cut_at_their_bound_within_the_reserved_space(world, tmp_path: Path, case_id: str,
                                                                            streaming: bool) -> None:
    repo, root, upstream = world
    case = CASES[case_id]
    send = () if streaming else ("--verify-before-send", "yes")
    upstream.sent.clear()
    upstream.inject(JUNK, Fault.ENDLESS)
    try:
        with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--profile",
                          "warehouse", "--workers", "1", *case.flags, *send) as proxy, \
                DiskWatch(proxy.cache_dir) as disk:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                loop = asyncio.get_running_loop()
                began = loop.time()
                junk = await asyncio.gather(*(fetch(s, proxy.base + p.lstrip("/")) for p in WANTED))
                seconds = loop.time() - began
                upstream.clear()
                # A temp file goes when its download ends; a streamed client may hear of the end first.
                deadline = loop.time() + 10
                while any((proxy.cache_dir / "tmp").iterdir()) and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                metrics = (await get(s, proxy.base + "metrics")).body.decode()
                honest = await asyncio.gather(*(get(s, proxy.base + p.lstrip("/")) for p in (*WANTED, NORMAL)))
            log = proxy.log()
    finally:
        upstream.clear()
    sent = {path: upstream.sent.get(path, 0) for path in WANTED}
    print(f"\n[junk {case_id}, {'streaming' if streaming else 'verify-before-send'}] "
          f"{sorted({(j[0], j[1].get('x-tufproxy-reason')) for j in junk})} after {seconds:.1f}s; upstream sent "
          f"{', '.join(f'{n / MiB:.1f}' for n in sent.values())} MiB (bound {case.bound / MiB:.0f} MiB + "
          f"{SLACK / MiB:.0f} in buffers); tmp/+blobs/ peak {disk.peak / MiB:.1f} MiB ({disk.polls} polls, "
          f"--cache-size {case.cache_size / MiB:.0f} MiB)")
    assert all(0 < n <= case.bound + SLACK for n in sent.values()), "the proxy read on past its bound"
    assert disk.peak <= case.cache_size and disk.polls > 10
    for status, headers, body in junk:
        if streaming:
            assert status == 200 and body is None, "a streamed junk body must break off, never end cleanly"
        else:
            assert (status, headers["x-tufproxy-reason"]) == (case.status, case.reason), (status, headers, body)
            assert body is not None and body.decode().startswith(case.says)
    assert metric(metrics, "tufproxy_refusals_total", kind=case.kind, reason=case.reason) == len(WANTED)
    records = [line for line in log.splitlines() if line.startswith("{") and '"refused"' in line]
    for path in WANTED:
        named = [r for r in records if case.reason in r and path.rsplit("/", 1)[1] in r]
        assert bool(named) == case.audited, log[-3000:]
    assert "Traceback" not in log
    assert_cache_clean(proxy.cache_dir, repo)  # nothing published but verified bytes, no temp file left
    for path, got in zip((*WANTED, NORMAL), honest, strict=True):
        assert got.status == 200 and got.body == (repo.public_dir / path.lstrip("/")).read_bytes()
