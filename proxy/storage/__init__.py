"""Rank 4: what the proxy keeps: verified blobs and pages, tiers, pushes, downloads, the audit log.

Only bytes the trust core has verified are ever given a served name here.
"""

__all__ = ["audit", "downloads", "pagecache", "store", "tiered", "treepush"]
