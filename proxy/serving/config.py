"""Settings for ``tufproxy serve``: one table, read from flags, env vars and TOML.

Each option is declared once in :data:`OPTIONS`; the argparse flags, the
``TUFPROXY_<NAME>`` environment variables and the keys of the TOML file
given with ``--config`` all come from that table, resolved by the one
resolver every subcommand uses (:mod:`proxy.protocol.options`: flags, then
environment, then file, then the default).  The parsers' short names in
the table are :mod:`proxy.protocol.options`'s.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from proxy.protocol.access import Rule, RuleError, parse_rules
from proxy.protocol.options import (
    ConfigError,
    Option,
    add_options,
    load_config,
    parse_datetime,
    parse_listen,
    parse_size,
    resolve_values,
)
from proxy.protocol.options import non_negative_int as _non_negative_int
from proxy.protocol.options import positive_float as _positive_float
from proxy.protocol.options import positive_int as _positive_int
from proxy.protocol.options import url_list as _url_list
from proxy.protocol.options import worker_count as _worker_count
from proxy.protocol.options import yes_no as _yes_no
from proxy.protocol.profiles import TUFPROXY, WAREHOUSE, Profile, get_profile, recorded_profile
from proxy.serving import listener
from proxy.transport.bucket import BucketConfigError, parse_store_url
from proxy.transport.credentials import OriginAuth
from proxy.trust.provenance import SIGSTORE_OPTIONS


def cpu_count() -> int:
    """CPUs this process may run on (the default number of workers)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _store_url(value: str) -> str:
    try:
        parse_store_url(str(value))
    except BucketConfigError as e:
        raise ConfigError(str(e)) from None
    return str(value).strip()


def _rules(value: Any) -> tuple[Rule, ...]:
    try:
        return parse_rules(value)
    except RuleError as e:
        raise ConfigError(str(e)) from None


def access_options(default_who: str) -> tuple[Option, ...]:
    """``--auth-file``, ``--auth-groups``, ``--read-rule``, ``--allow-anonymous-private`` and the listener's TLS
    (the same settings on ``serve`` and ``gateway serve``)."""
    return (
        Option("auth_file", "htpasswd file of the users who may authenticate (bcrypt: htpasswd -B, or argon2id); "
               "re-read when it changes", None, Path, metavar="FILE"),
        Option("auth_groups", "group file, 'group: user user ...' (Apache AuthGroupFile), for @group in rules",
               None, Path, metavar="FILE"),
        Option("read_rule", f"PATTERN=WHO: who may read projects matching PATTERN (WHO: anonymous, authenticated, "
               f"a user or @group, several joined by |); repeatable; unmatched projects: {default_who}; private "
               "projects are never anonymous", [], _rules, repeat=True, metavar="PATTERN=WHO"),
        Option("allow_anonymous_private", "serve private projects to anonymous clients as the read rules allow "
               "(yes/no): accept that risk knowingly", False, _yes_no, metavar="YES|NO"),
        Option("tls_cert", "serve HTTPS with this certificate chain (PEM; re-read when it changes)", None, Path,
               metavar="FILE"),
        Option("tls_key", "the private key of --tls-cert (PEM; re-read when it changes)", None, Path, metavar="FILE"),
    )


