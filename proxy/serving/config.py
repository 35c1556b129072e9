"""Settings for ``tufproxy serve``: one table, read from flags, env vars and TOML.

Each option is declared once in :data:`OPTIONS`; the argparse flags, the
``TUFPROXY_<NAME>`` environment variables and the keys of the TOML file
given with ``--config`` all come from that table.  Precedence: flags, then
environment, then file, then the default.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from proxy.protocol.errors import Fault
from proxy.protocol.profiles import Profile, get_profile, recorded_profile
from proxy.transport.bucket import BucketConfigError, parse_store_url

ENV_PREFIX = "TUFPROXY_"


class ConfigError(ValueError):
    """A setting has a value we cannot use."""

    reason = "bad-configuration"
    fault = Fault.OPERATOR


def parse_size(value: str | int) -> int:
    """``10G``, ``512M``, ``1.5T`` or a plain byte count."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if not m:
        raise ConfigError(f"not a size: {value!r} (try 512M, 10G)")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6)."""
    m = re.fullmatch(r"\[?([^\]]*)\]?:(\d{1,5})", value.strip())
    if not m or not 0 <= int(m.group(2)) <= 65535:
        raise ConfigError(f"wants HOST:PORT, not {value!r}")
    return m.group(1) or "127.0.0.1", int(m.group(2))


def _worker_count(value: str | int) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 256:
        raise ConfigError(f"wants a whole number from 1 to 256, not {value!r}")
    return n


def _yes_no(value: str | bool) -> bool:
    word = str(value).strip().lower()
    if word in ("1", "yes", "true", "on"):
        return True
    if word in ("0", "no", "false", "off"):
        return False
    raise ConfigError(f"wants yes or no, not {value!r}")


def _positive_int(value: str | int) -> int:
    n = int(value)
    if n < 1:
        raise ConfigError(f"must be 1 or more: {value!r}")
    return n


def cpu_count() -> int:
    """CPUs this process may run on (the default number of workers)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _positive_float(value: str | float) -> float:
    try:
        f = float(value)
    except ValueError:
        f = 0.0
    if not f > 0:
        raise ConfigError(f"wants a number more than 0, not {value!r}")
    return f


