"""Rank 2: moving bytes, with no opinion on whether they are true.

The fetcher seam and its HTTP implementation (:mod:`~proxy.transport.upstream`), a directory as a mirror
(:mod:`~proxy.transport.local`), an S3 bucket (:mod:`~proxy.transport.bucket`,
:mod:`~proxy.transport.awsprofile`) and HTTP to a plain index (:mod:`~proxy.transport.indexhttp`).
"""

__all__ = ["awsprofile", "bucket", "indexhttp", "local", "upstream"]
