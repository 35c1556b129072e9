"""``tufproxy mirror sync``: copy a verified selection of a TUF-signed index.

The sync is a TUF client like the proxy (the same :class:`TrustedClient`,
pinned to the operator's root): it takes one consistent snapshot of the
upstream, looks every page and file up in it, and writes only bytes that
match their signed length and hashes (:mod:`proxy.mirror.tree`).  Its
trusted metadata persists in ``DEST/.mirror/trust`` (bins included), so a
second sync refetches only roles whose version the snapshot moved, and
files already in the tree are not downloaded again: incremental and
resumable come from the same two facts.

Through a ``tufproxy gateway`` (``profile`` ``gateway``), a selected
project no signed page lists yet is published first by the edge's own miss
protocol (:class:`~proxy.serving.edge.MissProtocol`: ask the gateway, then
refresh until the timestamp it named), before anything is looked up, so
the sync still works from one snapshot.  Distribution and ``.metadata``
files are then not targets: each is fetched and verified against its entry
in the signed, verified project page (:mod:`proxy.trust.pagefiles`).

Phases: root pages and project pages (the selection needs them), then
every selected distribution and ``.metadata`` file, ``--jobs`` at a time,
then publication (metadata, timestamp last) and, with ``--resign-with``,
``Repository.add`` of the files into the site's own repository.

Incremental from the snapshot: the manifest of the last sync
(:mod:`proxy.mirror.manifest`, indexed on disk) records each target it
published, the role that signed it (a file through a page: the page's
role) and its signed description, and every role's version then.  The
next sync walks only the roles whose version moved (``TrustedClient.listed``
with ``only``), and re-checks only the projects with a target there that
is new, changed or gone, and those the last sync could not complete.
Every other project is left as it is, without a lookup, a download or a
re-hash, and without being read from the manifest: a sync of a few changed
projects costs about the same in a tree of 1,000 projects or 100,000, and a
bin re-signed with the same targets (PEP 458's daily expiry) costs its
metadata only.  A new delegation (a re-bin, another ``targets``), another
selection or layout, ``--resign-with`` or ``--full`` re-checks every
selected project.

Nothing already in DEST is trusted: a file the sync would reuse is
re-hashed against this run's trusted target (:meth:`MirrorTree.has`), and
re-signing takes only files verified in this run, copied out of DEST into
a private directory and re-hashed as they are copied, so the site's keys
sign exactly bytes this run's upstream metadata vouches for.  A copy in
DEST that does not match is a refusal like any other, and loses its names.

A refused artifact (signed metadata says other bytes, or its metadata
fails to verify) is not written, is recorded in the audit log, and stops
the sync before publication unless ``keep_going``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from packaging.utils import canonicalize_name
from tuf.api.metadata import Metadata

from proxy.mirror.lockfiles import check_locked
from proxy.mirror.manifest import Head, Manifest, Row, digest
from proxy.mirror.progress import Counts, Progress
from proxy.mirror.select import FileFilter, Wanted
from proxy.mirror.tree import MirrorTree, verify_root_chain
from proxy.protocol import index
from proxy.protocol.access import marked_private
from proxy.protocol.errors import (
    BadMetadata,
    Fault,
    RepositoryError,
    TrustError,
    UnknownTarget,
    UpstreamUnreachable,
)
from proxy.protocol.layout import (
    PageFormat,
    core_metadata_target,
    file_target,
    project_page_target,
    provenance_target,
    root_page_target,
)
from proxy.protocol.osv import ADVISORY_TARGET
from proxy.protocol.profiles import LayoutError, Profile, choose_profile, detect_profile
from proxy.repository import (
    ChangeReport,
    NotADistribution,
    Repository,
    inspect_distribution,
)
from proxy.repository import RepositoryError as SignerError
from proxy.serving.edge import MissProtocol
from proxy.storage.audit import AuditLog
from proxy.transport.credentials import OriginAuth
from proxy.transport.failover import Exhausted, failover
from proxy.transport.local import LocalFetcher
from proxy.transport.tls import client_context
from proxy.transport.upstream import AiohttpFetcher, DownloadError, Fetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient, VerifiedTarget
from proxy.trust.fetch import Observer, Want, fetch_verified
from proxy.trust.pagefiles import MAX_FILE_SIZE, file_urls, file_want
from proxy.util.locks import FetchLocks

# One snapshot per sync: a mid-sync refresh would mix two upstream states.
_ONE_SNAPSHOT = 10 * 365 * 86400.0
_ROOT_MAX_LENGTH = TrustConfig().root_max_length
T = TypeVar("T")
# A gateway publishing a cold project may fetch a big page from its index: no pip is waiting here.
_PUBLISH_DEADLINE = 60.0


class MirrorError(Exception):
    """The sync cannot proceed at all (bad root, unusable upstream metadata, signer refused)."""

    reason = "mirror-error"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class SyncOptions:
    """What ``tufproxy mirror sync`` was asked to do."""

    upstream: tuple[str, ...]  # http(s) base URLs, tried in order; or one local directory holding a signed tree
    root: Path  # the pinned upstream root.json
    dest: Path
    projects: tuple[Wanted, ...] = ()
    all_projects: bool = False
    filter: FileFilter = field(default_factory=FileFilter)
    jobs: int = 8
    keep_going: bool = False
    resign_with: Path | None = None
    audit_log: Path | None = None  # default: DEST/.mirror/audit.log
    max_file_size: int = MAX_FILE_SIZE
    metadata_path: str = "metadata/"
    # None: the layout the signed metadata has. ``gateway``: files through pages, unknown projects published on request.
    profile: Profile | None = None
    # Credentials taken out of ``upstream`` (or netrc's for its host), sent to that origin only; never printed.
    auth: OriginAuth = field(default_factory=OriginAuth, repr=False, compare=False)
    ca_bundle: Path | None = None  # a private CA the upstream's TLS is verified with
    full: bool = False  # re-check every selected project, not only those the snapshot says changed

    @property
    def selection(self) -> str:
        """What was asked for, as the manifest records it: another selection re-checks every project."""
        return repr((self.all_projects, sorted(self.projects, key=lambda w: w.project), self.filter))


@dataclass
class SyncResult:
    """What happened: counts, the snapshot published (None if nothing was), the re-sign report."""

    counts: Counts
    published_snapshot: int | None
    resigned: ChangeReport | None = None
    layout: str = ""  # the upstream's layout and how it was decided

    def exit_code(self, keep_going: bool) -> int:
        """0 only when the mirror is complete; refusals and unknown projects are excused by ``keep_going``."""
        c = self.counts
        if c.failed or self.published_snapshot is None:
            return 1
        return 0 if keep_going or not (c.refused or c.not_found) else 1


def _tls(options: SyncOptions) -> ssl.SSLContext | None:
    return client_context(options.ca_bundle) if options.ca_bundle is not None else None


def _upstream(options: SyncOptions) -> tuple[Fetcher, list[Mirror]]:
    """The fetcher and the mirrors, in order (every ``--upstream`` goes through the one failover loop)."""
    if all(re.match(r"https?://", u) for u in options.upstream):
        bases = [u if u.endswith("/") else f"{u}/" for u in options.upstream]
        fetcher: Fetcher = AiohttpFetcher(auth=options.auth, ssl_context=_tls(options))
    else:
        local = LocalFetcher(Path(options.upstream[0]))
        bases, fetcher = [local.base_url()], local
    mirrors = []
    for base in bases:
        meta = options.metadata_path if re.match(r"https?://", options.metadata_path) else f"{base}{options.metadata_path}"
        mirrors.append(Mirror(meta if meta.endswith("/") else f"{meta}/", base))
    return fetcher, mirrors


class _RefusedAt(Observer):
    """Which mirror URL told each lie, for the audit record."""

    def __init__(self) -> None:
        self.url: dict[int, str] = {}

    def refused(self, error: RepositoryError, url: str) -> None:
        self.url[id(error)] = url


@dataclass
class _Selected:
    """A project's page (its signed JSON target and contents) and the files of it the filter kept."""

    wanted: Wanted
    target: VerifiedTarget
    page: index.ProjectPage
    kept: list[index.DistFile]