def parse_datetime(value: str | datetime | date) -> datetime:
    """An ISO 8601 date or date-time (TOML dates too); naive means UTC."""
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, date):
        when = datetime(value.year, value.month, value.day)
    else:
        try:
            when = datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise ConfigError(f"not an ISO date: {value!r} (try 2030-01-31)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _url_list(value: str | list[str]) -> list[str]:
    items = value if isinstance(value, list) else re.split(r"[\s,]+", value.strip())
    urls = [u if u.endswith("/") else f"{u}/" for u in map(str, items) if u]
    for u in urls:
        if not re.match(r"https?://", u):
            raise ConfigError(f"not an http(s) URL: {u!r}")
    return urls


def _url(value: str) -> str:
    urls = _url_list(str(value).strip())
    if len(urls) != 1:
        raise ConfigError(f"not one http(s) URL: {value!r}")
    return urls[0]


def _store_url(value: str) -> str:
    try:
        parse_store_url(value)
    except BucketConfigError as e:
        raise ConfigError(str(e)) from None
    return value.strip()


@dataclass(frozen=True)
class Option:
    """One setting: its flag, its env var, its TOML key, its parser."""

    name: str
    help: str
    default: Any = None
    parse: Callable[[Any], Any] = str
    repeat: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("upstream", "base URL of an untrusted mirror serving the signed tree; repeat for fallbacks, tried in order",
           [], _url_list, repeat=True, metavar="URL"),
    Option("profile", "repository layout: tufproxy (our signer's), gateway (what 'tufproxy gateway' publishes) "
           "or warehouse (PyPI's PEP 458 draft); with --repository, the profile its last 'mirror sync' "
           "recorded, else tufproxy", None, metavar="NAME"),
    Option("metadata_path", "where TUF metadata lives, relative to each upstream URL or an absolute URL "
           "(default: the profile's, metadata/ or tuf-metadata/)", None, metavar="PATH"),
    Option("files_url", "warehouse profile: another URL prefix a verified page may link files to "
           "(e.g. https://files.index.example/); repeatable", [], _url_list, repeat=True, metavar="URL"),
    Option("gateway_url", "gateway profile: the gateway asked to publish a project no signed page lists yet "
           "(the miss protocol; default: the first --upstream), for edges that read the repository from a "
           "bucket or CDN", None, _url, metavar="URL"),
    Option("repository", "serve a local signed tree (what 'tufproxy repo' or 'mirror sync' wrote) instead of an upstream",
           None, Path, metavar="DIR"),
    Option("root", "the pinned trusted root.json (default with --repository: DIR/metadata/1.root.json)",
           None, Path, metavar="FILE"),
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
    Option("audit_log", "append audit records (JSON lines) to this file instead of stdout", None, Path, metavar="FILE"),
    Option("allow_expired_until", "operator override for an air-gapped tree: accept EXPIRED metadata until this "
           "ISO date (signatures, versions and hashes are still checked; every use is logged)", None, parse_datetime,
           metavar="DATE"),
    Option("workers", "worker processes sharing the listening socket and the cache; 1: one process, no supervisor",
           cpu_count(), _worker_count, metavar="N"),
    Option("audit_accepted", "also record every artifact served (yes/no), for forensics", False, _yes_no,
           metavar="YES|NO"),
    Option("verify_before_send", "hold every byte of a cold file until all of it is verified (yes/no); default: "
           "stream it as it arrives and hold back only the final byte until verified", False,
           _yes_no, metavar="YES|NO"),
    Option("min_rate", "an upstream body must average this many bytes per second after its first 5 s, "
           "or the next mirror is tried", "16K", parse_size, metavar="SIZE"),
    Option("max_connections", "client connections per worker; more are closed at once", 1024, _positive_int,
           metavar="N"),
    Option("client_timeout", "seconds a client connection may sit idle or take to send a request head",
           15.0, _positive_float, metavar="SECONDS"),
    Option("store", "keep verified files and pages in a bucket shared by every replica, s3://BUCKET/PREFIX "
           "(the --cache-dir store becomes a local tier in front of it; credentials: the standard AWS "
           "chain: environment, web identity, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config, "
           "container or instance role)", None, _store_url, metavar="URL"),
    Option("s3_endpoint_url", "the S3 API endpoint of an S3-compatible store (default: AWS's for the region)",
           None, metavar="URL"),
    Option("s3_timeout", "seconds a bucket request may take (one retry within it) before the request gets a 503",
           30.0, _positive_float, metavar="SECONDS"),
    Option("s3_lease_seconds", "seconds one replica's lease on the upstream fetch of a file lasts; a crashed "
           "replica's lease is taken over after this", 300.0, _positive_float, metavar="SECONDS"),
    Option("s3_wait", "seconds a replica waits for another replica's upstream fetch of the same file before "
           "fetching it upstream too (keep it well under clients' read timeouts, 15 s for pip)", 5.0,
           _positive_float, metavar="SECONDS"),
    Option("mirror_downloads", "concurrent file downloads per mirror (metadata has a pool of its own)",
           16, _positive_int, metavar="N"),
    Option("uvloop", "run the event loop on uvloop if it is installed (yes/no): more warm page requests per "
           "second, but files lose sendfile (aiohttp copies them through the loop)", False, _yes_no, metavar="YES|NO"),
)


