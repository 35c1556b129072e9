"""``tufproxy mirror verify``: is a tree on disk exactly what its metadata signs?

Run after carrying media across an air gap.  The tree's metadata is loaded
by the trust core from the tree itself (through :class:`LocalFetcher`,
exactly as ``tufproxy serve --repository`` would), rooted in a pinned
root; then every file is re-hashed against the target that names it or,
in a tree synced through a ``tufproxy gateway`` (whose files are not
targets), against its entry in the project's signed page, itself checked
against its target first (:mod:`proxy.trust.pagefiles`).  The layout is the
one the last sync recorded in its manifest, else ``profile``.

* **corrupt**: a file under a target's name whose length or hashes differ
  (or whose metadata fails to verify);
* **missing**: a target the tree should hold but whose download name is
  absent.  What it should hold is the last sync's manifest when there is
  one, else everything its signed pages list (a re-signed site tree), or
  in the gateway's layout, which keeps files on demand, its pages;
* **extra**: files no current target names (older page versions, strays):
  reported, harmless to clients, unsound only with ``strict``;
* **provenance**: each carried PEP 740 provenance object (a signed target
  beside its page) whose hash holds is verified again with Sigstore,
  offline, against its file's name and sha256 as the signed page gives
  them and the publisher its signed ``custom`` field names; one that fails
  makes the tree unsound (the gateway's verification is not taken on trust);
* **blocked**: files on the carried pages that the carried advisory store
  (a gateway's signed ``advisories/osv.json``, verified like any target)
  calls malicious or vulnerable: reported for people to act on (the tree
  is still what its metadata signs).

Memory does not follow the tree.  With a manifest (a synced tree), the
targets it records are checked a role at a time, each role's metadata
read once and dropped after; then each chunk of project directories is
walked for files under names no recorded target has.  Without one, the
projects the signed metadata lists are checked a few dozen at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from proxy.mirror.manifest import Manifest, hashes_of
from proxy.mirror.tree import STATE_DIR, check_file, target_names
from proxy.protocol import index
from proxy.protocol.errors import RepositoryError, TrustError, UnknownTarget
from proxy.protocol.layout import (
    METADATA_DIR,
    BadRequestPath,
    PageFormat,
    TargetKind,
    core_metadata_target,
    file_target,
    parse_request_path,
    project_page_target,
    provenance_of,
    root_page_target,
)
from proxy.protocol.model import ExpiryOverride
from proxy.protocol.osv import ADVISORY_TARGET, Block, RecordError, Rules, read_store
from proxy.protocol.profiles import TUFPROXY, Profile, get_profile
from proxy.transport.local import LocalFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient
from proxy.trust.fetch import Want
from proxy.trust.pagefiles import MAX_FILE_SIZE, file_want
from proxy.trust.provenance import SigstoreTrust

_HASH_NAME_RE = re.compile(r"^(?:[0-9a-f]{64}|[0-9a-f]{128})\.(.+)$")
_METADATA_NAME_RE = re.compile(r"^(?:[0-9]+\.)?[^/]+\.json$")
_ROLES_KEPT = 32  # delegated roles a check by role keeps in memory (the one it checks, and its delegators)
_PROJECTS = 64  # projects checked together; what is known of them is dropped after (bounded memory in any tree)


@dataclass
class VerifyReport:
    """The outcome of one verification."""

    checked: int = 0  # files on disk re-hashed (a target's hash-named copies and its plain name each count)
    targets: int = 0  # targets found and checked: the unit 'mirror sync' counts in
    metadata_error: str | None = None
    missing: list[str] = field(default_factory=list)
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)  # targets vouched for by expired metadata (override)
    blocked: list[Block] = field(default_factory=list)  # files the carried advisories name
    attested: int = 0  # provenance objects verified again with Sigstore
    provenance: list[tuple[str, str]] = field(default_factory=list)  # provenance objects that did not verify, why

    def sound(self, strict: bool = False) -> bool:
        return (self.metadata_error is None and not self.missing and not self.corrupt and not self.provenance
                and not (strict and self.extra))


def _target_of(name: str) -> str:
    """The target path a file name in the tree stands for (hash names map to their target)."""
    directory, _, base = name.rpartition("/")
    m = _HASH_NAME_RE.match(base)
    return f"{directory}/{m.group(1)}" if m and directory else name


def _default_root(directory: Path) -> Path:
    meta = directory / METADATA_DIR
    roots = sorted((int(p.name.split(".")[0]), p) for p in meta.glob("*.root.json") if p.name.split(".")[0].isdigit())
    if not roots:
        raise FileNotFoundError(f"no N.root.json in {meta}: give --root")
    return roots[0][1]


class _Verifier:
    def __init__(self, directory: Path, trust: TrustedClient, jobs: int, profile: Profile,
                 manifest: Manifest | None, sigstore: SigstoreTrust | None = None) -> None:
        self.directory = directory
        self.sigstore = sigstore
        self.trust = trust
        self.profile = profile
        self.manifest = manifest
        self.limit = asyncio.Semaphore(jobs)
        self.report = VerifyReport()
        # Memoised as futures: files of one project check their page concurrently, once.
        self._targets: dict[str, asyncio.Future[Want | str | None]] = {}
        self._checked: dict[str, asyncio.Future[bool] | bool] = {}  # a verdict, or the check under way

    async def lookup(self, path: str) -> Want | str | None:
        """What ``path`` must be, None if nothing signed names it, or why that cannot be known."""
        if path not in self._targets:
            self._targets[path] = asyncio.ensure_future(self._describe(path))
        return await self._targets[path]

    async def _describe(self, path: str) -> Want | str | None:
        try:
            request = parse_request_path(f"/{path}")
        except BadRequestPath:
            request = None
        try:
            if self.profile.files_are_targets or request is None or request.kind not in (
                    TargetKind.FILE, TargetKind.CORE_METADATA):
                return Want.of(await self.trust.get_target(path))
            return await self._through_page(path, request.project or "", request.filename or "",
                                            request.kind is TargetKind.CORE_METADATA)
        except UnknownTarget:
            return None
        except TrustError as e:
            # Delegated metadata missing or bad: what it covers cannot be verified.
            return f"metadata: {e}"

    async def _through_page(self, path: str, project: str, filename: str, core: bool) -> Want | str | None:
        """A file's description from its entry in the project's signed page (checked in the tree first)."""
        page_path = project_page_target(project, PageFormat.JSON)
        page_target = await self.lookup(page_path)
        if not isinstance(page_target, Want):
            return page_target and f"its page {page_path}: {page_target}"
        data = await self._page(page_path)
        if data is None:
            return f"its page {page_path} is missing or corrupt in the tree"
        try:
            page = index.parse_project_json(data, project)
        except index.IndexParseError as e:
            return f"its signed page {page_path} does not parse: {e}"
        dist = next((f for f in page.files if f.filename == filename), None)
        if dist is None or (core and not dist.core_metadata):
            return None
        try:
            return file_want(path, page_target, dist, core=core, max_file_size=MAX_FILE_SIZE)
        except RepositoryError as e:
            return f"page entry: {e}"

    async def check(self, name: str, target: Want) -> bool:
        """Re-hash one present file against ``target`` (once per name)."""
        known = self._checked.get(name)
        if isinstance(known, bool):
            return known
        if known is None:
            known = self._checked[name] = asyncio.ensure_future(self._check(name, target))
        verdict = await known
        self._checked[name] = verdict  # a bool, not a finished task, for each of a large tree's names
        return verdict

    async def _check(self, name: str, target: Want) -> bool:
        async with self.limit:
            why = await asyncio.to_thread(check_file, self.directory / name, target)
        self.report.checked += 1
        if why is not None:
            self.report.corrupt.append((name, why))
        return why is None

    async def projects(self) -> list[str]:
        """Every project a tree without a manifest should hold: those of the signed root list, or in a layout
        that signs none, every project whose page the verified bins hold."""
        if not self.profile.root_list_signed:
            return [p for p, _ in await self.trust.listed(self.profile.page_project)]
        data = await self._page(root_page_target(PageFormat.JSON))
        return [] if data is None else list(index.parse_project_list_json(data).projects)

    async def expected(self, projects: list[str]) -> set[str]:
        """The targets of ``projects`` (or, for "", of no project) a tree without a manifest should hold: what
        their signed pages list."""
        wanted = {root_page_target(f) for f in PageFormat} if "" in projects and self.profile.root_list_signed else set()
        for project in filter(None, projects):
            wanted |= {project_page_target(project, f) for f in self.profile.signed_formats}
            if not self.profile.files_are_targets:
                continue  # a gateway's own tree keeps files on demand: those present are checked, none expected
            page = await self._page(project_page_target(project, PageFormat.JSON))
            if page is None:
                continue
            for dist in index.parse_project_json(page, project).files:
                wanted.add(file_target(project, dist.filename))
                if dist.core_metadata:
                    wanted.add(core_metadata_target(project, dist.filename))
        return wanted

    async def recorded(self, path: str) -> None:
        """Check a target the manifest says the tree holds, under every name it has."""
        target = await self.lookup(path)
        names = [n for n in target_names(target) if (self.directory / n).is_file()] if isinstance(target, Want) else []
        await self.target(path, names, True)

    def forget(self) -> None:
        """Drop what was learnt of the projects just checked."""
        self._targets.clear()
        self._checked.clear()

    async def _page(self, path: str) -> bytes | None:
        target = await self.lookup(path)
        if not isinstance(target, Want):
            return None
        name = target_names(target)[0]
        if not (self.directory / name).is_file() or not await self.check(name, target):
            return None
        return (self.directory / name).read_bytes()

    async def blocked(self) -> list[Block]:
        """Files of the carried pages the carried advisory store names (malicious, or vulnerable at any severity)."""
        data = await self._page(ADVISORY_TARGET)
        if data is None:
            return []
        try:
            advisories = read_store(data)
        except RecordError as e:
            self.report.corrupt.append((ADVISORY_TARGET, f"signed, but unreadable: {e}"))
            return []
        rules = Rules(block_malicious=True, block_vulnerable="low")
        found = []
        for project in sorted(advisories.projects()):
            page = await self._page(project_page_target(project, PageFormat.JSON))
            if page is None:
                continue
            for dist in index.parse_project_json(page, project).files:
                hashes = {h for h in (dist.hashes.get("sha256"),) if h}
                if (block := advisories.block(rules, project, dist.filename, hashes)) is not None:
                    found.append(block)
        return found

    async def target(self, path: str, names: list[str], expected: bool) -> None:
        """Check every file standing for ``path``; note what is missing or extra."""
        target = await self.lookup(path)
        if not isinstance(target, Want):
            if expected:
                self.report.corrupt.append((path, target or "no signed target"))
            self.report.extra.extend(names)
            return
        signed = target_names(target)
        self.report.extra.extend(n for n in names if n not in signed)
        if expected and signed[0] not in names:
            self.report.missing.append(signed[0])
        present = [n for n in signed if n in names]
        self.report.targets += bool(present)
        checked = await asyncio.gather(*(self.check(n, target) for n in present))
        if present and all(checked) and self.sigstore is not None:
            await self._attested(path, present[0])

    async def _attested(self, path: str, name: str) -> None:
        """Verify a hash-checked provenance object with Sigstore, offline (no-op for other targets)."""
        attests = provenance_of(path)
        if attests is None or self.sigstore is None:
            return
        project, filename = attests
        page = await self._page(project_page_target(project, PageFormat.JSON))
        dist = next((d for d in index.parse_project_json(page, project).files if d.filename == filename),
                    None) if page is not None else None
        if dist is None or "sha256" not in dist.hashes:
            return  # the file is not on the carried page: nothing it attests is served
        claimed = (await self.trust.get_target(path)).custom.get("provenance", {}).get("publisher")
        data = (self.directory / name).read_bytes()
        async with self.limit:
            outcome = await self.sigstore.check(data, filename, dist.hashes["sha256"])
        self.report.attested += 1
        if outcome.state != "verified":
            self.report.provenance.append((path, outcome.detail))
        elif claimed is not None and str(outcome.publisher) != claimed:
            self.report.provenance.append((path, f"verified publisher {outcome.publisher}, signed as {claimed}"))


async def verify_tree(directory: Path, root: Path | None = None, *, jobs: int = 8,
                      allow_expired_until: datetime | None = None, profile: Profile | None = None,
                      sigstore: SigstoreTrust | None = None) -> VerifyReport:
    """Verify ``directory`` (a mirror or ``tufproxy repo`` public tree); see the module docstring.

    ``allow_expired_until`` checks a tree whose upstream metadata expired
    on the way across (everything but expiry); each target it excuses is
    listed in ``VerifyReport.expired``.  ``sigstore`` (prepared, offline)
    verifies carried provenance objects again; None skips that.
    """
    directory = Path(directory).resolve()
    root_bytes = (root or _default_root(directory)).read_bytes()
    manifest: Manifest | None = Manifest(directory / STATE_DIR)
    head = manifest.head() if manifest is not None else None
    if head is None:
        manifest = None
    if profile is None:
        profile = get_profile(head.profile) if head is not None else TUFPROXY
    local = LocalFetcher(directory)
    base = local.base_url()
    expired: list[str] = []
    override = None
    if allow_expired_until is not None:
        override = ExpiryOverride(allow_expired_until, lambda target, _e: expired.append(target))
    with tempfile.TemporaryDirectory(prefix="tufproxy-verify-") as scratch:
        TrustedClient.initialize(Path(scratch), root_bytes)
        # One snapshot for the whole check, however long the hashing takes.
        config = TrustConfig(refresh_interval=10 * 365 * 86400.0, expiry_override=override)
        if manifest is not None:  # one pass, a role at a time: nothing is asked twice once its role is done
            config = replace(config, bin_cache_size=_ROLES_KEPT, found_cache_size=0)
        trust = TrustedClient(Path(scratch), [Mirror(f"{base}{METADATA_DIR}/", base)], local, config)
        try:
            report = await _verify(_Verifier(directory, trust, jobs, profile, manifest, sigstore))
        finally:
            trust.close()
            if manifest is not None:
                manifest.close()
    report.expired = sorted(set(expired))
    return report


async def _verify(v: _Verifier) -> VerifyReport:
    try:
        await v.trust.refresh(force=True)
    except TrustError as e:
        v.report.metadata_error = f"{e.reason}: {e}"
        return v.report
    root = await asyncio.to_thread(_root_files, v.directory, v.report)
    if v.manifest is not None:
        await _recorded(v, v.manifest, root)
    else:
        await _listed(v, root)
    v.report.blocked = await v.blocked()
    v.report.missing.sort()
    v.report.corrupt.sort()
    v.report.extra.sort()
    v.report.provenance.sort()
    return v.report


async def _recorded(v: _Verifier, manifest: Manifest, root: list[str]) -> None:
    """A synced tree: what its manifest records, then every other file it holds."""
    # A role's targets at a time (a file's row is its page's role): each bin is read once, then forgotten.
    async for paths in _iterate(manifest.by_role()):
        await asyncio.gather(*map(v.recorded, paths))
        v.forget()
    await _strays(v, manifest, [""], root)
    projects = sorted(await asyncio.to_thread(_project_dirs, v.directory))
    for at in range(0, len(projects), _PROJECTS):
        chunk = projects[at:at + _PROJECTS]
        await _strays(v, manifest, chunk, await asyncio.to_thread(_files_of, v.directory, chunk))


async def _iterate(groups: Iterator[list[str]]) -> AsyncIterator[list[str]]:
    """``groups`` read in a thread, one at a time (the manifest is an index on disk)."""
    while (group := await asyncio.to_thread(next, groups, None)) is not None:
        yield group


async def _strays(v: _Verifier, manifest: Manifest, projects: list[str], names: list[str]) -> None:
    """Look up every file of ``projects`` under a name no target the manifest records has (extra, or a
    target the tree holds without the manifest saying so)."""
    recorded = manifest.paths_of(projects)
    strays: dict[str, list[str]] = {}
    for name in names:
        path = _target_of(name)
        described = recorded.get(path)
        if described is None or name not in target_names(Want(path, hashes_of(described), 0)):
            strays.setdefault(path, []).append(name)
    await asyncio.gather(*(v.target(path, found, False) for path, found in strays.items()))
    v.forget()


async def _listed(v: _Verifier, root: list[str]) -> None:
    """A tree without a manifest: what its signed pages list, a few projects at a time."""
    projects = sorted(set(await v.projects()) | set(await asyncio.to_thread(_project_dirs, v.directory)))
    await _check(v, [""], root)
    for at in range(0, len(projects), _PROJECTS):
        chunk = projects[at:at + _PROJECTS]
        await _check(v, chunk, await asyncio.to_thread(_files_of, v.directory, chunk))


async def _check(v: _Verifier, projects: list[str], names: list[str]) -> None:
    """Check ``projects``' targets against ``names`` (their files in the tree), then forget them."""
    on_disk: dict[str, list[str]] = {}
    for name in names:
        on_disk.setdefault(_target_of(name), []).append(name)
    expected = await v.expected(projects)
    await asyncio.gather(*(v.target(p, on_disk.get(p, []), p in expected) for p in sorted(set(on_disk) | expected)))
    v.forget()


