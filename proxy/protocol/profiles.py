"""Repository layouts ("profiles"): what is a target, under which path, served where.

A profile is a small declarative object.  The signer writes a repository
in a profile's layout, the proxy reads one; neither the server nor the
trust core knows any profile by name, so a third layout is one more
:class:`Profile` value here.

``tufproxy`` (our signer's default, see :mod:`proxy.protocol.layout`): targets →
bins → succinct ``bin-NNNN``; both page renderings, the root list,
every distribution and ``.metadata`` file are targets, with sha256 and
sha512; metadata under ``metadata/``.

``gateway`` (what ``tufproxy gateway`` publishes): the ``tufproxy``
layout, except that no root list is signed (edges list the projects the
verified bins hold: a publish costs the same however many projects there
are), and distribution and ``.metadata`` files are not targets:
they are trusted through the signed page's sha256 (and its PEP 700
``size`` where the index gave one), as in PyPI's draft, so a first
publish of a project with thousands of files re-signs two page targets,
not thousands of bins.  Its page targets carry sha256 alone (TUF asks for
one hash; PyPI's draft signs one): a second digest made every bin-n, which
each edge downloads again at every publish into it, half as large again,
and wrote each page under two names.  A tree signed before with both
stays valid: its targets keep both until their page is signed again.

Which layout a repository has is read from its verified top-level targets
(:func:`detect_profile`): ``warehouse`` delegates straight to succinct
``bins-N``; ``tufproxy`` and ``gateway`` delegate to ``bins``, whose paths
say whether files are targets (a gateway's cover only ``simple/``).  A
gateway initialised before its delegation said so looks like ``tufproxy``
and needs ``--profile gateway``.

``warehouse`` (PyPI's PEP 458 draft: Warehouse with RSTUF, pypi/warehouse
PR 15815): targets → succinct ``bins-N`` directly; one target per project,
its **normalised name**, whose bytes are the HTML simple detail page
Warehouse stores at ``simple/<name>/<blake2b-256>.<name>.html``; hash
``blake2b-256`` only; distribution files are trusted through the sha256
in the verified page; no JSON target, no root-list target; metadata under
``tuf-metadata/``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from tuf.api.metadata import Targets

from proxy.protocol.errors import Fault
from proxy.protocol.layout import (
    MIRROR_MANIFEST,
    MIRROR_STATE_DIR,
    PageFormat,
    consistent_name,
    project_page_target,
    root_page_target,
)


@dataclass(frozen=True)
class Profile:
    """One layout of a PEP 458 repository."""

    name: str
    metadata_path: str
    # The role that delegates to the hash bins, and the bins' name prefix.
    bin_delegator: str
    bin_prefix: str
    hash_algorithms: tuple[str, ...]
    # Page renderings that are targets, the first being the signer's source of truth.
    signed_formats: tuple[PageFormat, ...]
    root_list_signed: bool
    files_are_targets: bool
    page_target: Callable[[str, PageFormat], str]
    # Where, relative to a mirror's base URL, a target is served under its digest.
    served_name: Callable[[str, str], str]
    # The upstream publishes unknown projects on request (a ``tufproxy gateway``): see proxy/serving/edge.py.
    miss_protocol: bool = False
    # The paths ``targets`` delegates to ``bins`` (tufproxy and gateway): what the layout signs, and tells it apart.
    bin_paths: tuple[str, ...] = ()

    def page_source_format(self, wanted: PageFormat) -> PageFormat:
        """The signed rendering to verify when a client wants ``wanted``."""
        return wanted if wanted in self.signed_formats else self.signed_formats[0]

    def root_target(self, fmt: PageFormat) -> str | None:
        """Target path of the root project list, or None when it is not signed."""
        return root_page_target(self.page_source_format(fmt)) if self.root_list_signed else None

    def page_project(self, target_path: str) -> str | None:
        """The project whose page (in the signer's source format) ``target_path`` is, or None: the inverse of
        :attr:`page_target`, what a root list is built from where none is signed."""
        project = target_path.rpartition("/")[0].removeprefix("simple/") if "/" in target_path else target_path
        if not project or "/" in project or canonicalize_name(project) != project:
            return None
        return project if self.page_target(project, self.signed_formats[0]) == target_path else None


def _warehouse_page_target(project: str, fmt: PageFormat) -> str:
    return canonicalize_name(project)


def _warehouse_served_name(target_path: str, digest: str) -> str:
    return f"simple/{target_path}/{digest}.{target_path}.html"


TUFPROXY = Profile(
    name="tufproxy",
    metadata_path="metadata/",
    bin_delegator="bins",
    bin_prefix="bin",
    hash_algorithms=("sha256", "sha512"),
    signed_formats=(PageFormat.JSON, PageFormat.HTML),
    root_list_signed=True,
    files_are_targets=True,
    page_target=project_page_target,
    served_name=consistent_name,
    bin_paths=("simple/*", "simple/*/*", "packages/*/*"),
)

# No signed root list: re-signing it on every publish that adds a project cost O(projects) (issue 37); edges
# and the gateway list projects from the bins' page targets instead (Profile.page_project).  One digest: the
# bin-n an edge downloads per publish is what grows with the projects (27 KB at 100,000 with two).  One page
# format, the JSON one (PEP 691): an edge renders the HTML page from it for a client that asks for HTML, and each
# publish signs and writes one page in one bin where it signed two pages in two bins (a uv cold install about
# 0.01 s faster: bench/results/gateway-json-pages.md).  A page's HTML target signed by an earlier release goes
# when the page is next signed (Repository._write_page).
GATEWAY = dataclasses.replace(TUFPROXY, name="gateway", files_are_targets=False, miss_protocol=True,
                              bin_paths=("simple/*", "simple/*/*"), root_list_signed=False, hash_algorithms=("sha256",),
                              signed_formats=(PageFormat.JSON,))

WAREHOUSE = Profile(
    name="warehouse",
    metadata_path="tuf-metadata/",
    bin_delegator="targets",
    bin_prefix="bins",
    hash_algorithms=("blake2b-256",),
    signed_formats=(PageFormat.HTML,),
    root_list_signed=False,
    files_are_targets=False,
    page_target=_warehouse_page_target,
    served_name=_warehouse_served_name,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (TUFPROXY, GATEWAY, WAREHOUSE)}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})") from None


class LayoutError(ValueError):
    """The signed metadata has no known layout, or not the one insisted on."""

    reason = "layout-mismatch"
    fault = Fault.OPERATOR


def detect_profile(targets: Targets) -> tuple[Profile, ...]:
    """The layouts whose delegations the verified top-level ``targets`` has, the likeliest first; () if none.

    ``tufproxy``-shaped delegations may also be a gateway initialised before its delegation said so.
    """
    delegations = targets.delegations
    if delegations is None:
        return ()
    if delegations.succinct_roles is not None:
        return (WAREHOUSE,) if delegations.succinct_roles.name_prefix == WAREHOUSE.bin_prefix else ()
    role = (delegations.roles or {}).get(TUFPROXY.bin_delegator)
    paths = tuple(role.paths or ()) if role is not None else None
    if paths == TUFPROXY.bin_paths:
        return (TUFPROXY, GATEWAY)
    return (GATEWAY,) if paths == GATEWAY.bin_paths else ()


def choose_profile(detected: tuple[Profile, ...], insisted: Profile | None, source: str = "--profile") -> Profile:
    """The layout to use: ``insisted`` (given by ``source``) if the metadata allows it, else the detected one.

    Raises :class:`LayoutError` in one line naming both when they contradict, or when the metadata has no
    known layout and none was given.
    """
    if insisted is not None and (not detected or insisted in detected):
        return insisted
    if not detected:
        raise LayoutError("the signed targets delegations match no known layout (tufproxy, gateway, warehouse): "
                          "give --profile")
    if insisted is not None:
        raise LayoutError(f"{source} {insisted.name} contradicts the signed metadata, whose targets delegations "
                          f"are the {detected[0].name} layout's: drop {source} or give {source} {detected[0].name}")
    return detected[0]


def recorded_profile(directory: Path) -> str | None:
    """The profile a ``tufproxy mirror sync`` into ``directory`` recorded, None if it recorded none.

    Only a default: the manifest sits on untrusted media, but a profile only
    says where things live, and every byte is still verified from the root,
    so a forged one can break serving, never make it trust more.
    """
    try:
        manifest = json.loads((Path(directory) / MIRROR_STATE_DIR / MIRROR_MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    profile = manifest.get("profile") if isinstance(manifest, dict) else None
    return profile if isinstance(profile, str) else None
