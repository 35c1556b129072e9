"""Advisory feeds the running gateway fetches itself (``--advisories-url``), every ``--advisories-refresh`` seconds.

Each feed is an OSV record, or a zip laid out like OSV's ``all.zip`` (an
internal copy of the PyPI one, say).  It is fetched with a conditional GET
(the ETag and Last-Modified of its last answer, kept in
``DIR/gateway/feeds.json``) through the same bounded client as index pages
(:class:`~proxy.transport.indexhttp.IndexHTTP`), streamed to a temporary file
of at most ``max_size`` bytes beside the store, and imported like
``gateway advisories import`` does (:mod:`proxy.gateway.advisories`), and
signed as the repository's advisory target; the
gateway's :meth:`~proxy.gateway.service.Gateway.watch_advisories` then
republishes what changed.  A feed that cannot be fetched keeps what was
imported before, logged; nothing is lifted by a failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from proxy.gateway.advisories import SourceError, import_into, sign_store
from proxy.repository import Repository, RepositoryError
from proxy.transport.credentials import strip_credentials
from proxy.transport.indexhttp import IndexHTTP
from proxy.transport.upstream import DownloadError
from proxy.util.atomic import atomic_write
from proxy.util.locks import Leadership

log = logging.getLogger(__name__)
STATE_NAME = "feeds.json"


class Feeds:
    """See the module docstring; :meth:`run` until cancelled, :meth:`fetch_all` once."""

    def __init__(self, urls: Sequence[str], http: IndexHTTP, store: Path, repo: Repository, *, max_size: int,
                 answered: Callable[[], None] = lambda: None) -> None:
        self.answered = answered  # every feed answered (new body or 304): for the feed-freshness metric
        self.urls = list(urls)
        self.repo = repo
        self.http = http
        self.store = store
        self.max_size = max_size
        self.state_path = store.parent / STATE_NAME

    def _state(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.state_path.read_bytes())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    async def fetch_all(self) -> int:
        """Fetch every feed once; how many brought a new body (and were imported)."""
        imported = failed = 0
        for url in self.urls:
            try:
                imported += await self._fetch(url)
            except (DownloadError, SourceError, OSError, RepositoryError) as e:
                failed += 1
                log.error("advisory feed %s: %s; keeping what was imported before", strip_credentials(url)[0], e)
        if not failed:
            self.answered()
        return imported

    async def _fetch(self, url: str) -> int:
        state = self._state()
        clean = strip_credentials(url)[0]
        fd, tmp = tempfile.mkstemp(dir=self.store.parent, prefix=".feed.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                async with self.http.get(clean, self.max_size, (clean,), conditional=state.get(clean)) as response:
                    if response.status == 304:
                        log.info("advisory feed %s: not modified", clean)
                        return 0
                    async for chunk in response.body:
                        out.write(chunk)
                    validators = dict(response.validators)
            _, report = await asyncio.to_thread(import_into, self.store, [Path(tmp)], clean)
        finally:
            os.unlink(tmp)
        await asyncio.to_thread(sign_store, self.repo, self.store)
        if report.warning():
            log.warning("advisory feed %s: %s", clean, report.warning())
        log.info("advisory feed %s: %d record(s), %d new or newer", clean, report.pypi, report.kept)
        state[clean] = validators
        atomic_write(self.state_path, json.dumps(state).encode())
        return 1

    async def run(self, every: float, leader: Leadership | None = None) -> None:
        """Fetch every ``every`` seconds (the worker holding ``leader`` only, under workers)."""
        while True:
            if leader is None or leader.held():
                await self.fetch_all()
            await asyncio.sleep(every)
