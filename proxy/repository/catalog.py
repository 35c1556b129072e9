"""Which projects a repository publishes, read from its own signed bins and kept current cheaply.

A layout that signs no root list (the gateway's) still needs to know its
projects: which are published (the refresher, the miss protocol), which
are private, what its own ``/simple/`` lists.  :class:`Catalog` reads
them from the page targets of the bins the current snapshot names, once,
then after each change only from the bins whose snapshot version moved:
a publish costs the bins it re-signed, not every project.  Another
process's publish (a worker, ``tufproxy gateway revoke``) is taken up the
same way.  These are the repository's own files, read under its name, not
verified: what edges trust they verify themselves.
"""

from __future__ import annotations

from typing import Any, Protocol

from proxy.protocol.access import marked_private
from proxy.protocol.profiles import Profile


class Repository(Protocol):
    """What a catalog reads: the signer's :class:`~proxy.repository.signer.Repository`."""

    @property
    def profile(self) -> Profile: ...

    def metadata_json(self, role: str, version: int | None = None) -> dict[str, Any]: ...


class Catalog:
    """The published projects of ``repo``: see the module docstring.  Not thread-safe: one caller at a time."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.projects: set[str] = set()  # every published project (a set the caller may read, never change)
        self.private: set[str] = set()  # those marked private
        self._bins: dict[str, tuple[int, dict[str, bool]]] = {}  # role -> (version read, project -> private)
        self._snapshot: int | None = None
        # Projects in bins re-read since the caller last took them (see take_touched): whose pages may have
        # been replaced, the candidates of an incremental garbage collection.
        self._touched: set[str] = set()

    def update(self) -> Catalog:
        """Take up what was signed since the last call (by anyone); cheap when nothing was.  RepositoryError
        (a file missing or damaged) leaves the bins read before as they were."""
        version = self.repo.metadata_json("timestamp")["signed"]["meta"]["snapshot.json"]["version"]
        if version == self._snapshot:
            return self
        meta = self.repo.metadata_json("snapshot", version)["signed"]["meta"]
        skip = {"targets", self.repo.profile.bin_delegator}
        listed = {name.removesuffix(".json"): entry["version"] for name, entry in meta.items()}
        left: set[str] = set()
        came: set[str] = set()
        for role in [r for r in self._bins if r not in listed]:
            self._touched.update(self._bins[role][1])
            left |= self._bins[role][1].keys()
            del self._bins[role]
        for role, role_version in listed.items():
            if role in skip or self._bins.get(role, (None,))[0] == role_version:
                continue
            targets = self.repo.metadata_json(role, role_version)["signed"].get("targets", {})
            pages = {}
            for path, info in targets.items():
                project = self.repo.profile.page_project(path)
                if project is not None:
                    pages[project] = marked_private(info) if isinstance(info, dict) else False
            if role in self._bins:  # a first look is no change: the caller collects everything once anyway
                self._touched.update(self._bins[role][1], pages)
            left |= self._bins.get(role, (0, {}))[1].keys() - pages.keys()
            came |= pages.keys()
            for project, private in pages.items():
                self.projects.add(project)
                (self.private.add if private else self.private.discard)(project)
            self._bins[role] = (role_version, pages)
        # Gone only if no bin read now holds it: a re-bin moves every project out of its old bin and into a new
        # one, read in either order.  Added first, removed last: a reader in another thread never misses a
        # project that stays.
        for project in left - came:
            self.projects.discard(project)
            self.private.discard(project)
        self._snapshot = version
        return self

    def take_touched(self) -> set[str]:
        """Projects whose bin was re-signed since the last call (removed ones included), forgotten here."""
        touched, self._touched = self._touched, set()
        return touched

    @property
    def public(self) -> list[str]:
        """The published projects not marked private, sorted (what a root page lists)."""
        return sorted(self.projects - self.private)
