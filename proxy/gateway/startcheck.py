"""At start-up, before the first pip asks: does the first index link files where the gateway may fetch them?

A gateway started without the ``--files-origin`` its index needs refuses
every page (``foreign-origin``).  :func:`files_origin_problem` reads the
first index's root list (its first bytes only: the public index's is tens of
megabytes) and the page of one of the first projects it names, checked as
publishing checks it, and returns the one-line fix, or None.  An index
that cannot be read now says nothing: serving reports that when it happens.
"""

from __future__ import annotations

import asyncio
import logging
import re

from proxy.gateway.listing import IndexClient, PageRefused
from proxy.transport.credentials import origin
from proxy.transport.upstream import DownloadError

log = logging.getLogger(__name__)

ROOT_PREFIX = 64 * 1024  # bytes of the root list read for project names
PROJECTS_TRIED = 3  # the first names of a large index may have no files at all
DEADLINE = 5.0
# A project link of a PEP 503 root page, or a name of a PEP 691 one.
_NAMES = re.compile(rb'<a\s[^>]*>\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*</a>|"name"\s*:\s*"([A-Za-z0-9][A-Za-z0-9._-]*)"')


def project_names(root_prefix: bytes, limit: int = PROJECTS_TRIED) -> list[str]:
    """The first ``limit`` project names in the first bytes of a root list (HTML or JSON)."""
    return [(m.group(1) or m.group(2)).decode() for m in _NAMES.finditer(root_prefix)][:limit]


async def _root_prefix(client: IndexClient, base: str) -> bytes:
    data = b""
    async with client.http.get(base, client.max_page_size, (origin(base),), accept="text/html") as response:
        async for chunk in response.body:
            data += chunk
            if len(data) >= ROOT_PREFIX:
                break
    return data[:ROOT_PREFIX]


async def files_origin_problem(client: IndexClient) -> str | None:
    """The ``foreign-origin`` fix the first index's pages need, or None (fine, or not known now)."""
    try:
        async with asyncio.timeout(DEADLINE):
            for project in project_names(await _root_prefix(client, client.index_urls[0])):
                try:
                    listing = await client.first_index_page(project)
                except PageRefused as e:
                    if e.reason == "foreign-origin":
                        return str(e)
                    continue
                if listing is not None and listing.page.files:
                    return None
    except (TimeoutError, DownloadError) as e:
        log.debug("start-up check of the index's file links skipped: %s", e)
    return None
