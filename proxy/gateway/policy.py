"""The gateway's policy: what it may publish, decided before anything is signed.

Owns four decisions, all pure (no I/O; the time is passed in):

* **Cooldown**: which files of a project page are too new.  Ages use the
  grammar uv's ``exclude-newer`` accepts (jiff's "friendly" spans such as
  ``400d``, ``7 days``, ``1 week, 2 days``, ``24 hours``, ``12:00:00``, and
  ISO 8601 durations such as ``P7D`` and ``PT36H``, of which pip 26's
  ``--uploaded-prior-to`` takes ``P<n>D``).  A day is 24 hours; months and
  years have no fixed length and are refused, as uv refuses them.  A file
  is kept only if it was uploaded strictly before the cut-off (uv drops a
  file uploaded at its ``exclude-newer`` time itself).  The index's
  ``upload-time`` is only a claim: with ``first_seen_cooldown`` a file
  counts as uploaded no earlier than this gateway first saw it
  (:meth:`Policy.counts_from`), so an index cannot make a new file look old.
* **Project rules**: allow and deny globs on PEP 503-normalised names.
* **Several indexes, first match wins** (uv's ``first-index``), with names
  claimed private that only the first index may ever supply, and the
  ledger's memory of where a project came from.
* **Advisory rules**: whether OSV advisories block malicious releases,
  vulnerable ones from which severity up, and the advisories accepted
  anyway (the matching itself is :mod:`proxy.protocol.osv`).
* **Settings**: the flags, ``TUFPROXY_*`` variables and TOML keys above,
  parsed all-or-nothing, and a description of the effective policy.

The gateway turns a :class:`Refusal` into its HTTP answer, audit record and
metric; this module only says which rule decided and why.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import fnmatch
import functools
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from packaging.utils import (
    InvalidName,
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from proxy.protocol.access import not_listed
from proxy.protocol.errors import Fault
from proxy.protocol.index import ProjectPage
from proxy.protocol.options import ConfigError, Option, add_options, resolve_values, yes_no
from proxy.protocol.osv import Rules, parse_level

# Rule slugs: audit records and metric labels (a bounded set).
RULE_MIN_RELEASE_AGE = "min-release-age"
RULE_UPLOADED_BEFORE = "uploaded-before"
RULE_PROJECT_AGE = "project-age"
RULE_MISSING_UPLOAD_TIME = "missing-upload-time"
RULE_FIRST_SEEN = "first-seen"  # old enough by the index's claim, not since this gateway first saw it
RULE_DENY = "deny-project"
RULE_ALLOW = "allow-project"
RULE_PRIVATE = "private-project"
RULE_FIRST_INDEX = "first-index"

# The rules that hide files from a page (the hidden-files metric's label values).
FILE_RULES = (RULE_MIN_RELEASE_AGE, RULE_UPLOADED_BEFORE, RULE_PROJECT_AGE, RULE_MISSING_UPLOAD_TIME, RULE_FIRST_SEEN)
FIRST_SEEN_MODES = ("yes", "no", "all")

DENIED = "denied by policy"
# An age beyond this is a typo, and "now - age" must stay a valid datetime.
MAX_AGE = timedelta(days=365_000)
_MAX_AGE_NS = MAX_AGE // timedelta(microseconds=1) * 1000
MAX_PATTERN_LENGTH = 200


class PolicyError(ConfigError):
    """A policy setting is unusable; the message names the flag, variable or key."""


# ---------------------------------------------------------------- ages

_SECOND = 10**9  # in nanoseconds, the unit of every sum below
# jiff's friendly designators, largest unit first; rank orders them.
_UNITS: tuple[tuple[str, tuple[str, ...], int | None], ...] = (
    ("years", ("years", "year", "yrs", "yr", "y"), None),
    ("months", ("months", "month", "mos", "mo"), None),
    ("weeks", ("weeks", "week", "wks", "wk", "w"), 7 * 86400 * _SECOND),
    ("days", ("days", "day", "d"), 86400 * _SECOND),
    ("hours", ("hours", "hour", "hrs", "hr", "h"), 3600 * _SECOND),
    ("minutes", ("minutes", "minute", "mins", "min", "m"), 60 * _SECOND),
    ("seconds", ("seconds", "second", "secs", "sec", "s"), _SECOND),
    ("milliseconds", ("milliseconds", "millisecond", "millis", "milli", "msecs", "msec", "ms"), 10**6),
    ("microseconds", ("microseconds", "microsecond", "micros", "micro", "usecs", "usec", "\u00b5secs",
                      "\u00b5sec", "us", "\u00b5s"), 10**3),
    ("nanoseconds", ("nanoseconds", "nanosecond", "nanos", "nano", "nsecs", "nsec", "ns"), 1),
)
_LABELS = {label: (rank, unit, ns) for rank, (unit, labels, ns) in enumerate(_UNITS) for label in labels}
_RANK_HOURS = 4
_WS = "[ \t\n\f\r]"
_FRIENDLY_UNIT_RE = re.compile(rf"([0-9]{{1,20}})(?:[.,]([0-9]{{1,9}}))?{_WS}*([a-z\u00b5]+)")
_HMS_RE = re.compile(r"([0-9]{1,20}):([0-9]{1,20}):([0-9]{1,20})(?:[.,]([0-9]{1,9}))?")
_ISO_RE = re.compile(
    r"[+-]?[Pp](?:(?P<years>[0-9]{1,20})[Yy])?(?:(?P<months>[0-9]{1,20})[Mm])?"
    r"(?:(?P<weeks>[0-9]{1,20})[Ww])?(?:(?P<days>[0-9]{1,20})[Dd])?"
    r"(?P<t>[Tt](?:(?P<hours>[0-9]{1,20})(?:[.,](?P<hours_f>[0-9]{1,9}))?[Hh])?"
    r"(?:(?P<minutes>[0-9]{1,20})(?:[.,](?P<minutes_f>[0-9]{1,9}))?[Mm])?"
    r"(?:(?P<seconds>[0-9]{1,20})(?:[.,](?P<seconds_f>[0-9]{1,9}))?[Ss])?)?"
)
_SEPARATOR_RE = re.compile(rf",{_WS}+|{_WS}*")
_AGE_HINT = "try 400d, 7 days, 24 hours, P7D or PT36H"


def _fraction_ns(digits: str | None, unit_ns: int) -> int:
    return int(digits.ljust(9, "0")) * unit_ns // 10**9 if digits else 0


def _calendar_refusal(text: str, unit: str, count: int) -> PolicyError:
    per = 365 if unit == "years" else 30
    return PolicyError(f"{text!r} uses {unit}, which have no fixed length and are not allowed; "
                       f"use days instead, e.g. '{max(count, 1) * per} days'")


def _friendly_ns(text: str) -> int:
    """jiff's friendly span grammar (the form uv documents: ``7 days``, ``24 hours``)."""
    rest = text
    # A sign or a trailing "ago" (not both) only makes the span negative.
    rest = text[1:] if text[:1] in "+-" else re.sub(rf"{_WS}+ago$", "", text)
    total, last_rank, pos, closed = 0, -1, 0, False
    while pos < len(rest):
        if closed:
            raise PolicyError(f"{text!r}: nothing may follow a fraction or HH:MM:SS ({_AGE_HINT})")
        hms = _HMS_RE.match(rest, pos)
        if hms and last_rank < _RANK_HOURS and hms.end() == len(rest):
            h, m, s, frac = hms.groups()
            total += (int(h) * 3600 + int(m) * 60 + int(s)) * _SECOND + _fraction_ns(frac, _SECOND)
            pos, closed = hms.end(), True
            continue
        unit_match = _FRIENDLY_UNIT_RE.match(rest, pos)
        if not unit_match:
            raise PolicyError(f"{text!r} is not a duration ({_AGE_HINT})")
        number, frac, label = unit_match.groups()
        if label not in _LABELS:
            raise PolicyError(f"{text!r}: unknown unit {label!r} ({_AGE_HINT})")
        rank, unit, unit_ns = _LABELS[label]
        if rank <= last_rank:
            raise PolicyError(f"{text!r}: units must appear once each, largest first ({_AGE_HINT})")
        if unit_ns is None:
            raise _calendar_refusal(text, unit, int(number))
        if frac is not None and rank < _RANK_HOURS:
            raise PolicyError(f"{text!r}: only hours and smaller units take a fraction ({_AGE_HINT})")
        total += int(number) * unit_ns + _fraction_ns(frac, unit_ns)
        last_rank, pos, closed = rank, unit_match.end(), frac is not None
        pos = _SEPARATOR_RE.match(rest, pos).end()  # type: ignore[union-attr]  # it matches ""
    if last_rank < 0 and not closed:
        raise PolicyError(f"{text!r} is not a duration ({_AGE_HINT})")
    return total