@dataclass
class _Plan:
    """Which projects this sync re-checks, and what it leaves as the last sync published it.

    ``replaced``: the projects whose manifest rows this sync replaces (None: every row, a full sync);
    ``kept``: projects and targets left as they are; ``published``: each role's version the last sync
    published (its metadata is not read again).
    """

    check: list[Wanted]
    replaced: set[str] | None
    kept: tuple[int, int] = (0, 0)
    published: dict[str, int] = field(default_factory=dict)


class _Sync:
    def __init__(self, options: SyncOptions, progress: Progress, tree: MirrorTree, trust: TrustedClient,
                 fetcher: Fetcher, audit: AuditLog, mirrors: list[Mirror]) -> None:
        self.options = options
        assert options.profile is not None  # decided by _layout
        self.profile: Profile = options.profile
        self.progress = progress
        self.tree = tree
        self.trust = trust
        self.fetcher = fetcher
        self.audit = audit
        self.mirrors = mirrors
        self.limit = asyncio.Semaphore(options.jobs)
        self.stopped = False  # a refusal without keep_going: schedule nothing new
        self.mirrored: list[Want] = []  # every target (or page-covered file) now in the tree, for plain names
        self.may_leave: set[str] = set()  # with --all: projects re-checked because targets of theirs left the bins

    def _refuse(self, path: str, error: TrustError, url: str | None = None, where: str = "") -> None:
        detail = f"{where}{error}"
        self.audit.refused(component="mirror-sync", reason=error.reason, target=path, role=error.role,
                           expected=error.expected, actual=error.actual, upstream_url=url, detail=detail)
        self.progress.refused(path, f"{error.reason}: {detail}")
        if not self.options.keep_going:
            self.stopped = True

    def refuse_altered(self, target: Want, error: RepositoryError) -> None:
        """The copy of ``target`` in DEST is not what this run's metadata signs (altered or rotted): the next
        sync re-checks every project (the manifest no longer says what DEST holds)."""
        self.tree.manifest.forget()
        self._refuse(target.path, error, where=f"the copy in {self.options.dest} is not the signed target, removed: ")

    def read_page(self, target: VerifiedTarget) -> bytes | None:
        """A page's bytes from the tree, re-verified; None (refused) when DEST altered them."""
        want = Want.of(target)
        try:
            return self.tree.read(want)
        except RepositoryError as e:
            self.refuse_altered(want, e)
            self.mirrored.remove(want)
            return None

    async def lookup(self, path: str, required: bool = True) -> VerifiedTarget | None:
        """The signed description of ``path``, or None (reported) if there is none to use."""
        try:
            return await self.trust.get_target(path)
        except UnknownTarget:
            if required:
                self._refuse(path, UnknownTarget(path))
            return None
        except RepositoryError as e:
            self._refuse(path, e)
        except TrustError as e:
            self.progress.failed(path, str(e))
        return None

    async def fetch(self, target: Want, urls: list[str]) -> bool:
        """Put ``target`` in the tree (unless it is there) from ``urls``; True when it is there now."""
        async with self.limit:
            if self.stopped:
                return False
            if target.exact and target.length > self.options.max_file_size:
                self.progress.failed(target.path, f"{target.length} bytes is over the size limit")
                return False
            try:
                present = await asyncio.to_thread(self.tree.has, target)
            except RepositoryError as e:
                self.refuse_altered(target, e)
                if self.stopped:
                    return False
                present = False  # --keep-going: fetch it afresh
            if present:
                self.progress.present(target.length if target.exact else 0)
                self.mirrored.append(target)
                return True
            refused = _RefusedAt()
            try:
                written = await self.tree.download(target, lambda sink: fetch_verified(
                    self.fetcher, target, urls, sink, observer=refused))
            except RepositoryError as e:
                self._refuse(target.path, e, refused.url.get(id(e)))
                return False
            except TrustError as e:
                self.progress.failed(target.path, str(e))
                return False
            self.progress.fetched(target.path, written)
            self.mirrored.append(target)
            return True

    async def advisories(self) -> None:
        """The gateway's signed advisory store, when the repository signs one (``mirror verify`` reads it)."""
        target = await self.lookup(ADVISORY_TARGET, required=False)
        if target is not None:
            await self.fetch(Want.of(target), self.trust.target_urls(target))

    async def page(self, path: str, required: bool) -> VerifiedTarget | None:
        target = await self.lookup(path, required)
        if target is None or not await self.fetch(Want.of(target), self.trust.target_urls(target)):
            return None
        return target

    async def project(self, wanted: Wanted) -> _Selected | None:
        """Fetch a project's pages; the files its filter keeps."""
        json_path = project_page_target(wanted.project, PageFormat.JSON)
        try:
            await self.trust.get_target(json_path)
        except UnknownTarget:
            if wanted.project not in self.may_leave:
                self.progress.not_found(wanted.project)
            return None
        except TrustError:
            pass  # reported by the lookup below
        # The formats the layout signs, JSON first (a gateway signs no HTML page: none is looked up in its bin).
        found = await asyncio.gather(*(self.page(project_page_target(wanted.project, f), f is PageFormat.JSON)
                                       for f in self.profile.signed_formats))
        signed = found[0]
        data = None if signed is None else self.read_page(signed)
        if signed is None or data is None:
            return None
        try:
            page = index.parse_project_json(data, wanted.project)
        except index.IndexParseError as e:
            self.progress.failed(json_path, f"signed page does not parse: {e}")
            return None
        if not wanted.locked:
            return _Selected(wanted, signed, page, [d for d in page.files if self.options.filter.keeps(d, wanted)])
        # Exactly the locked files, each with the hash its lock gives: a disagreement fails the sync, naming it.
        kept, problems = check_locked(wanted.project, wanted.locked, page.files)
        for problem in problems:
            self.progress.failed(wanted.project, problem)
        return _Selected(wanted, signed, page, kept)

    async def published(self, wanted: list[Wanted]) -> list[Wanted]:
        """Through a gateway: have it publish each project no signed page lists yet (the miss protocol).

        The projects to go on with; one the gateway refused (not listed by
        its index, denied by its policy, the index unreachable) is reported
        here and left out.  Only then is anything looked up or fetched, so
        the whole sync works from the snapshot the last publish reached.
        """
        if not self.profile.miss_protocol or not wanted or not re.match(r"https?://", self.mirrors[0].targets_url):
            return wanted  # a synced tree on disk has no gateway to ask: what it lacks is not found
        protocol = MissProtocol([m.targets_url for m in self.mirrors], self.trust, FetchLocks(self.tree.state / "locks"),
                                _PUBLISH_DEADLINE, auth=self.options.auth, ssl_context=_tls(self.options))
        asking = asyncio.Semaphore(self.options.jobs)

        async def one(w: Wanted) -> Wanted | None:
            path = project_page_target(w.project, PageFormat.JSON)
            try:
                await self.trust.get_target(path)
                return w
            except UnknownTarget:
                pass
            except TrustError:
                return w  # reported by the lookups that follow
            async with asking:
                try:
                    await protocol.on_miss(w.project)
                except UnknownTarget as e:
                    self.progress.not_found(w.project, e.detail)
                    return None
                except RepositoryError as e:
                    self._refuse(path, e)
                    return None
                except TrustError as e:
                    self.progress.failed(w.project, f"the gateway did not publish it: {e}")
                    return None
            return w

        try:
            return [w for w in await asyncio.gather(*(one(w) for w in wanted)) if w is not None]
        finally:
            await protocol.close()

    async def plan(self, given: list[Wanted]) -> _Plan:
        """The projects to check (see the module docstring): with a manifest the last sync left and the same
        delegations, only those with a signed target that changed (or that it could not complete), found by
        walking only the roles whose version moved; otherwise every selected project."""
        root_pages = None
        if self.profile.root_list_signed:  # served by the tree whatever is selected; signed in every format
            found = await asyncio.gather(*(self.page(root_page_target(f), f is PageFormat.JSON) for f in PageFormat))
            root_pages = dict(zip(PageFormat, found, strict=True))
        manifest = self.tree.manifest
        published = manifest.roles()
        moved = _moved_roles(manifest, published, self.options, self.trust.snapshot_versions())
        if moved is None:
            return _Plan(await self.wanted(given, root_pages), None)
        changed, private = await self.changed(moved)
        changed |= manifest.recheck()
        if self.options.all_projects:
            self.may_leave = changed
            specs = {w.project: w for w in given}
            check = [specs.get(p, Wanted(p)) for p in sorted(changed - private)]
        else:
            known = manifest.known([w.project for w in given])
            check = [w for w in given if w.project in changed or w.project not in known]
        replaced = changed | {w.project for w in check}
        return _Plan(check, replaced, manifest.totals(excluding=replaced), published)

    async def changed(self, moved: set[str]) -> tuple[set[str], set[str]]:
        """The projects with a target signed by a role of ``moved`` that is not what the manifest recorded
        (new, changed or gone), and those of them whose page is marked private."""
        now = {t.path: t for _, t in await self.listed(_every, only=moved) if t.role in moved}
        then = {r.path: r for r in self.tree.manifest.signed_by(moved) if r.signed}
        changed = {r.project for path, r in then.items() if path not in now}
        changed.update(p for path, t in now.items() if (p := self._project_of(path)) is not None
                       and (path not in then or then[path].digest != digest(t.length, t.hashes)))
        private = {p for path, t in now.items() if marked_private(t.custom) and (p := self.profile.page_project(path))}
        changed.discard("")
        return changed, private

    async def listed(self, keep: Callable[[str], T | None], only: set[str] | None = None) -> list[tuple[T, VerifiedTarget]]:
        """The targets of the verified bins (:meth:`TrustedClient.listed`); a bin that cannot be trusted stops
        the sync (audited when the upstream lied)."""
        try:
            return await self.trust.listed(keep, only)
        except RepositoryError as e:
            self.audit.refused(component="mirror-sync", reason=e.reason, role=e.role, expected=e.expected,
                               actual=e.actual, upstream_url=self.mirrors[0].metadata_url, detail=str(e))
            raise MirrorError(f"the upstream's bins cannot be listed ({e.reason}): {e}") from e
        except TrustError as e:
            raise MirrorError(f"the upstream's bins cannot be listed: {e}") from e

    def _project_of(self, path: str) -> str | None:
        """The project a target path belongs to, or None (a root list, the advisories)."""
        return _project_of(path) or self.profile.page_project(path)

    def rows(self) -> list[Row]:
        """The manifest rows of what this run put in the tree."""
        rows = {}
        for t in self.mirrored:
            signed = t.role is not None and " " not in t.role  # else a file its page vouches for
            rows[t.path] = Row(t.path, self._project_of(t.path) or "", _signer_of(t), digest(t.length, t.hashes), signed)
        return list(rows.values())

    def incomplete(self) -> set[str]:
        """Projects this run refused, failed or did not find something of: the next sync re-checks them."""
        c = self.progress.counts
        return {p for name in (*c.refused, *c.failed, *c.not_found)
                if (p := self._project_of(name) or ("/" not in name and canonicalize_name(name)))}

    async def wanted(self, given: list[Wanted],
                     root_pages: dict[PageFormat, VerifiedTarget | None] | None) -> list[Wanted]:
        """Every project to check in a full sync: ``given``, or every project of the (verified) root list, or
        where none is signed (the gateway's layout) every public project whose page the verified bins hold."""
        if not self.options.all_projects:
            return given
        if root_pages is None:
            listed = await self.listed(self.profile.page_project)
            names = [project for project, target in listed if not marked_private(target.custom)]
        else:
            json_list = root_pages[PageFormat.JSON]
            data = None if json_list is None else self.read_page(json_list)
            if data is None:
                raise MirrorError("the root project list could not be mirrored: --all needs it")
            try:
                names = list(index.parse_project_list_json(data).projects)
            except index.IndexParseError as e:
                raise MirrorError(f"the signed root project list does not parse: {e}") from e
        specs = {w.project: w for w in given}
        return [specs.get(canonicalize_name(p), Wanted(canonicalize_name(p))) for p in names]

    async def files(self, selected: list[_Selected]) -> None:
        """Look up and fetch every kept file and its ``.metadata``."""
        wanted = []  # (path, its project, its page entry, core metadata?, a required target?)
        for s in selected:
            for dist in s.kept:
                wanted.append((file_target(s.wanted.project, dist.filename), s, dist, False, True))
                if dist.core_metadata:
                    wanted.append((core_metadata_target(s.wanted.project, dist.filename), s, dist, True, False))
        if self.profile.files_are_targets:
            found = await asyncio.gather(*(self.lookup(path, req) for path, _, _, _, req in wanted))
            items = [(Want.of(t), self.trust.target_urls(t)) for t in found if t is not None]
        else:
            items = [i for i in (self.through_page(path, s, dist, core) for path, s, dist, core, _ in wanted)
                     if i is not None]
            # PEP 740: each kept file's provenance object the signed page names is a signed target of its own.
            proofs = [provenance_target(s.wanted.project, d.filename) for s in selected for d in s.kept if d.provenance]
            items += [(Want.of(t), self.trust.target_urls(t)) for t in await asyncio.gather(*map(self.lookup, proofs))
                      if t is not None]
        self.progress.planned(self.progress.counts.files + len(items),
                              sum(t.length for t in self.mirrored if t.exact) + sum(t.length for t, _ in items if t.exact))
        await asyncio.gather(*(self.fetch(t, urls) for t, urls in items))

    def through_page(self, path: str, s: _Selected, dist: index.DistFile, core: bool) -> tuple[Want, list[str]] | None:
        """What a file the signed page vouches for must be, and its URLs.

        None (refused) when the entry vouches for nothing usable.
        """
        try:
            want = file_want(path, s.target, dist, core=core, max_file_size=self.options.max_file_size)
            return want, file_urls(
                path, self.trust.target_urls(s.target), dist, core=core, origins=tuple(m.targets_url for m in self.trust.mirrors)
            )
        except RepositoryError as e:
            self._refuse(path, e)
            return None

    async def _root(self, name: str) -> bytes:
        """``name`` from the first mirror that answers (the one failover loop); its signatures are checked by
        :func:`verify_root_chain`."""
        try:
            return await failover([m.metadata(name) for m in self.mirrors],
                                  lambda _i, url: self.fetcher.fetch_bytes(url, _ROOT_MAX_LENGTH))
        except Exhausted as e:
            raise UpstreamUnreachable(name, e.tried.failures) from None

    async def root_chain(self) -> list[bytes]:
        """The verified roots from the pinned one to the one the sync trusts now (each read from the tree, else
        from the first mirror that has it)."""
        pinned = self.options.root.read_bytes()
        latest = (self.tree.trust_dir / "root.json").read_bytes()
        first, last = Metadata.from_bytes(pinned).signed.version, Metadata.from_bytes(latest).signed.version
        versions = []
        for v in range(first + 1, last + 1):
            data = self.tree.published_root(v)
            if data is None:
                data = await self._root(f"{v}.root.json")
            versions.append(data)
        chain = verify_root_chain(pinned, versions)
        if chain[-1] != latest:
            raise BadMetadata("the root chain from the pinned root does not end at the trusted root", role="root")
        return chain