OPTIONS: tuple[Option, ...] = (
    Option("upstream", "base URL of an untrusted mirror serving the signed tree; repeat for fallbacks, tried in order",
           [], _url_list, repeat=True, metavar="URL"),
    Option("profile", "repository layout: tufproxy (our signer's), gateway (what 'tufproxy gateway' publishes) "
           "or warehouse (PyPI's PEP 458 draft); only to insist: the layout is read from the signed metadata",
           None, metavar="NAME", shown="detected from the verified targets delegations (with --repository: the "
           "layout its last 'mirror sync' recorded)"),
    Option("metadata_path", "where TUF metadata lives, relative to each upstream URL or an absolute URL",
           None, metavar="PATH",
           shown="metadata/, else tuf-metadata/ (where the warehouse layout keeps it)"),
    Option("files_url", "warehouse profile: another URL prefix a verified page may link files to "
           "(e.g. https://files.index.example/); repeatable", [], _url_list, repeat=True, metavar="URL"),
    Option("gateway_url", "gateway profile: a gateway asked to publish a project no signed page lists yet "
           "(the miss protocol), for edges that read the repository from a bucket or CDN; repeat for every "
           "gateway of a group, asked in order (one that is down or failing is passed over)",
           [], _url_list, repeat=True, metavar="URL", shown="every --upstream"),
    Option("repository", "serve a local signed tree (what 'tufproxy repo' or 'mirror sync' wrote) instead of an upstream",
           None, Path, metavar="DIR"),
    Option("root", "the pinned trusted root.json", None, Path, metavar="FILE",
           shown="required with --upstream; with --repository, DIR/metadata/1.root.json"),
    Option("cache_dir", "where verified blobs, pages and trusted metadata are kept",
           Path("tufproxy-cache"), Path, metavar="DIR"),
    Option("listen", "address to listen on", "127.0.0.1:8080", parse_listen, metavar="HOST:PORT"),
    Option("refresh_interval", "seconds between checks for a new timestamp", 60.0, _positive_float, metavar="SECONDS"),
    Option("miss_wait", "seconds a request for an unknown file or project waits for the refresh in flight "
           "before 503 + Retry-After (pip retries those; hits never wait)", 5.0, _positive_float, metavar="SECONDS"),
    Option("cache_size", "size limit of the blob cache (LRU eviction beyond it)", "10G", parse_size, metavar="SIZE"),
    Option("max_file_size", "largest distribution file accepted", "4G", parse_size, metavar="SIZE"),
    Option("connect_timeout", "seconds to connect to an upstream", 10.0, _positive_float, metavar="SECONDS"),
    Option("read_timeout", "seconds an upstream may stay silent mid-response", 30.0, _positive_float, metavar="SECONDS"),
    Option("log_level", "debug, info, warning or error", "info", metavar="LEVEL"),
    Option("log_format", "text (key=value) or json, on stderr", "text", metavar="FORMAT"),
    Option("audit_log", "append audit records (JSON lines) to this file", None, Path, metavar="FILE", shown="stdout"),
    Option("allow_expired_until", "operator override for an air-gapped tree: accept EXPIRED metadata until this "
           "ISO date (signatures, versions and hashes are still checked; every use is logged)", None, parse_datetime,
           metavar="DATE"),
    Option("workers", "worker processes sharing the listening socket and the cache; 1: one process, no supervisor",
           cpu_count(), _worker_count, metavar="N"),
    Option("audit_accepted", "also record every artifact served (yes/no), for forensics", False, _yes_no,
           metavar="YES|NO"),
    Option("verify_before_send", "hold every byte of a cold file until all of it is verified (yes/no); no: "
           "stream it as it arrives and hold back only the final byte until verified", False,
           _yes_no, metavar="YES|NO"),
    Option("read_ahead", "files fetched ahead of their request at once, when a client asks for their .metadata "
           "(a resolver downloads what it resolved last, so the file is then verified and kept; none over 64 MiB; "
           "0: none)", 8, _non_negative_int, metavar="N"),
    Option("min_rate", "an upstream body must average this many bytes per second after its first 5 s, "
           "or the next mirror is tried", "16K", parse_size, metavar="SIZE"),
    *listener.OPTIONS,
    Option("store", "keep verified files and pages in a bucket shared by every replica, s3://BUCKET/PREFIX "
           "(the --cache-dir store becomes a local tier in front of it; credentials: the standard AWS "
           "chain: environment, web identity, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config, "
           "container or instance role)", None, _store_url, metavar="URL"),
    Option("s3_endpoint_url", "the S3 API endpoint of an S3-compatible store", None, metavar="URL",
           shown="AWS's for the region"),
    Option("s3_timeout", "seconds a bucket request may take (one retry within it) before the request gets a 503",
           30.0, _positive_float, metavar="SECONDS"),
    Option("s3_lease_seconds", "seconds one replica's lease on the upstream fetch of a file lasts; a crashed "
           "replica's lease is taken over after this", 300.0, _positive_float, metavar="SECONDS"),
    Option("s3_wait", "seconds a replica waits for another replica's upstream fetch of the same file before "
           "fetching it upstream too (keep it well under clients' read timeouts, 15 s for pip)", 5.0,
           _positive_float, metavar="SECONDS"),
    Option("mirror_downloads", "concurrent file downloads per mirror (metadata has a pool of its own)",
           16, _positive_int, metavar="N"),
    *access_options("anonymous"),
    Option("ca_bundle", "CA certificates to verify upstreams' (the gateway's) TLS with", None, Path, metavar="FILE",
           shown="the system's"),
    Option("client_cert", "present this client certificate (PEM, key included or --client-key) to upstreams that "
           "ask for one (a gateway with --tls-client-ca)", None, Path, metavar="FILE"),
    Option("client_key", "the private key of --client-cert", None, Path, metavar="FILE"),
    Option("uvloop", "run the event loop on uvloop if it is installed (yes/no): more warm page requests per "
           "second, but files lose sendfile (aiohttp copies them through the loop)", False, _yes_no, metavar="YES|NO"),
    Option("verify_provenance", "gateway profile: verify each file's PEP 740 provenance here before serving it, "
           "against the publisher this edge pinned for its project (yes/no)", False, _yes_no, metavar="YES|NO"),
    *SIGSTORE_OPTIONS,
)