def _iso_ns(text: str) -> int:
    """ISO 8601 durations as jiff reads them (``P7D``, ``PT36H``, ``P1W2DT3.5H``)."""
    match = _ISO_RE.fullmatch(text)
    if not match:
        raise PolicyError(f"{text!r} is not an ISO 8601 duration ({_AGE_HINT})")
    parts = match.groupdict()
    present = [u for u in ("years", "months", "weeks", "days", "hours", "minutes", "seconds") if parts[u] is not None]
    if not present or (parts["t"] is not None and not set(present) & {"hours", "minutes", "seconds"}):
        raise PolicyError(f"{text!r} is not an ISO 8601 duration: it names no unit ({_AGE_HINT})")
    for unit in ("years", "months"):
        if parts[unit] is not None and int(parts[unit]):
            raise _calendar_refusal(text, unit, int(parts[unit]))
    fractions = [u for u in ("hours", "minutes", "seconds") if parts[f"{u}_f"] is not None]
    if fractions and fractions[0] != present[-1]:
        raise PolicyError(f"{text!r}: only the last unit may take a fraction ({_AGE_HINT})")
    total = 0
    for unit, _labels, unit_ns in _UNITS:
        if unit in present and unit_ns is not None:
            total += int(parts[unit]) * unit_ns + _fraction_ns(parts.get(f"{unit}_f"), unit_ns)
    return total


