"""Issue 37: incremental garbage collection under concurrent publishes and edge reads.

Nothing that a current or grace-period snapshot references is ever deleted; what none references is.

A real gateway (``gateway serve`` with a ``--gc-grace`` of a few seconds, a short ``--page-ttl``, and an
online lifetime short enough that it re-signs, and so collects, every ~2 s) sits in front of a test index
whose projects keep gaining releases: it keeps publishing new page versions, superseding old ones, and
collecting.  The rule checked: a timestamp read at ``t`` was current at ``t`` or later, so it was superseded
no earlier, and every file it references (its snapshot, targets, bins, every bin-n under its consistent
``N.role.json`` name, every page the bins name under its hashed name) must still be served until
``t + GRACE``.  Readers take the timestamp over the gateway's HTTP and fetch what it references over HTTP
too, checked as a TUF client would (signatures from the pinned root down, versions, lengths, hashes); a
file asked for later than ``JUDGED`` after its timestamp was read is not judged (the margin is for the
reader's own lateness).  The watch of the slow reader below reads the gateway's public directory on disk
instead, which is what the gateway serves those paths from.

1. Churn: a release every time the gateway has signed the previous one, round the projects.  Readers take
   the timestamp every half second and check what it references after holding it 0 s, half or all of
   ``HOLD``; an edge keeps serving the projects' pages; pip installs through the edge.
2. A slow reader after a quiet spell: it takes a timestamp whose snapshot has been current for ``QUIET``
   seconds, one project gets two releases in a row (that snapshot and the project's bin superseded twice),
   and everything the timestamp references must stay on disk for ``HOLD`` and then be served, sound.
3. Collection is on: the superseded pages go, and all but a few versions of each metadata role; the edge
   serves the newest releases; ``tufproxy mirror verify`` finds the gateway's signed tree sound.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tuf.api.exceptions import LengthOrHashMismatchError, UnsignedMetadataError
from tuf.api.metadata import Metadata, Root, Snapshot, Targets, Timestamp

from proxy.cli import main
from proxy.protocol.layout import consistent_name
from proxy.repository.sample import build_wheel
from tests.support.clients import install
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

GRACE = 5.0  # --gc-grace
HOLD = GRACE - 0.5  # the longest a reader holds a timestamp before fetching what it references
JUDGED = GRACE - 0.25  # a file asked for at most this long after its timestamp was read must be served
HOLDS = (HOLD, HOLD, HOLD / 2, 0.0)  # cycled over the timestamps the churn readers take
# How long the slow reader's snapshot has been current when it takes its timestamp: longer than a collection
# interval and a half, so a collector that dated a version by its own writing rather than by its supersede
# would delete it within the hold, every run (the two releases take under a second; a collection follows
# within COLLECT_EVERY).
QUIET = 3.5
ONLINE_EXPIRY = "0.0002"  # days (17.28 s): re-signed, and collected, every eighth of it
COLLECT_EVERY = 17.28 / 8
PROJECTS = ("alpha", "beta", "gamma", "delta")
RELEASES = 20  # releases published during the churn (about two a second)
VERSIONED = re.compile(r"([0-9]+)\.(.+)\.json")


@dataclass
class Reads:
    """What the readers saw, shared between their threads (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    problems: list[str] = field(default_factory=list)
    snapshots: list[int] = field(default_factory=list)  # snapshot versions of the timestamps taken, in order
    held: int = 0  # checks after a hold of HOLD of a timestamp superseded twice by then
    judged: int = 0  # files asked for within JUDGED of their timestamp's read
    late: int = 0  # files asked for after that (not judged)
    pages: set[str] = field(default_factory=set)  # hashed page paths (under public/) served and sound

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


class Connection:
    """One keep-alive HTTP connection to the gateway: (status, body) of a GET."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> tuple[int, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
            try:
                self.conn.request("GET", path)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None  # the server closed an idle keep-alive connection: once more, on a new one
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def take_timestamp(conn: Connection, root: Metadata[Root]) -> tuple[float, Metadata[Timestamp]]:
    """(monotonic time the request was sent, the gateway's current timestamp, verified)."""
    read_at = time.monotonic()
    status, body = conn.get("/metadata/timestamp.json")
    assert status == 200, status
    timestamp: Metadata[Timestamp] = Metadata.from_bytes(body)
    root.verify_delegate(Timestamp.type, timestamp)
    return read_at, timestamp


def check_closure(port: int, root: Metadata[Root], timestamp: Metadata[Timestamp], read_at: float, reads: Reads,
                  referenced: set[str] | None = None) -> None:
    """Fetch and verify everything ``timestamp`` (read at monotonic ``read_at``) references, noting problems in
    ``reads``; the paths (under public/) go into ``referenced``."""
    conn = Connection(port)
    where = f"timestamp v{timestamp.signed.version} (snapshot v{timestamp.signed.snapshot_meta.version})"

    def fetch(path: str) -> bytes | None:
        if referenced is not None:
            referenced.add(path.lstrip("/"))
        asked = time.monotonic() - read_at
        status, body = conn.get(path)
        judged = asked <= JUDGED
        with reads.lock:
            if judged:
                reads.judged += 1
            else:
                reads.late += 1
        if status == 200:
            return body
        if judged:
            reads.problem(f"{path}: {status}, asked {asked:.2f}s after {where} was read (grace {GRACE:g}s)")
        return None

    def role(name: str, delegator: Metadata[Any], meta: Any) -> Metadata[Any] | None:
        path = f"/metadata/{meta.version}.{name}.json"
        body = fetch(path)
        if body is None:
            return None
        try:
            meta.verify_length_and_hashes(body)
            md: Metadata[Any] = Metadata.from_bytes(body)
            delegator.verify_delegate(name, md)
        except (LengthOrHashMismatchError, UnsignedMetadataError) as e:
            reads.problem(f"{path} (of {where}) is not what it should be: {e}")
            return None
        if md.signed.version != meta.version:
            reads.problem(f"{path} (of {where}) says version {md.signed.version}")
            return None
        return md

    try:
        snapshot = role(Snapshot.type, root, timestamp.signed.snapshot_meta)
        if snapshot is None:
            return
        meta = snapshot.signed.meta
        targets = role(Targets.type, root, meta["targets.json"])
        bins = role("bins", targets, meta["bins.json"]) if targets is not None else None
        if bins is None:
            return
        for name in sorted(n.removesuffix(".json") for n in meta if n.startswith("bin-")):
            bin_n = role(name, bins, meta[f"{name}.json"])
            if bin_n is None:
                continue
            for target_path, target in bin_n.signed.targets.items():
                for digest in target.hashes.values():
                    served = consistent_name(target_path, digest)
                    body = fetch(f"/{served}")
                    if body is None:
                        continue
                    try:
                        target.verify_length_and_hashes(body)
                    except LengthOrHashMismatchError as e:
                        reads.problem(f"/{served} (of {where}) does not match its bin: {e}")
                        continue
                    with reads.lock:
                        reads.pages.add(served)
    finally:
        conn.close()


def read_timestamps(gw: GatewayProcess, root: Metadata[Root], reads: Reads, stop: threading.Event,
                    checks: list[threading.Thread]) -> None:
    """Every half second: take the current timestamp, and check what it references after one of HOLDS."""
    conn = Connection(gw.port)
    n = 0
    try:
        while not stop.is_set():
            try:
                read_at, timestamp = take_timestamp(conn, root)
            except Exception as e:
                reads.problem(f"/metadata/timestamp.json: {type(e).__name__}: {e}")
            else:
                with reads.lock:
                    reads.snapshots.append(timestamp.signed.snapshot_meta.version)
                hold = HOLDS[n % len(HOLDS)]
                n += 1
                check = threading.Thread(target=hold_then_check, args=(gw.port, root, timestamp, read_at, hold, reads))
                check.start()
                checks.append(check)
            stop.wait(0.5)  # pacing of the reads, not synchronisation
    finally:
        conn.close()


def hold_then_check(port: int, root: Metadata[Root], timestamp: Metadata[Timestamp], read_at: float, hold: float,
                    reads: Reads) -> None:
    # The hold is the scenario (a slow edge finishing its refresh), not synchronisation.
    time.sleep(max(0.0, read_at + hold - time.monotonic()))
    if hold == HOLD:
        with reads.lock:
            if len({v for v in reads.snapshots if v > timestamp.signed.snapshot_meta.version}) >= 2:
                reads.held += 1  # what it references is older than the newest superseded versions by now
    try:
        check_closure(port, root, timestamp, read_at, reads)
    except Exception as e:
        reads.problem(f"checking timestamp v{timestamp.signed.version}: {type(e).__name__}: {e}")


def read_edge(edge_url: str, reads: Reads, stop: threading.Event, rounds: list[int]) -> None:
    """The edge serves every project's page throughout (it verifies what it serves)."""
    while not stop.is_set():
        for project in PROJECTS:
            try:
                with urllib.request.urlopen(f"{edge_url}{project}/", timeout=20) as r:
                    if f"{project}-1.0-py3-none-any.whl".encode() not in r.read():
                        reads.problem(f"edge /simple/{project}/: a page without the project's first release")
            except urllib.error.HTTPError as e:
                reads.problem(f"edge /simple/{project}/: {e.code} {e.read()[:300]!r}")
        rounds[0] += 1
        stop.wait(0.2)  # pacing of the reads, not synchronisation


def leftovers(public: Path) -> tuple[list[str], dict[str, int]]:
    """(hashed pages no plain page names, roles with more than three versions on disk: how many)."""
    pages = []
    for project in PROJECTS:
        directory = public / "simple" / project
        keep = {f"{getattr(hashlib, a)((directory / plain).read_bytes()).hexdigest()}.{plain}"
                for plain in ("index.html", "index.json") if (directory / plain).exists() for a in ("sha256", "sha512")}
        pages += [f"simple/{project}/{p.name}" for p in directory.glob("*.index.*") if p.name not in keep]
    versions = Counter(m.group(2) for p in (public / "metadata").iterdir() if (m := VERSIONED.fullmatch(p.name)))
    # The current version, the newest superseded one, and one a re-sign may just have superseded.
    return sorted(pages), {role: n for role, n in versions.items() if n > 3 and role != "root"}


@pytest.mark.slow
def test_collection_never_deletes_what_a_current_or_grace_period_snapshot_references(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dists = tmp_path / "dists"
    test_index = TestIndex(separate_files_host=True)
    for project in PROJECTS:
        test_index.add(build_wheel(dists, project, "1.0"))
    gateway_init(tmp_path / "gw", "--online-expiry", ONLINE_EXPIRY)
    public = tmp_path / "gw" / "public"
    root: Metadata[Root] = Metadata.from_bytes((public / "metadata" / "1.root.json").read_bytes())
    reads = Reads()
    stop_reads, stop_edge = threading.Event(), threading.Event()
    checks: list[threading.Thread] = []
    edge_rounds = [0]
    released: list[str] = []
    newest = dict.fromkeys(PROJECTS, "1.0")

    def release(project: str, version: str) -> None:
        """The index gains ``project`` ``version``; wait until the gateway's refresh has signed it."""
        test_index.add(build_wheel(dists, project, version))
        page = public / "simple" / project / "index.json"
        filename = f"{project}-{version}-py3-none-any.whl".encode()
        wait_for(lambda: filename in page.read_bytes(), timeout=20, what=f"{project} {version} signed")
        released.append(f"{project}=={version}")
        newest[project] = version

    with test_index:
        gw = GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url,
                            "--gc-grace", str(GRACE), "--page-ttl", "0.4", "--refresh-rate", "50", "--batch-window", "0.05")
        with gw:
            for project in PROJECTS:
                assert gw.publish(project)[0] == 200
            with edge_for(tmp_path, gw) as edge:
                readers = [threading.Thread(target=read_timestamps, args=(gw, root, reads, stop_reads, checks))]
                edge_reader = threading.Thread(target=read_edge, args=(edge.url, reads, stop_edge, edge_rounds))
                try:
                    for t in [*readers, edge_reader]:
                        t.start()
                    # 1. Churn, with pip through the edge while the pages keep changing.
                    for n in range(RELEASES // 4):
                        release(PROJECTS[n % len(PROJECTS)], f"1.{n + 1}")
                    pip_result: list[Any] = []
                    pip = threading.Thread(target=lambda: pip_result.append(
                        install("pip", edge.url, tmp_path / "target", *PROJECTS)))
                    pip.start()
                    for n in range(RELEASES // 4, RELEASES):
                        release(PROJECTS[n % len(PROJECTS)], f"1.{n + 1}")
                    pip.join(120)
                    assert pip_result and not pip.is_alive(), "pip did not finish"
                    stop_reads.set()
                    for t in readers:
                        t.join(30)
                    for t in checks:
                        t.join(30)  # the holds end while the gateway goes quiet

                    # 2. A slow reader after a quiet spell; the watch reads the public directory the gateway serves.
                    conn = Connection(gw.port)

                    def quiet_timestamp() -> tuple[float, Metadata[Timestamp]] | None:
                        read_at, timestamp = take_timestamp(conn, root)
                        snapshot = public / "metadata" / f"{timestamp.signed.snapshot_meta.version}.snapshot.json"
                        return (read_at, timestamp) if time.time() - snapshot.stat().st_mtime >= QUIET else None

                    taken = wait_for(quiet_timestamp, timeout=QUIET + 15, interval=0.2, what="a snapshot current for a while")
                    assert taken is not None
                    read_at, held = taken
                    conn.close()
                    referenced: set[str] = set()
                    check_closure(gw.port, root, held, read_at, reads, referenced)  # all there now, sound
                    release("alpha", "2.0")
                    release("alpha", "2.1")  # alpha's bin and the snapshot are superseded twice since `held`

                    def missing_or_held_long_enough() -> list[str] | bool:
                        missing = sorted(p for p in referenced if not (public / p).exists())
                        return missing or time.monotonic() >= read_at + HOLD

                    missing = wait_for(missing_or_held_long_enough, timeout=HOLD + 5, what="the slow reader's hold")
                    if missing is not True:
                        reads.problem(
                            f"{time.monotonic() - read_at:.2f}s after a slow reader took timestamp v{held.signed.version} "
                            f"(snapshot v{held.signed.snapshot_meta.version}) and with {GRACE:g}s of grace, the gateway "
                            f"no longer has what it references: {missing}")
                    check_closure(gw.port, root, held, read_at, reads)
                    assert pip_result[0].returncode == 0, pip_result[0].stdout + pip_result[0].stderr
                    installed = {p.name.split("-")[0] for p in (tmp_path / "target").glob("*.dist-info")}
                    assert installed == set(PROJECTS), installed

                    # 3. What nothing current or within grace references goes; the edge follows.
                    wait_for(lambda: leftovers(public), timeout=2 * (GRACE + COLLECT_EVERY) + 5,
                             done=lambda left: not any(left), what="superseded pages and metadata collected")
                    gone = sorted(p for p in reads.pages if not (public / p).exists())
                    assert gone and Connection(gw.port).get(f"/{gone[0]}")[0] == 404, gone
                    wait_for(lambda: all(f"{p}-{v}-py3-none-any.whl".encode() in urllib.request.urlopen(
                        f"{edge.url}{p}/", timeout=20).read() for p, v in newest.items()), timeout=15,
                             what="the edge serves the newest releases")
                finally:
                    stop_reads.set()
                    stop_edge.set()
                    for t in [*readers, edge_reader, *checks]:
                        if t.ident is not None:
                            t.join(30)
            assert edge_rounds[0] >= 10, edge_rounds
    # The gateway's signed tree is sound: metadata and pages, and the files clients asked for (kept on demand,
    # checked against their pages; the others are not expected).
    capsys.readouterr()
    assert main(["mirror", "verify", str(public), "--root", str(gw.root), "--profile", "gateway", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metadata_error"] is None and not report["corrupt"] and report["targets"] >= 2 * len(PROJECTS), report
    assert report["missing"] == [], report["missing"]
    assert not [e for e in report["extra"] if not e.startswith("packages/")], report["extra"]
    print(f"{len(released)} releases; {len(reads.snapshots)} timestamps taken, {reads.held} held {HOLD:g}s past two "
          f"supersedes; {reads.judged} files judged, {reads.late} too late to judge; {len(gone)} of {len(reads.pages)} "
          f"pages read since collected")
    assert reads.held >= 3 and reads.judged >= 20 * reads.late, (reads.held, reads.judged, reads.late)
    assert not reads.problems, "\n".join(reads.problems[:40]) + f"\n({len(reads.problems)} problems)"
