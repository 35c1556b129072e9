"""Rank 2: moving bytes, with no opinion on whether they are true.

The fetcher seam and its HTTP implementation (:mod:`~proxy.transport.upstream`; a large body received straight
into the reader's buffer: :mod:`~proxy.transport.receive`), a directory as a mirror
(:mod:`~proxy.transport.local`), an S3 bucket (:mod:`~proxy.transport.bucket`,
:mod:`~proxy.transport.awsprofile`), HTTP to a plain index (:mod:`~proxy.transport.indexhttp`), and the one
failover loop over mirrors with the one reading of what a mirror's answer means (:mod:`~proxy.transport.failover`).
"""

__all__ = ["awsprofile", "bucket", "credentials", "failover", "indexhttp", "local", "receive", "tls", "upstream"]
