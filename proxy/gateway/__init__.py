"""``tufproxy gateway``: the organisation's own PEP 458 repository over a plain PEP 503/691 index.

The gateway fetches pages and files from an index that publishes no TUF
metadata, checks them against the index's own hashes, pins what it has
seen, applies the organisation's policy, and publishes what passes as a
repository signed with the organisation's keys, which edges
(``tufproxy serve``) and air-gapped mirrors verify from its root.
"""