_PROJECT_DIRS = ("simple", "packages")


def _project_dirs(directory: Path) -> set[str]:
    """The project directories the tree has (``simple/P/``, ``packages/P/``)."""
    found: set[str] = set()
    for top in _PROJECT_DIRS:
        with contextlib.suppress(FileNotFoundError), os.scandir(directory / top) as entries:
            found.update(e.name for e in entries if e.is_dir(follow_symlinks=False))
    return found


def _files_of(directory: Path, projects: list[str]) -> list[str]:
    """Every file under the tree's directories of ``projects``, relative to the tree."""
    return [(Path(dirpath) / f).relative_to(directory).as_posix()
            for project in projects for top in _PROJECT_DIRS
            for dirpath, _, files in os.walk(directory / top / project) for f in files]


def _root_files(directory: Path, report: VerifyReport) -> list[str]:
    """The tree's files of no project (a root list, advisories); a metadata name of no role is extra."""
    names = []
    for dirpath, dirnames, files in os.walk(directory):
        here = Path(dirpath)
        rel = here.relative_to(directory).as_posix()
        if here == directory:
            dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        elif rel in _PROJECT_DIRS:
            dirnames[:] = []  # each project's directory is walked with its project
        for f in files:
            name = f"{rel}/{f}" if rel != "." else f
            if rel == METADATA_DIR or rel.startswith(f"{METADATA_DIR}/"):
                if rel != METADATA_DIR or not _METADATA_NAME_RE.match(f):
                    report.extra.append(name)
            else:
                names.append(name)
    return names
