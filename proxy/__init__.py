"""tufproxy: a verifying, caching proxy and mirror for Python package indexes (PEP 458)."""

__version__ = "0.1.0"