def _project_of(path: str) -> str | None:
    """The project a target path belongs to (``simple/P/...``, ``packages/P/...``), or None (the root list)."""
    parts = path.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] in ("simple", "packages") else None


def _signer_of(want: Want) -> str:
    """The role a manifest records for ``want``: the one that signed it, or the one that signed its page."""
    return (want.role or "").split(" ", 1)[0]


def _every(path: str) -> str:
    return path


def _moved_roles(manifest: Manifest, then: dict[str, int], options: SyncOptions, now: dict[str, int]) -> set[str] | None:
    """The roles whose version moved since the last sync published them at ``then``, or None when every
    selected project must be re-checked: no manifest, another selection or layout, ``--full`` or
    ``--resign-with``, or the delegations above the bins moved (a re-bin moves every target)."""
    assert options.profile is not None
    head = manifest.head()
    # Re-signing takes only files verified in this run: with --resign-with every selected project is re-checked.
    if options.full or options.resign_with is not None or head is None or head.profile != options.profile.name \
            or head.selection != options.selection:
        return None
    if any(then.get(role) != now.get(role) for role in {"targets", options.profile.bin_delegator}):
        return None
    return {role for role, version in now.items() if then.get(role) != version} | (then.keys() - now.keys())


def _resign(repo_dir: Path, run: _Sync, selected: list[_Selected]) -> ChangeReport | None:
    """Publish the distributions verified in this run under the site's keys; propagate yanks (PEP 592).

    Each file is copied out of DEST into a private directory of the site
    repository, re-hashed against this run's trusted target as it is copied,
    and only that copy is signed.  A file refused, failed or not verified
    in this run is never signed from whatever DEST holds under its name.
    None (nothing signed) when a copy is refused and not ``keep_going``.
    """
    try:
        repo = Repository.open(repo_dir)
    except SignerError as e:
        raise MirrorError(str(e)) from e
    verified = {t.path: t for t in run.mirrored}
    unchanged: list[str] = []
    try:
        with tempfile.TemporaryDirectory(dir=repo_dir, prefix=".resign-") as staging:
            files = []
            for s, site in ((s, _site_files(repo, s.wanted.project)) for s in selected):
                for dist in s.kept:
                    target = verified.get(file_target(s.wanted.project, dist.filename))
                    if target is None:
                        continue  # refused or failed in this run: reported already
                    signed = site.get(dist.filename)
                    if signed is not None and signed.hashes.get("sha256") == target.hashes.get("sha256", ""):
                        unchanged.append(dist.filename)  # the site signed these very bytes already
                        continue
                    copy = Path(staging) / dist.filename
                    try:
                        run.tree.copy_verified(target, copy)
                        inspect_distribution(copy)
                    except RepositoryError as e:
                        run.refuse_altered(target, e)
                        continue
                    except (OSError, NotADistribution) as e:
                        run.progress.failed(dist.filename, f"cannot re-sign: {e}")
                        continue
                    files.append(copy)
            if run.stopped:
                return None
            added = repo.add(files)
        added.unchanged += unchanged
        for s in selected:
            site = _site_files(repo, s.wanted.project)
            for dist in s.kept:
                if dist.yanked and dist.filename in site and not site[dist.filename].yanked:
                    yank = repo.remove(dist.filename, reason=dist.yanked if isinstance(dist.yanked, str) else None)
                    added.yanked += yank.yanked
                    added.signed.update(yank.signed)
    except SignerError as e:
        raise MirrorError(f"re-signing into {repo_dir} failed: {e}") from e
    return added


