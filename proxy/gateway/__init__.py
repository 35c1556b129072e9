"""``tufproxy gateway``: the organisation's own PEP 458 repository over a plain PEP 503/691 index.

The gateway fetches pages and files from an index that publishes no TUF
metadata, checks them against the index's own hashes, pins what it has
seen, applies the organisation's policy, and publishes what passes as a
repository signed with the organisation's keys, which edges
(``tufproxy serve``) and air-gapped mirrors verify from its root.

Rank 7 (beside :mod:`proxy.mirror`, which it never imports). Modules, lowest first:

* ``listing``: a project's page from the first index that lists it, validated.
* ``ledger``: the append-only record of pins, projects' indexes and revocations.
* ``pages``: listing -> the page to sign (policy seam, revocations, pins).
* ``publisher``: batched signing through :mod:`proxy.repository`.
* ``files``: pinned files streamed from the index, checked, then kept.
* ``service``: publish on demand (single-flight) and refresh; no HTTP.
* ``freshness``: page ttl, timestamp re-signing, garbage collection.
* ``app``: the HTTP face (tree, miss protocol, operations).

HTTP to an index is :mod:`proxy.transport.indexhttp`; the edge's side of the miss protocol is
:mod:`proxy.serving.edge`; the commands are :mod:`proxy.cli.gateway`.
"""

__all__ = ["app", "files", "freshness", "ledger", "listing", "metrics", "pages", "policy", "publisher", "service"]
