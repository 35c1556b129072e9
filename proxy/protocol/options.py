"""The one option resolver of every subcommand: flag > ``TUFPROXY_*`` variable > TOML file > default.

A subcommand declares its settings once, as a table of :class:`Option`;
:func:`add_options` makes the flags, :func:`load_config` reads the TOML
text (:func:`proxy.serving.config.read_config` reads the file), and
:func:`resolve_values` picks and parses each value.  The rules, the same
for ``serve``, ``gateway serve`` and whatever declares options:

* A flag beats its ``TUFPROXY_<NAME>`` variable, which beats the file's
  ``<name>`` key, which beats the default.  A key the file has that no
  table declares is refused, as is a file that is not TOML.
* Flags and variables are text; a TOML value reaches the parser with its
  TOML type (a date stays a date, a table a table), so each parser takes
  text and the TOML types it makes sense for.  A TOML list or table is
  refused for a setting that takes one value.
* Every setting is parsed before any is used; the first unusable one is a
  :class:`ConfigError` naming where the value came from, as the user wrote
  it: ``--flag: why``, ``TUFPROXY_NAME: why`` or ``FILE: key: why``.

The value parsers every table shares live here too.  Pure: no I/O.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, TypeVar

from proxy.protocol.errors import Fault

T = TypeVar("T")

__all__ = [
    "ENV_PREFIX",
    "ConfigError",
    "Option",
    "add_options",
    "load_config",
    "non_negative_int",
    "parse_datetime",
    "parse_listen",
    "parse_size",
    "parsed",
    "positive_float",
    "positive_int",
    "resolve_values",
    "url",
    "url_list",
    "worker_count",
    "yes_no",
]

ENV_PREFIX = "TUFPROXY_"


class ConfigError(ValueError):
    """A setting has a value we cannot use."""

    reason = "bad-configuration"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class Option:
    """One setting: its flag, its env var, its TOML key, its parser."""

    name: str
    help: str
    default: Any = None
    parse: Callable[[Any], Any] = str
    repeat: bool = False
    metavar: str | None = None
    # What --help says the default is, where it is not a value (what happens without the setting).
    shown: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option]) -> None:
    """Every option as a flag whose help names its variable and default (flags default to None: unset)."""
    for opt in options:
        parser.add_argument(opt.flag, action="append" if opt.repeat else "store", metavar=opt.metavar,
                            help=f"{opt.help} [env {opt.env}; default: {shown_default(opt)}]")


def shown_default(opt: Option) -> str:
    """The default as ``--help`` shows it: what happens when the setting is not given."""
    if opt.shown is not None:
        return opt.shown
    if isinstance(opt.default, bool):
        return "yes" if opt.default else "no"
    return "none" if opt.default in (None, [], {}) else str(opt.default)


def load_config(text: str, label: str, known: Iterable[str]) -> dict[str, Any]:
    """The settings of TOML ``text`` (the file ``label``); a key not in ``known`` is an error."""
    try:
        file_values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"cannot read config file {label}: {e}") from e
    unknown = set(file_values) - set(known)
    if unknown:
        raise ConfigError(f"unknown settings in {label}: {', '.join(sorted(unknown))}")
    return file_values


def resolve_values(args: argparse.Namespace | None, options: Iterable[Option], environ: Mapping[str, str],
                   file_values: Mapping[str, Any], file_label: str = "the config file") -> dict[str, Any]:
    """Each option's value from its flag, variable, TOML key or default (in that order), parsed.

    ``file_values`` is what :func:`load_config` read from the file ``file_label``.
    """
    values: dict[str, Any] = {}
    for opt in options:
        given = getattr(args, opt.name, None)
        if given is not None:
            raw, source = given, opt.flag
        elif opt.env in environ:
            raw, source = environ[opt.env], opt.env
        elif opt.name in file_values:
            raw, source = file_values[opt.name], f"{file_label}: {opt.name}"
            if not opt.repeat and isinstance(raw, (list, dict)):
                kind = "list" if isinstance(raw, list) else "table"
                raise ConfigError(f"{source}: takes one value, not a {kind}")
        else:
            raw, source = opt.default, opt.flag
        values[opt.name] = parsed(source, opt.parse, raw) if raw is not None else None
    return values


def parsed(source: str, parse: Callable[[Any], T], raw: Any) -> T:
    """``parse(raw)``, its error worded as every setting's: ``SOURCE: why`` (for a flag no table declares)."""
    try:
        return parse(raw)
    except (ValueError, TypeError) as e:  # ConfigError is a ValueError
        raise ConfigError(f"{source}: {e}") from e