def parse_age(value: Any) -> timedelta:
    """A release age as uv's ``exclude-newer`` and pip's ``--uploaded-prior-to`` spell durations.

    The sign and a trailing ``ago`` are accepted and ignored, as uv takes the
    span's absolute value.  Sub-microsecond parts are dropped.
    """
    if isinstance(value, timedelta):
        ns = abs(value) // timedelta(microseconds=1) * 1000
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise PolicyError(f"empty age ({_AGE_HINT})")
        ns = _iso_ns(text) if text.lstrip("+-")[:1] in ("P", "p") else _friendly_ns(text)
    else:
        raise PolicyError(f"an age is a string, not {type(value).__name__} {value!r} ({_AGE_HINT})")
    if ns > _MAX_AGE_NS:
        raise PolicyError(f"{value!r} is too long an age (at most {MAX_AGE.days} days)")
    return timedelta(microseconds=ns // 1000)


def format_age(age: timedelta) -> str:
    """``400 days``, ``1 day 12 hours``, ``0 seconds``: what people read."""
    seconds = int(age.total_seconds())
    parts = []
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {name}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


def iso_age(age: timedelta) -> str:
    """The ISO 8601 form (``P400D``, ``PT36H``), which :func:`parse_age` reads back."""
    days, rest = age.days, age - timedelta(days=age.days)
    hours, rest_s = divmod(int(rest.total_seconds()), 3600)
    minutes, seconds = divmod(rest_s, 60)
    micros = rest.microseconds
    clock = "".join(f"{n}{u}" for n, u in ((hours, "H"), (minutes, "M")) if n)
    if seconds or micros:
        clock += f"{seconds}.{micros:06d}".rstrip("0").rstrip(".") + "S"
    if days or not clock:
        return f"P{days}D" + (f"T{clock}" if clock else "")
    return f"PT{clock}"


# ---------------------------------------------------------------- timestamps

_RFC3339_RE = re.compile(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def parse_timestamp(value: Any) -> datetime:
    """An RFC 3339 date-time with its UTC offset (TOML offset date-times too), in UTC."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, (datetime, date)):
        raise PolicyError(f"{value.isoformat()!r} has no UTC offset; write e.g. 2025-01-31T00:00:00Z")
    match = _RFC3339_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if not match:
        raise PolicyError(f"{value!r} is not an RFC 3339 timestamp; write e.g. 2025-01-31T00:00:00Z")
    day, clock, fraction, offset = match.groups()
    text = f"{day}T{clock}{'.' + (fraction + '00000')[:6] if fraction else ''}{'+00:00' if offset in 'Zz' else offset}"
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError as e:
        raise PolicyError(f"{value!r} is not a valid time: {e}") from None


def format_timestamp(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _upload_time(value: str | None) -> datetime | None:
    """PEP 700 ``upload-time``; None when absent or unreadable (both count as missing)."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


# ---------------------------------------------------------------- names and patterns

_PATTERN_RE = re.compile(r"[A-Za-z0-9._*?-]+")


def parse_pattern(value: Any) -> str:
    """A glob on PEP 503-normalised names: name characters with ``*`` and ``?``."""
    if not isinstance(value, str) or not _PATTERN_RE.fullmatch(value.strip()) or len(value) > MAX_PATTERN_LENGTH:
        raise PolicyError(f"{value!r} is not a project-name pattern "
                          "(letters, digits, '.', '_' and '-', with * and ? as wildcards)")
    return canonicalize_name(value.strip())


def _split_list(value: Any) -> list[Any]:
    """A TOML list or a repeated flag as given; an env var split on commas and whitespace."""
    if isinstance(value, str):
        return [item for item in re.split(r"[\s,]+", value.strip()) if item]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise PolicyError(f"expected a list of patterns, not {type(value).__name__} {value!r}")


def parse_patterns(value: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(parse_pattern(item) for item in _split_list(value)))


def parse_project_name(value: Any) -> str:
    try:
        if isinstance(value, str):
            return canonicalize_name(value.strip(), validate=True)
    except InvalidName:
        pass
    raise PolicyError(f"{value!r} is not a project name")


def parse_project_ages(value: Any) -> dict[str, timedelta]:
    """TOML ``{name = "30 days"}``, repeated ``--project-age NAME=AGE``, or ``NAME=AGE,NAME=AGE``."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        if isinstance(value, str):
            # Ages may hold commas ("1 week, 2 days"): split only before "name=".
            value = re.split(r",\s*(?=[A-Za-z0-9._-]+\s*=)", value.strip()) if value.strip() else []
        pairs = []
        for item in _split_list(value):
            name, sep, age = str(item).partition("=")
            if not sep:
                raise PolicyError(f"{item!r} is not NAME=AGE")
            pairs.append((name.strip(), age))
    ages: dict[str, timedelta] = {}
    for name, age in pairs:
        key = parse_project_name(name)
        if key in ages:
            raise PolicyError(f"{name!r} is given twice (names are compared normalised)")
        try:
            ages[key] = parse_age(age)
        except PolicyError as e:
            raise PolicyError(f"{name}: {e}") from None
    return ages


def parse_missing_upload_time(value: Any) -> str:
    if value not in ("exclude", "include"):
        raise PolicyError(f"{value!r} is not exclude or include")
    return str(value)


def parse_advisory_ids(value: Any) -> tuple[str, ...]:
    ids = [str(item).strip() for item in _split_list(value)]
    bad = [i for i in ids if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", i)]
    if bad:
        raise PolicyError(f"{bad[0]!r} is not an advisory id (e.g. PYSEC-2024-1, GHSA-xxxx-xxxx-xxxx, CVE-2024-1)")
    return tuple(dict.fromkeys(ids))


def parse_first_seen_cooldown(value: Any) -> str:
    word = str(value).strip().lower() if isinstance(value, (str, bool)) else value
    word = {"true": "yes", "false": "no"}.get(str(word), word)
    if word not in FIRST_SEEN_MODES:
        raise PolicyError(f"{value!r} is not yes, no or all")
    return str(word)


def _first_match(name: str, patterns: Iterable[str]) -> str | None:
    return next((p for p in patterns if fnmatch.fnmatchcase(name, p)), None)


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Refusal:
    """Why a project is not published: the rule that decided and one line for people."""

    kind: Fault  # NOT_FOUND (denied, or no index may supply it: 404) or UPSTREAM (the index that must answer did not)
    rule: str
    message: str


class IndexState(enum.Enum):
    """What asking one index for a project's page found."""

    LISTED = "listed"
    ABSENT = "absent"  # a clean 404
    UNREACHABLE = "unreachable"  # no usable answer


@dataclass(frozen=True)
class IndexChoice:
    """Exactly one of: use ``index``; ``probe`` that index and ask again; or a ``refusal``."""

    index: int | None = None
    probe: int | None = None
    refusal: Refusal | None = None


@dataclass(frozen=True)
class Cutoff:
    """Files uploaded at or after ``when`` are left out, by ``rule``."""

    when: datetime
    rule: str


@dataclass(frozen=True)
class Hidden:
    """One file the policy left out of a page, and the rule that did."""

    filename: str
    rule: str
    upload_time: str | None


@dataclass(frozen=True)
class Trimmed:
    """A page after the policy: what to sign, and what was left out of it."""

    page: ProjectPage
    hidden: tuple[Hidden, ...] = ()
    cutoff: Cutoff | None = None

    def by_rule(self) -> Counter[str]:
        """Hidden files counted by rule (the metric's increments)."""
        return Counter(h.rule for h in self.hidden)

    def audit_fields(self, max_names: int = 50) -> dict[str, Any]:
        """The fields of this page's one audit record; long lists are cut to a count."""
        names = [h.filename for h in self.hidden]
        return {
            "project": self.page.name,
            "hidden_count": len(names),
            "hidden_files": names[:max_names],
            "rules": dict(sorted(self.by_rule().items())),
            "cutoff": format_timestamp(self.cutoff.when) if self.cutoff else None,
        }


def _file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _version_key(text: str) -> Version | str:
    try:
        return Version(text)
    except InvalidVersion:
        return text


@dataclass(frozen=True)
class Policy:
    """The effective policy of one gateway; build it with :func:`resolve_policy`."""

    min_release_age: timedelta | None = None
    uploaded_before: datetime | None = None
    project_age: Mapping[str, timedelta] = field(default_factory=dict)
    cooldown_exempt: tuple[str, ...] = ()
    missing_upload_time: str = "exclude"
    first_seen_cooldown: str = "yes"
    allow_project: tuple[str, ...] = ()
    deny_project: tuple[str, ...] = ()
    private_project: tuple[str, ...] = ()
    block_malicious: bool = True
    block_vulnerable: str = "none"
    allow_advisory: tuple[str, ...] = ()

    @functools.cached_property
    def advisory_rules(self) -> Rules:
        """The advisory settings as :mod:`proxy.protocol.osv` applies them (built once: asked per file)."""
        return Rules(self.block_malicious, self.block_vulnerable, frozenset(self.allow_advisory))

    # -------------------------------------------------------- projects

    def admit(self, project: str) -> Refusal | None:
        """None if the project may be published; else why not (deny beats allow)."""
        name = canonicalize_name(project)
        denied = _first_match(name, self.deny_project)
        if denied is not None:
            return Refusal(Fault.NOT_FOUND, RULE_DENY, f"{name}: {DENIED} (deny-project {denied!r})")
        if self.allow_project and _first_match(name, self.allow_project) is None:
            return Refusal(Fault.NOT_FOUND, RULE_ALLOW, f"{name}: {DENIED} (not on the allow-project list)")
        return None

    def claimed_private(self, project: str) -> str | None:
        """The private-project pattern that claims this name, if any."""
        return _first_match(canonicalize_name(project), self.private_project)

    def choose_index(self, project: str, states: Sequence[IndexState | None], served_from: int | None) -> IndexChoice:
        """Which index supplies ``project``: the first that lists it (uv's ``first-index``), never a merge.

        ``states[i]`` is what asking index ``i`` found, None if not asked yet
        (the answer is then "probe i", so indexes are asked lazily, in
        order).  ``served_from`` is the index the ledger says published the
        project before (out of range: an index no longer configured, which
        no other index replaces).  Only some indexes are candidates: a name claimed
        private, the first index alone; else a project the ledger knows,
        the index it came from alone; else every index in order.  An
        unreachable candidate ends the search: it may list the project, so
        a later index never answers for it.
        """
        name = canonicalize_name(project)
        claim = self.claimed_private(name)
        if claim is not None:
            candidates: Sequence[int] = (0,)
        elif served_from is not None:
            candidates = (served_from,) if 0 <= served_from < len(states) else ()
        else:
            candidates = range(len(states))
        for i in candidates:
            state = states[i]
            if state is None:
                return IndexChoice(probe=i)
            if state is IndexState.LISTED:
                return IndexChoice(index=i)
            if state is IndexState.UNREACHABLE:
                return IndexChoice(refusal=Refusal(
                    Fault.UPSTREAM, RULE_FIRST_INDEX,
                    f"{name}: index {i + 1} is unreachable and no other index may answer for it"))
        if claim is not None:
            why = f"claimed private (private-project {claim!r}) and the first index does not list it"
            return IndexChoice(refusal=Refusal(Fault.NOT_FOUND, RULE_PRIVATE,
                                               f"{name}: {why}; never taken from another index"))
        if served_from is not None:
            gone = "no longer lists it" if candidates else "is no longer configured"
            why = f"index {served_from + 1}, which published it, {gone}; never taken from another index"
            return IndexChoice(refusal=Refusal(Fault.NOT_FOUND, RULE_FIRST_INDEX, f"{name}: {why}"))
        return IndexChoice(refusal=Refusal(Fault.NOT_FOUND, RULE_FIRST_INDEX, not_listed(name)))

    # -------------------------------------------------------- files

    def cutoff(self, project: str, now: datetime) -> Cutoff | None:
        """The upload-time cut-off for ``project`` at ``now``, or None when no cooldown applies.

        An exempt project has none; a per-project age replaces both global
        settings (as uv's ``exclude-newer-package`` does); otherwise the
        earlier of ``now - min_release_age`` and ``uploaded_before`` wins.
        """
        name = canonicalize_name(project)
        if _first_match(name, self.cooldown_exempt) is not None:
            return None
        if name in self.project_age:
            return Cutoff(now - self.project_age[name], RULE_PROJECT_AGE)
        candidates = []
        if self.min_release_age is not None:
            candidates.append(Cutoff(now - self.min_release_age, RULE_MIN_RELEASE_AGE))
        if self.uploaded_before is not None:
            candidates.append(Cutoff(self.uploaded_before, RULE_UPLOADED_BEFORE))
        return min(candidates, key=lambda c: c.when, default=None)

    def counts_from(self, upload_time: str | None, seen: datetime, listed_before: bool) -> datetime | None:
        """When a file first seen at ``seen`` counts as uploaded, fixed at that first sight.

        The later of the index's claimed ``upload_time`` and ``seen`` for a
        file absent from the project's earlier listings (``listed_before``),
        and with ``first_seen_cooldown = all`` for a project's first listing
        too; otherwise (``no``, or a project this gateway never listed) the
        claim alone, the index's word.  None: no claim to go by.
        """
        claim = _upload_time(upload_time)
        if self.first_seen_cooldown == "no" or (self.first_seen_cooldown == "yes" and not listed_before):
            return claim
        return seen if claim is None else max(claim, seen)

    def apply(self, page: ProjectPage, now: datetime, counted: Mapping[str, datetime | None] | None = None) -> Trimmed:
        """The page with too-new files left out and PEP 700 ``versions`` to match.

        ``counted`` is what :meth:`counts_from` fixed at each file's first
        sight: a file counts as uploaded at the later of that and its claimed
        upload-time now (a claim moved back later changes nothing).
        A version drops out of ``versions`` when the policy hid every file of
        it; versions the index lists with no file at all are left alone.
        The page is returned unchanged (the same object) when nothing is hidden.
        """
        cut = self.cutoff(page.name, now)
        if cut is None:
            return Trimmed(page)
        counted = counted or {}
        kept, hidden = [], []
        for dist in page.files:
            claim = _upload_time(dist.upload_time)
            first = counted.get(dist.filename)
            uploaded = max(claim, first) if claim is not None and first is not None else claim
            if uploaded is None and first is not None and self.missing_upload_time == "include":
                uploaded = first
            if uploaded is None:
                if self.missing_upload_time == "include":
                    kept.append(dist)
                else:
                    hidden.append(Hidden(dist.filename, RULE_MISSING_UPLOAD_TIME, dist.upload_time))
            elif uploaded < cut.when:
                kept.append(dist)
            else:
                rule = RULE_FIRST_SEEN if claim is not None and claim < cut.when else cut.rule
                hidden.append(Hidden(dist.filename, rule, dist.upload_time))
        if not hidden:
            return Trimmed(page, cutoff=cut)
        remaining = {_file_version(d.filename) for d in kept}
        emptied = {_file_version(h.filename) for h in hidden} - remaining - {None}
        versions = tuple(v for v in page.versions if _version_key(v) not in emptied)
        return Trimmed(dataclasses.replace(page, files=tuple(kept), versions=versions), tuple(hidden), cut)

    # -------------------------------------------------------- description

    def to_json(self) -> dict[str, Any]:
        """The policy as TOML-key -> value, which :func:`resolve_policy` reads back."""
        return {
            "min_release_age": iso_age(self.min_release_age) if self.min_release_age is not None else None,
            "uploaded_before": format_timestamp(self.uploaded_before) if self.uploaded_before else None,
            "project_age": {name: iso_age(age) for name, age in sorted(self.project_age.items())},
            "cooldown_exempt": list(self.cooldown_exempt),
            "missing_upload_time": self.missing_upload_time,
            "first_seen_cooldown": self.first_seen_cooldown,
            "allow_project": list(self.allow_project),
            "deny_project": list(self.deny_project),
            "private_project": list(self.private_project),
            "block_malicious": "yes" if self.block_malicious else "no",
            "block_vulnerable": self.block_vulnerable,
            "allow_advisory": list(self.allow_advisory),
        }

    def describe(self, now: datetime | None = None) -> str:
        """The effective policy for people, one setting a line (cut-offs at ``now`` if given)."""
        def listed(items: Iterable[str], empty: str = "none") -> str:
            return ", ".join(items) or empty

        age = "none"
        if self.min_release_age is not None:
            age = format_age(self.min_release_age)
            if now is not None:
                cut = (now - self.min_release_age).replace(microsecond=0)
                age += f" (files uploaded before {format_timestamp(cut)} now)"
        ages = ", ".join(f"{n} {format_age(a)}" for n, a in sorted(self.project_age.items()))
        return "\n".join([
            f"min-release-age: {age}",
            f"uploaded-before: {format_timestamp(self.uploaded_before) if self.uploaded_before else 'none'}",
            f"project-age: {ages or 'none'}",
            f"cooldown-exempt: {listed(self.cooldown_exempt)}",
            f"missing-upload-time: {self.missing_upload_time}",
            f"first-seen-cooldown: {self.first_seen_cooldown} ({FIRST_SEEN_TRUST[self.first_seen_cooldown]})",
            f"allow-project: {listed(self.allow_project, 'all projects')}",
            f"deny-project: {listed(self.deny_project)}",
            f"private-project (first index only): {listed(self.private_project)}",
            f"block-malicious (OSV advisories): {'yes' if self.block_malicious else 'no'}",
            f"block-vulnerable (from severity): {self.block_vulnerable}",
            f"allow-advisory: {listed(self.allow_advisory)}",
        ])


# ---------------------------------------------------------------- settings

# What each --first-seen-cooldown trusts, for the start-up description and `tufproxy gateway policy`.
FIRST_SEEN_TRUST = {
    "yes": "a file new to a project this gateway listed before counts from when it was first seen here, "
           "whatever upload-time the index claims; a project's first listing is taken at the index's word",
    "no": "the index's upload-time alone, as first claimed",
    "all": "every file counts from when this gateway first saw it, a project's first listing included",
}

POLICY_OPTIONS: tuple[Option, ...] = (
    Option("min_release_age", "leave out files uploaded less than AGE ago (400d, '7 days', '24 hours', P7D, PT36H; "
           "a day is 24 h; months and years are refused)", None, parse_age, metavar="AGE"),
    Option("uploaded_before", "leave out files uploaded at or after this RFC 3339 time (2025-01-31T00:00:00Z); "
           "with --min-release-age the earlier cut-off wins", None, parse_timestamp, metavar="TIMESTAMP"),
    Option("project_age", "a project's own release age, replacing both cut-offs for it; repeatable "
           "(TOML: a table, project_age = {name = '30 days'})", {}, parse_project_ages, repeat=True,
           metavar="NAME=AGE"),
    Option("cooldown_exempt", "projects no cooldown applies to (glob on normalised names, * and ?); repeatable",
           [], parse_patterns, repeat=True, metavar="PATTERN"),
    Option("missing_upload_time", "a file with no upload-time under a cooldown: exclude (as uv does) or include",
           "exclude", parse_missing_upload_time, metavar="exclude|include"),
    Option("first_seen_cooldown", "measure a file's age from the later of its claimed upload-time and when this "
           "gateway first saw it: yes (files new to a project listed before), all (a project's first listing too) "
           "or no (the index's claim alone)", "yes", parse_first_seen_cooldown, metavar="yes|no|all"),
    Option("allow_project", "publish only projects matching one of these globs; repeatable",
           [], parse_patterns, repeat=True, metavar="PATTERN", shown="every project"),
    Option("deny_project", "never publish projects matching these globs (404 'denied by policy'); "
           "beats --allow-project; repeatable", [], parse_patterns, repeat=True, metavar="PATTERN"),
    Option("private_project", "names only the first --index-url may supply; if it lacks one, 404, never "
           "another index's package of that name; repeatable", [], parse_patterns, repeat=True, metavar="PATTERN"),
    Option("block_malicious", "leave out files an imported OSV advisory calls malicious (MAL- ids, the "
           "malicious-packages origin)", "yes", yes_no, metavar="yes|no"),
    Option("block_vulnerable", "leave out files with an imported OSV advisory of this severity or higher "
           "(CVSS base score, else the advisory's own rating)", "none", parse_level,
           metavar="none|low|medium|high|critical"),
    Option("allow_advisory", "an advisory id (or alias) whose risk the organisation accepts: its files stay, each with an "
           "advisory-allowed audit record; repeatable", [], parse_advisory_ids, repeat=True, metavar="ID"),
)
POLICY_KEYS = frozenset(opt.name for opt in POLICY_OPTIONS)


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy flags, in their own ``--help`` group (defaults stay None: we tell what was given)."""
    add_options(parser.add_argument_group("policy (applied before signing; flags beat TUFPROXY_* variables beat "
                                          "the TOML file)"), POLICY_OPTIONS)


def resolve_policy(args: argparse.Namespace | None = None, environ: Mapping[str, str] = os.environ,
                   file_values: Mapping[str, Any] | None = None, file_label: str = "the config file") -> Policy:
    """Flags, then ``TUFPROXY_*`` variables, then ``file_values`` (the TOML file's keys), then defaults.

    The one resolver (:func:`proxy.protocol.options.resolve_values`): all
    settings are parsed before any is used; the first unusable one raises
    :class:`PolicyError` naming where it came from, and nothing is applied.
    """
    try:
        values = resolve_values(args, POLICY_OPTIONS, environ, file_values or {}, file_label)
    except ConfigError as e:
        raise PolicyError(str(e)) from e
    return Policy(**values)