def _site_files(repo: Repository, project: str) -> dict[str, index.DistFile]:
    """The files the site repository's page of ``project`` lists, by name."""
    page = repo.public_dir / project_page_target(project, PageFormat.JSON)
    if not page.exists():
        return {}
    return {f.filename: f for f in index.parse_project_json(page.read_bytes(), project).files}


def _layout(options: SyncOptions, trust: TrustedClient) -> tuple[SyncOptions, str]:
    """``options`` with the upstream's layout read from its verified targets (or the one insisted on, if they
    agree), and how it was decided."""
    targets = trust.verified_targets
    assert targets is not None  # a refresh verified
    try:
        profile = choose_profile(detect_profile(targets), options.profile)
    except LayoutError as e:
        raise MirrorError(str(e)) from None
    if PageFormat.JSON not in profile.signed_formats:
        raise MirrorError(f"the {profile.name} layout signs no JSON page: it cannot be mirrored")
    how = "given" if options.profile is not None else "detected from the signed metadata"
    return replace(options, profile=profile), f"layout {profile.name} ({how})"


async def sync(options: SyncOptions, progress: Progress) -> SyncResult:
    """Run one sync; see the module docstring.  Raises :class:`MirrorError` when it cannot start."""
    if options.jobs < 1:
        raise MirrorError("--jobs must be at least 1")
    if not options.all_projects and not options.projects:
        raise MirrorError("nothing selected: give --project, --requirements, --from or --all")
    try:
        pinned = options.root.read_bytes()
    except OSError as e:
        raise MirrorError(f"cannot read the pinned root {options.root}: {e.strerror}") from e
    tree = MirrorTree(options.dest)
    fetcher, mirrors = _upstream(options)
    audit = AuditLog(options.audit_log or tree.state / "audit.log")
    trust: TrustedClient | None = None
    try:
        if not (tree.trust_dir / "root.json").exists():
            try:
                TrustedClient.initialize(tree.trust_dir, pinned)
            except TrustError as e:
                raise MirrorError(f"{options.root} is not a valid self-signed root: {e}") from e
        try:
            trust = TrustedClient(
                tree.trust_dir, mirrors, fetcher, TrustConfig(refresh_interval=_ONE_SNAPSHOT, persist_bins=True)
            )
            await trust.refresh(force=True)
        except RepositoryError as e:
            audit.refused(
                component="mirror-sync",
                reason=e.reason,
                role=e.role,
                expected=e.expected,
                actual=e.actual,
                upstream_url=mirrors[0].metadata_url,
                detail=str(e),
            )
            raise MirrorError(f"upstream metadata refused ({e.reason}): {e}") from e
        except TrustError as e:
            raise MirrorError(f"cannot load upstream metadata: {e}") from e
        options, layout = _layout(options, trust)
        run = _Sync(options, progress, tree, trust, fetcher, audit, mirrors)
        plan = await run.plan(await run.published(list(options.projects)))
        projects = await asyncio.gather(*(run.project(w) for w in plan.check))
        selected = [s for s in projects if s is not None]
        progress.counts.projects = len(selected) + plan.kept[0]
        progress.unchanged(plan.kept[1])
        await run.files(selected)
        await run.advisories()
        result = SyncResult(progress.counts, None, layout=layout)
        c = progress.counts
        if run.stopped or ((c.refused or c.failed) and not options.keep_going):
            return result
        try:
            chain = await run.root_chain()
        except (TrustError, DownloadError) as e:
            raise MirrorError(f"cannot publish the root chain: {e}") from e
        result.published_snapshot = await asyncio.to_thread(tree.publish_metadata, chain, plan.published)
        for target in run.mirrored:
            tree.link_plain(target)
        head = Head(result.published_snapshot, run.profile.name, options.selection)
        await asyncio.to_thread(tree.manifest.record, head, trust.snapshot_versions(), run.rows(),
                                replaced=plan.replaced, recheck=run.incomplete())
        if options.resign_with is not None:
            result.resigned = await asyncio.to_thread(_resign, options.resign_with, run, selected)
        return result
    finally:
        if trust is not None:
            trust.close()
        tree.manifest.close()
        with contextlib.suppress(Exception):
            await fetcher.close()
        audit.close()