# ---------------------------------------------------------------- value parsers


def _text(value: Any, wants: str) -> str:
    """``value`` if it is text; TOML's other types are refused naming what the setting wants."""
    if isinstance(value, str):
        return value
    raise ConfigError(f"wants {wants}, not {type(value).__name__} {value!r}")


def _number(value: Any) -> None:
    """Refuse a TOML boolean where a number is wanted (Python's bool is an int: ``true`` would read as 1)."""
    if isinstance(value, bool):
        raise ConfigError(f"wants a number, not {str(value).lower()}")


def parse_size(value: Any) -> int:
    """``10G``, ``512M``, ``1.5T`` or a plain byte count."""
    _number(value)
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if not m:
        raise ConfigError(f"not a size: {value!r} (try 512M, 10G)")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def parse_listen(value: Any) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6)."""
    text = _text(value, "HOST:PORT")
    m = re.fullmatch(r"\[?([^\]]*)\]?:(\d{1,5})", text.strip())
    if not m or not 0 <= int(m.group(2)) <= 65535:
        raise ConfigError(f"wants HOST:PORT, not {value!r}")
    return m.group(1) or "127.0.0.1", int(m.group(2))


def _whole(value: Any) -> int | None:
    """``value`` as a whole number (text or TOML integer), None if it is not one."""
    _number(value)
    try:
        n = int(value)
    except (ValueError, TypeError):
        return None
    return n if n == value or str(n) == str(value).strip() else None


def worker_count(value: Any) -> int:
    """A number of worker processes, 1 to 256."""
    n = _whole(value)
    if n is None or not 1 <= n <= 256:
        raise ConfigError(f"wants a whole number from 1 to 256, not {value!r}")
    return n


def yes_no(value: Any) -> bool:
    """``yes``/``no`` (and 1/0, true/false, on/off; a TOML boolean)."""
    word = str(value).strip().lower()
    if word in ("1", "yes", "true", "on"):
        return True
    if word in ("0", "no", "false", "off"):
        return False
    raise ConfigError(f"wants yes or no, not {value!r}")


def positive_int(value: Any) -> int:
    """A whole number, 1 or more."""
    n = _whole(value)
    if n is None or n < 1:
        raise ConfigError(f"must be 1 or more: {value!r}")
    return n


def non_negative_int(value: Any) -> int:
    """A whole number, 0 or more (0 usually meaning: no limit)."""
    n = _whole(value)
    if n is None or n < 0:
        raise ConfigError(f"must be 0 or more: {value!r}")
    return n


def positive_float(value: Any) -> float:
    """A number more than 0."""
    _number(value)
    try:
        f = float(value)
    except (ValueError, TypeError):
        f = 0.0
    if not f > 0:
        raise ConfigError(f"wants a number more than 0, not {value!r}")
    return f


def parse_datetime(value: Any) -> datetime:
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


def url_list(value: Any) -> list[str]:
    """http(s) URLs, each ending in ``/``: a list (repeated flags, TOML), or text split on commas and spaces."""
    items = value if isinstance(value, list) else [_text(value, "http(s) URLs")]
    urls = [u if u.endswith("/") else f"{u}/" for item in items
            for u in re.split(r"[\s,]+", _text(item, "an http(s) URL").strip()) if u]
    for u in urls:
        if not re.match(r"https?://", u):
            raise ConfigError(f"not an http(s) URL: {u!r}")
    return urls


def url(value: Any) -> str:
    """One http(s) URL, ending in ``/``."""
    urls = url_list(_text(value, "an http(s) URL"))
    if len(urls) != 1:
        raise ConfigError(f"not one http(s) URL: {value!r}")
    return urls[0]