@dataclass(frozen=True)
class ServeConfig:
    """The resolved settings of one proxy process."""

    upstream: list[str] = field(default_factory=list)
    profile: str | None = None  # None: the layout the signed metadata has (proxy.trust.detect)
    metadata_path: str | None = None
    files_url: list[str] = field(default_factory=list)
    gateway_url: list[str] = field(default_factory=list)
    repository: Path | None = None
    root: Path | None = None
    cache_dir: Path = Path("tufproxy-cache")
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    refresh_interval: float = 60.0
    miss_wait: float = 5.0
    cache_size: int = 10 * 2**30
    max_file_size: int = 4 * 2**30
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    log_level: str = "info"
    log_format: str = "text"
    audit_log: Path | None = None
    audit_accepted: bool = False
    allow_expired_until: datetime | None = None
    workers: int = 1
    verify_before_send: bool = False
    read_ahead: int = 8
    min_rate: int = 16 * 1024
    mirror_downloads: int = 16
    store: str | None = None
    s3_endpoint_url: str | None = None
    s3_timeout: float = 30.0
    s3_lease_seconds: float = 300.0
    s3_wait: float = 5.0
    header_timeout: float = 10.0
    idle_timeout: float = 15.0
    body_timeout: float = 30.0
    max_connections: int = 1024
    max_connections_per_client: int = 0
    backlog: int = 1024
    auth_file: Path | None = None
    auth_groups: Path | None = None
    read_rule: tuple[Rule, ...] = ()
    allow_anonymous_private: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    uvloop: bool = False
    # Credentials taken out of --upstream / --gateway-url (or netrc), sent only to their origin; never printed.
    upstream_auth: OriginAuth = field(default_factory=OriginAuth, repr=False, compare=False)
    verify_provenance: bool = False
    sigstore_trust_root: str = "production"
    sigstore_offline: bool = False

    @property
    def layout(self) -> Profile | None:
        """The layout insisted on (--profile, or the one a synced --repository recorded); None: detect it."""
        return get_profile(self.profile) if self.profile is not None else None

    def metadata_url(self, upstream: str, path: str | None = None) -> str:
        path = path or self.metadata_path or TUFPROXY.metadata_path
        path = path if path.endswith("/") else f"{path}/"
        return path if re.match(r"https?://", path) else f"{upstream}{path}"

    @property
    def root_file(self) -> Path:
        if self.root is not None:
            return self.root
        if self.repository is None:
            raise ConfigError("--root is required with --upstream (the pinned root.json)")
        layouts = [self.layout] if self.layout is not None else [TUFPROXY, WAREHOUSE]
        found = [self.repository / p.metadata_path / "1.root.json" for p in layouts]
        return next((f for f in found if f.exists()), found[0])


def add_arguments(parser: argparse.ArgumentParser, options: tuple[Option, ...] = OPTIONS) -> None:
    """``--config`` and every option as a flag (:func:`proxy.protocol.options.add_options`)."""
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML file with any of the settings below")
    add_options(parser, options)


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeConfig:
    """Merge flags, environment and TOML file into a :class:`ServeConfig`."""
    values = resolve_values(args, OPTIONS, environ, read_config(args.config, (o.name for o in OPTIONS)), str(args.config))
    if values["profile"] is None and values["repository"] is not None:
        values["profile"] = recorded_profile(values["repository"])
    auth = OriginAuth()
    values["upstream"] = auth.add_all(values["upstream"])
    values["gateway_url"] = auth.add_all(values["gateway_url"])
    config = ServeConfig(**values, upstream_auth=auth)
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("give both --tls-cert and --tls-key, or neither")
    if config.auth_groups is not None and config.auth_file is None:
        raise ConfigError("--auth-groups needs --auth-file")
    if not config.upstream and config.repository is None:
        raise ConfigError("give --upstream URL (or --repository DIR for a local signed tree)")
    if config.upstream and config.repository is not None:
        raise ConfigError("--upstream and --repository exclude each other")
    _ = config.root_file  # --upstream without --root fails here, not later in a worker
    try:
        _ = config.layout
    except ValueError as e:
        raise ConfigError(f"--profile: {e}") from e
    if config.gateway_url and config.layout is not None and not config.layout.miss_protocol:
        raise ConfigError(f"--gateway-url is for --profile gateway, not {config.profile}")
    if config.verify_provenance and config.layout is not None and config.layout.files_are_targets:
        raise ConfigError(f"--verify-provenance is for --profile gateway, not {config.profile}")
    if config.log_format not in ("text", "json"):
        raise ConfigError(f"--log-format: {config.log_format!r} is not text or json")
    if config.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level: {config.log_level!r} is not debug, info, warning or error")
    return config


def read_config(path: Path | None, known: Iterable[str]) -> dict[str, Any]:
    """The settings of the TOML file ``path`` (none without one); a key not in ``known`` is an error."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    return load_config(text, str(path), known)
