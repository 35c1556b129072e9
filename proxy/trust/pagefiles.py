"""Files trusted through their project's signed page (profiles whose files are not targets).

The one place that decides what such a file must be and where it may be
fetched from, for the proxy (:mod:`proxy.serving.resolver`) and for ``mirror sync``
and ``mirror verify``: its hashes are the page entry's (the core-metadata
hashes for a ``.metadata`` file); its length is exact when the page gives a
PEP 700 ``size``, otherwise only bounded (by the largest file taken, or the
core metadata bound); its URLs are the entry's link resolved against the
page's own URLs, kept only under an allowed origin.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urljoin

from proxy.protocol.errors import Fault, RepositoryError
from proxy.protocol.hashing import accepted_hashes
from proxy.protocol.index import DistFile
from proxy.protocol.model import VerifiedTarget
from proxy.trust.fetch import Want

# Bounds on a file whose page gives no length: the largest file taken by default, and core metadata.
MAX_FILE_SIZE = 4 * 2**30
MAX_CORE_METADATA_SIZE = 16 * 2**20
_CORE_SUFFIX = ".metadata"


class ForeignLink(RepositoryError):
    """A verified page points a file at a host that is not a configured upstream."""

    reason = "foreign-link"
    fault = Fault.OPERATOR

    def __init__(self, target: str, url: str) -> None:
        super().__init__(f"{target}: the page links to {url[:200]}, which is not a configured upstream "
                         "(add it with --files-url)", target=target)


def file_want(path: str, page: VerifiedTarget | Want, dist: DistFile, *, core: bool, max_file_size: int,
              max_core_metadata_size: int = MAX_CORE_METADATA_SIZE) -> Want:
    """What ``path`` (``dist``'s file, or its ``.metadata`` when ``core``) must be, as ``page`` vouches.

    A page entry with no hash we check (none, md5 only, malformed) vouches
    for nothing: the typed refusal of :func:`accepted_hashes`.
    """
    role = f"{page.role} (via {page.path})"
    if core:
        raw = dist.core_metadata if isinstance(dist.core_metadata, dict) else {}
        return Want(path, accepted_hashes(path, raw, role), max_core_metadata_size, False, role)
    exact = dist.size is not None
    length = dist.size if dist.size is not None else max_file_size
    return Want(path, accepted_hashes(path, dist.hashes, role), length, exact, role)


def file_urls(path: str, page_urls: Iterable[str], dist: DistFile, *, core: bool, origins: tuple[str, ...]) -> list[str]:
    """Where ``path`` is fetched: the entry's link against each page URL, under ``origins`` only.

    Raises :class:`ForeignLink` when no such URL is left.
    """
    urls: list[str] = []
    for page_url in page_urls:
        url = urljoin(page_url, dist.url) + (_CORE_SUFFIX if core else "")
        if url not in urls and url.startswith(origins):
            urls.append(url)
    if not urls:
        raise ForeignLink(path, dist.url)
    return urls
