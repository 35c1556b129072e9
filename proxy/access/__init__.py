"""Access control: who may read or publish what, checked on every listener that serves packages.

* :mod:`proxy.access.rules`: ``PATTERN=WHO`` rules and the one decision they make (pure).
* :mod:`proxy.access.passwords`: the htpasswd and group files, re-read when they change.
* :mod:`proxy.access.guard`: a request's ``Authorization`` header to a verdict: throttled, cached, audited.
* :mod:`proxy.access.web`: the aiohttp middleware that applies a guard's verdict.
* :mod:`proxy.access.credentials`: credentials we send upstream (URL ``user:password@`` or netrc), per origin.
* :mod:`proxy.access.tls`: server and client TLS contexts, certificates re-read when their files change.
"""