@dataclass(frozen=True)
class ServeConfig:
    """The resolved settings of one proxy process."""

    upstream: list[str] = field(default_factory=list)
    profile: str = "tufproxy"
    metadata_path: str | None = None
    files_url: list[str] = field(default_factory=list)
    gateway_url: str | None = None
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
    min_rate: int = 16 * 1024
    mirror_downloads: int = 16
    store: str | None = None
    s3_endpoint_url: str | None = None
    s3_timeout: float = 30.0
    s3_lease_seconds: float = 300.0
    s3_wait: float = 5.0
    max_connections: int = 1024
    client_timeout: float = 15.0
    uvloop: bool = False

    @property
    def layout(self) -> Profile:
        return get_profile(self.profile)

    def metadata_url(self, upstream: str) -> str:
        path = self.metadata_path or self.layout.metadata_path
        path = path if path.endswith("/") else f"{path}/"
        return path if re.match(r"https?://", path) else f"{upstream}{path}"

    @property
    def root_file(self) -> Path:
        if self.root is not None:
            return self.root
        if self.repository is None:
            raise ConfigError("--root is required with --upstream (the pinned root.json)")
        return self.repository / self.layout.metadata_path / "1.root.json"


def add_arguments(parser: argparse.ArgumentParser, options: tuple[Option, ...] = OPTIONS) -> None:
    """Add every option as a flag (defaults stay None so we can tell what was given)."""
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML file with any of the settings below")
    for opt in options:
        default = opt.default if not isinstance(opt.default, Path) else str(opt.default)
        help_text = f"{opt.help} [env {opt.env}; default: {default if default not in (None, []) else 'none'}]"
        parser.add_argument(opt.flag, action="append" if opt.repeat else "store", metavar=opt.metavar, help=help_text)


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeConfig:
    """Merge flags, environment and TOML file into a :class:`ServeConfig`."""
    values = resolve_values(args, OPTIONS, environ)
    if values["profile"] is None:
        recorded = recorded_profile(values["repository"]) if values["repository"] is not None else None
        values["profile"] = recorded or ServeConfig.profile
    config = ServeConfig(**values)
    if not config.upstream and config.repository is None:
        raise ConfigError("give --upstream URL (or --repository DIR for a local signed tree)")
    if config.upstream and config.repository is not None:
        raise ConfigError("--upstream and --repository exclude each other")
    _ = config.root_file  # --upstream without --root fails here, not later in a worker
    try:
        _ = config.layout
    except ValueError as e:
        raise ConfigError(f"--profile: {e}") from e
    if config.gateway_url is not None and not config.layout.miss_protocol:
        raise ConfigError(f"--gateway-url is for --profile gateway, not {config.profile}")
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
        file_values = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    unknown = set(file_values) - set(known)
    if unknown:
        raise ConfigError(f"unknown settings in {path}: {', '.join(sorted(unknown))}")
    return file_values


def resolve_values(args: argparse.Namespace, options: tuple[Option, ...], environ: Mapping[str, str] = os.environ,
                   file_values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Each option's value from flags, environment, TOML file or default (in that order), parsed.

    ``file_values`` is what :func:`read_config` read, when the caller reads the file for other settings too.
    """
    if file_values is None:
        file_values = read_config(args.config, (o.name for o in options))
    values: dict[str, Any] = {}
    for opt in options:
        given = getattr(args, opt.name, None)
        # Errors name the setting as it was given: the flag, the variable, or the file and key.
        if given is not None:
            raw, source = given, opt.flag
        elif opt.env in environ:
            raw, source = environ[opt.env], opt.env
        elif opt.name in file_values:
            raw, source = file_values[opt.name], f"{args.config}: {opt.name}"
            # TOML has types; a setting is text unless it is a list (repeatable settings).
            raw = raw if isinstance(raw, list) and opt.repeat else str(raw) if not isinstance(raw, date) else raw
        else:
            raw, source = opt.default, opt.flag
        try:
            if opt.repeat and isinstance(raw, list) and opt.parse is _url_list:  # others parse their own lists
                raw = [u for g in raw for u in _url_list(g)]
            values[opt.name] = opt.parse(raw) if raw is not None else None
        except (ConfigError, ValueError, TypeError) as e:
            raise ConfigError(f"{source}: {e}") from e
    return values
