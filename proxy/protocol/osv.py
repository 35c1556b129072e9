"""OSV advisories for PyPI: parse records, and say which files of a project they block.

Owns the reading of the OSV schema (https://ossf.github.io/osv-schema/) as far as a
Python package firewall needs it, and the blocking decision, with no I/O:

* :func:`parse_record` turns one OSV JSON record into an :class:`Advisory`, keeping
  only ``affected[]`` entries whose ``package.ecosystem`` is ``PyPI`` (names PEP 503
  normalised), or raises :class:`RecordError`.
* Versions match exactly (``affected[].versions``) or by ``ECOSYSTEM`` ranges
  (``introduced`` / ``fixed`` / ``last_affected`` / ``limit`` events compared with
  :class:`packaging.version.Version`); ``database_specific`` sha256 hashes of files
  (as the malicious-packages records give them) block those files whatever their version.
* Severity is the highest CVSS v3 or v4 base score of ``severity[]`` (the ``cvss``
  package computes it), else ``database_specific.severity`` (GHSA's LOW / MODERATE /
  HIGH / CRITICAL).  A record is *malicious* when its id starts with ``MAL-`` or it
  names the malicious-packages origin.
* :class:`AdvisorySet` keeps the newest ``modified`` record of each id, drops withdrawn
  ones, ties ``aliases`` into groups, and indexes records by project.
* :class:`Rules` plus :meth:`AdvisorySet.block` decide whether one file leaves a page.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cvss import CVSS3, CVSS4
from cvss.exceptions import CVSSError
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from proxy.protocol.errors import Fault

RULE_MALICIOUS = "advisory-malicious"
RULE_VULNERABLE = "advisory-vulnerable"
RULES = (RULE_MALICIOUS, RULE_VULNERABLE)

# CVSS qualitative ratings (v3.1 and v4.0 specifications, section 5), lowest first.
LEVELS = ("none", "low", "medium", "high", "critical")
_LEVEL_RANK = {level: i for i, level in enumerate(LEVELS)}
_GHSA_LEVELS = {"LOW": "low", "MODERATE": "medium", "MEDIUM": "medium", "HIGH": "high", "CRITICAL": "critical"}
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
MAX_AFFECTED = 10_000  # per record: a bound on what one record may make us keep
# The gateway signs its advisory store as this target; mirror sync carries it, mirror verify reads it.
# Under simple/ because the gateway's bins are delegated only simple/* and packages/*/* (changing that
# needs the offline targets key); one segment under simple/ is never a project page (simple/<p>/index.*).
ADVISORY_TARGET = "simple/advisories.osv.json"


class RecordError(ValueError):
    """A record that does not follow the OSV schema; the message says where (skipped, never served)."""

    reason = "bad-advisory"
    fault = Fault.REPOSITORY  # the feed sent it


def level_of(score: float) -> str:
    """The CVSS rating of a base score."""
    if score >= 9.0:
        return "critical"
    if score >= 7.0:
        return "high"
    if score >= 4.0:
        return "medium"
    return "low" if score > 0.0 else "none"


def parse_level(value: Any) -> str:
    """``none``, ``low``, ``medium``, ``high`` or ``critical`` (the ``--block-vulnerable`` threshold)."""
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text not in LEVELS:
        raise ValueError(f"{value!r} is not one of {', '.join(LEVELS)}")
    return text


@dataclass(frozen=True)
class Severity:
    level: str
    score: float | None = None  # the CVSS base score where a vector gave one
    source: str = ""  # CVSS_V3, CVSS_V4 or database_specific


@dataclass(frozen=True)
class Range:
    """One ``ECOSYSTEM`` range: its events in the record's order, as (kind, version text)."""

    events: tuple[tuple[str, str], ...]
    # The events parsed and sorted once (matching runs per file of every page rendered).
    _sorted: tuple[tuple[str, Version | None], ...] = field(init=False, repr=False, compare=False)
    _limits: tuple[Version, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parsed = [(kind, None if kind == "introduced" and text == "0" else _version(text), text)
                  for kind, text in sorted(self.events, key=_event_key)]
        object.__setattr__(self, "_sorted", tuple((k, v) for k, v, t in parsed if v is not None or t == "0"))
        object.__setattr__(self, "_limits", tuple(v for k, v, _ in parsed if k == "limit" and v is not None))

    def contains(self, version: Version) -> bool:
        """The OSV schema's evaluation: sorted events, a limit caps the range."""
        if self._limits and not any(version < lim for lim in self._limits):
            return False
        affected = False
        for kind, at in self._sorted:
            if kind == "introduced" and (at is None or version >= at):
                affected = True
            elif at is not None and ((kind == "fixed" and version >= at) or (kind == "last_affected" and version > at)):
                affected = False
        return affected


def _event_key(event: tuple[str, str]) -> tuple[int, Version | int]:
    kind, text = event
    if text == "0" and kind == "introduced":
        return (0, 0)
    v = _version(text)
    return (1, v) if v is not None else (2, 0)


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class Affected:
    """One PyPI package an advisory names, and which of its releases and files."""

    project: str
    versions: frozenset[str] = frozenset()  # normalised where packaging reads them, else as given
    ranges: tuple[Range, ...] = ()
    sha256: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Advisory:
    """The parts of one OSV record that decide a block."""

    id: str
    modified: str
    aliases: tuple[str, ...] = ()
    withdrawn: bool = False
    malicious: bool = False
    severity: Severity | None = None
    affected: tuple[Affected, ...] = ()
    summary: str = ""

    def to_json(self) -> dict[str, Any]:
        """A compact form that :func:`parse_record` reads back (the store keeps this, not the record)."""
        sev: list[dict[str, Any]] = []
        db: dict[str, Any] = {}
        if self.severity is not None:
            db["severity"] = self.severity.level.upper()
            db["tufproxy_severity"] = {"level": self.severity.level, "score": self.severity.score,
                                       "source": self.severity.source}
        if self.malicious:
            db["tufproxy_malicious"] = True
        out: dict[str, Any] = {"id": self.id, "modified": self.modified, "aliases": list(self.aliases),
                               "summary": self.summary, "severity": sev, "database_specific": db}
        if self.withdrawn:
            out["withdrawn"] = self.modified
        out["affected"] = [{
            "package": {"ecosystem": "PyPI", "name": a.project},
            "versions": sorted(a.versions),
            "ranges": [{"type": "ECOSYSTEM", "events": [{k: v} for k, v in r.events]} for r in a.ranges],
            "database_specific": {"sha256": sorted(a.sha256)} if a.sha256 else {},
        } for a in self.affected]
        return out


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RecordError(f"{where} is not a string")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(f"{where} is not a list")
    return value


def _dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecordError(f"{where} is not an object")
    return value


def _hashes(value: Any, key: str = "") -> Iterator[str]:
    """Every sha256 named anywhere in a ``database_specific`` object (its layout varies by source)."""
    if isinstance(value, str):
        if key == "sha256" and _SHA256_RE.fullmatch(value.lower()):
            yield value.lower()
    elif isinstance(value, Mapping):
        for k, item in value.items():
            yield from _hashes(item, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from _hashes(item, key)


def _severity(record: Mapping[str, Any]) -> Severity | None:
    best: Severity | None = None
    for i, entry in enumerate(_list(record.get("severity"), "severity")):
        entry = _dict(entry, f"severity[{i}]")
        kind, vector = entry.get("type"), entry.get("score")
        if kind not in ("CVSS_V3", "CVSS_V4") or not isinstance(vector, str):
            continue
        try:
            score = float((CVSS3 if kind == "CVSS_V3" else CVSS4)(vector).base_score)
        except (CVSSError, ValueError, KeyError, IndexError) as e:
            raise RecordError(f"severity[{i}]: {vector!r} is not a {kind} vector ({e})") from None
        if best is None or (best.score or 0.0) < score:
            best = Severity(level_of(score), score, kind)
    if best is not None:
        return best
    db = _dict(record.get("database_specific"), "database_specific")
    text = db.get("tufproxy_severity") or db.get("severity")
    if isinstance(text, Mapping):  # our own compact form
        return Severity(parse_level(text.get("level")), text.get("score"), str(text.get("source", "")))
    if isinstance(text, str) and text.strip().upper() in _GHSA_LEVELS:
        return Severity(_GHSA_LEVELS[text.strip().upper()], None, "database_specific")
    return None


def _affected(i: int, entry: Any) -> Affected | None:
    where = f"affected[{i}]"
    entry = _dict(entry, where)
    package = _dict(entry.get("package"), f"{where}.package")
    if package.get("ecosystem") != "PyPI":
        return None
    name = _str(package.get("name"), f"{where}.package.name")
    versions = set()
    for j, v in enumerate(_list(entry.get("versions"), f"{where}.versions")):
        text = _str(v, f"{where}.versions[{j}]")
        parsed = _version(text)
        versions.add(str(parsed) if parsed is not None else text)
    ranges = []
    for j, r in enumerate(_list(entry.get("ranges"), f"{where}.ranges")):
        r = _dict(r, f"{where}.ranges[{j}]")
        if r.get("type") != "ECOSYSTEM":
            continue  # GIT and SEMVER ranges do not speak PyPI versions
        events = []
        for k, event in enumerate(_list(r.get("events"), f"{where}.ranges[{j}].events")):
            event = _dict(event, f"{where}.ranges[{j}].events[{k}]")
            if len(event) != 1:
                raise RecordError(f"{where}.ranges[{j}].events[{k}] must hold exactly one event")
            ((kind, value),) = event.items()
            if kind not in ("introduced", "fixed", "last_affected", "limit"):
                raise RecordError(f"{where}.ranges[{j}].events[{k}]: unknown event {kind!r}")
            events.append((kind, _str(value, f"{where}.ranges[{j}].events[{k}].{kind}")))
        if not any(kind == "introduced" for kind, _ in events):
            raise RecordError(f"{where}.ranges[{j}] has no introduced event")
        ranges.append(Range(tuple(events)))
    sha = frozenset(_hashes(entry.get("database_specific")))
    return Affected(canonicalize_name(name), frozenset(versions), tuple(ranges), sha)


def parse_record(record: Any) -> Advisory | None:
    """The PyPI part of one OSV record; None when it names no PyPI package. :class:`RecordError` if malformed."""
    record = _dict(record, "the record")
    ident = _str(record.get("id"), "id")
    if not _ID_RE.fullmatch(ident):
        raise RecordError(f"id {ident[:80]!r} is not an OSV id")
    modified = _str(record.get("modified"), "modified")
    entries = _list(record.get("affected"), "affected")
    if len(entries) > MAX_AFFECTED:
        raise RecordError(f"affected lists {len(entries)} packages (at most {MAX_AFFECTED})")
    affected = tuple(a for i, e in enumerate(entries) if (a := _affected(i, e)) is not None)
    if not affected:
        return None
    aliases = tuple(_str(a, "aliases[]") for a in _list(record.get("aliases"), "aliases"))
    db = _dict(record.get("database_specific"), "database_specific")
    # malicious-packages records list the sha256 of the files they saw at the top (per origin).
    top = frozenset(_hashes(db))
    if top:
        affected = tuple(dataclasses.replace(a, sha256=a.sha256 | top) for a in affected)
    malicious = (ident.startswith("MAL-") or db.get("tufproxy_malicious") is True
                 or "malicious-packages-origins" in db)
    summary = record.get("summary") if isinstance(record.get("summary"), str) else ""
    return Advisory(ident, modified, aliases, bool(record.get("withdrawn")), malicious, _severity(record),
                    affected, summary[:200])


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Version | None:
    return _version(text)


@functools.lru_cache(maxsize=4096)
def _normalised(text: str) -> str:
    version = _parsed(text)
    return str(version) if version is not None else text


def file_version(filename: str) -> tuple[Version | None, str | None]:
    """The version a wheel or sdist name carries: parsed (None if it does not parse) and as text, normalised if it parses.

    Read as packaging reads it (the wheel's second field, the sdist's last) without re-validating the
    name, which the page's project already fixes; parses are cached, as a page lists many files per version.
    """
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        raw = parts[1] if len(parts) in (5, 6) else None
    else:
        stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
        raw = stem.rpartition("-")[2] if "-" in stem and stem != filename else None
    if raw is None:
        return None, None
    return _parsed(raw), _normalised(raw)


# ---------------------------------------------------------------- the set and the decision


@dataclass(frozen=True)
class Rules:
    """What the organisation blocks: the policy's advisory settings."""

    block_malicious: bool = True
    block_vulnerable: str = "none"  # a level; none blocks nothing for vulnerabilities
    allow: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Block:
    """One file an advisory keeps out of the signed pages (or would, but ``--allow-advisory`` accepts it)."""

    rule: str
    id: str
    aliases: tuple[str, ...]
    severity: str | None
    project: str
    version: str | None
    filename: str
    allowed: bool = False  # the organisation accepted this risk: the file stays, and that is audited

    def audit_fields(self) -> dict[str, Any]:
        return {"rule": self.rule, "advisory": self.id, "aliases": list(self.aliases), "severity": self.severity,
                "project": self.project, "version": self.version, "file": self.filename}


class _ProjectMatcher:
    """What one project's live advisories say, arranged so a file costs a few dict lookups and one bisect.

    Every range's answer depends only on where a version falls among the project's event versions
    (between two, or on one), so ranges are evaluated once per such cell and remembered.
    """

    def __init__(self, pairs: list[tuple[Advisory, Affected]]) -> None:
        self.pairs = pairs
        self.exact: dict[str, list[Advisory]] = {}
        self.hashes: dict[str, list[Advisory]] = {}
        bounds: set[Version] = set()
        for adv, a in pairs:
            for text in a.versions:
                self.exact.setdefault(text, []).append(adv)
            for h in a.sha256:
                self.hashes.setdefault(h, []).append(adv)
            for r in a.ranges:
                bounds.update(v for _, v in r._sorted if v is not None)
                bounds.update(r._limits)
        self.ranged = [(adv, a) for adv, a in pairs if a.ranges]
        self.bounds = sorted(bounds)
        self.cells: dict[tuple[int, bool], list[Advisory]] = {}

    def matching(self, version: Version | None, text: str | None, hashes: Iterable[str]) -> list[Advisory]:
        found: list[Advisory] = []
        for h in hashes:
            found += self.hashes.get(h, ())
        if text is not None:
            found += self.exact.get(text, ())
        if version is not None and self.ranged:
            i = bisect.bisect_left(self.bounds, version)
            cell = (i, i < len(self.bounds) and self.bounds[i] == version)
            hit = self.cells.get(cell)
            if hit is None:
                hit = self.cells[cell] = [adv for adv, a in self.ranged if any(r.contains(version) for r in a.ranges)]
            found += hit
        return list(dict.fromkeys(found)) if len(found) > 1 else found


@dataclass
class AdvisorySet:
    """Advisories by id (newest ``modified`` wins) and by project; withdrawn ones never match."""

    by_id: dict[str, Advisory] = field(default_factory=dict)
    _by_project: dict[str, list[tuple[Advisory, Affected]]] | None = None
    _matchers: dict[str, _ProjectMatcher] = field(default_factory=dict)
    _groups: dict[str, frozenset[str]] | None = None

    @classmethod
    def of(cls, advisories: Iterable[Advisory]) -> AdvisorySet:
        made = cls()
        made.add(advisories)
        return made

    def add(self, advisories: Iterable[Advisory]) -> int:
        """Keep each advisory unless one of its id with a newer or equal ``modified`` is held; how many were kept."""
        kept = 0
        for adv in advisories:
            held = self.by_id.get(adv.id)
            if held is None or _modified_key(adv.modified) > _modified_key(held.modified):
                self.by_id[adv.id] = adv
                kept += 1
        if kept:
            self._by_project = self._groups = None
            self._matchers = {}
        return kept

    def __len__(self) -> int:
        return len(self.by_id)

    def projects(self) -> dict[str, list[tuple[Advisory, Affected]]]:
        """Per project, what the live advisories say of it."""
        if self._by_project is None:
            index: dict[str, list[tuple[Advisory, Affected]]] = {}
            for adv in self.by_id.values():
                if not adv.withdrawn:
                    for a in adv.affected:
                        index.setdefault(a.project, []).append((adv, a))
            self._by_project = index
        return self._by_project

    def group(self, ident: str) -> frozenset[str]:
        """Every id tied to ``ident`` by ``aliases`` (either way, transitively), itself included."""
        if self._groups is None:
            parent: dict[str, str] = {}

            def find(x: str) -> str:
                parent.setdefault(x, x)
                while parent[x] != x:
                    parent[x] = parent[parent[x]]
                    x = parent[x]
                return x

            for adv in self.by_id.values():
                for alias in adv.aliases:
                    parent[find(alias)] = find(adv.id)
            members: dict[str, set[str]] = {}
            for x in list(parent):
                members.setdefault(find(x), set()).add(x)
            self._groups = {x: frozenset(m) for m in members.values() for x in m}
        return self._groups.get(ident, frozenset({ident}))

    def matching(self, project: str, filename: str, hashes: Iterable[str] = ()) -> list[Advisory]:
        """The live advisories naming this file of ``project``, by version or by one of its sha256 ``hashes``."""
        matcher = self._matchers.get(project)
        if matcher is None:
            pairs = self.projects().get(project)
            if not pairs:
                return []
            matcher = self._matchers[project] = _ProjectMatcher(pairs)
        version, text = file_version(filename)
        return matcher.matching(version, text, hashes)

    def block(self, rules: Rules, project: str, filename: str, hashes: Iterable[str] = ()) -> Block | None:
        """Whether ``rules`` keep this file out; malicious beats vulnerable, then the most severe wins.

        When only advisories ``rules.allow`` accepts would block it, the answer is that block marked ``allowed``.
        """
        if not rules.block_malicious and rules.block_vulnerable == "none":
            return None
        threshold = _LEVEL_RANK[rules.block_vulnerable]
        best: tuple[tuple[bool, int, float], Advisory, str] | None = None
        for adv in self.matching(project, filename, hashes):
            if adv.malicious and rules.block_malicious:
                rule, rank = RULE_MALICIOUS, (len(LEVELS), 0.0)
            elif (not adv.malicious and threshold > 0 and adv.severity is not None
                  and _LEVEL_RANK[adv.severity.level] >= threshold):
                rule, rank = RULE_VULNERABLE, (_LEVEL_RANK[adv.severity.level], adv.severity.score or 0.0)
            else:
                continue
            enforced = not (rules.allow and self.group(adv.id) & rules.allow)
            if best is None or (enforced, *rank) > best[0]:
                best = ((enforced, *rank), adv, rule)
        if best is None:
            return None
        (enforced, *_), adv, rule = best
        return Block(rule, adv.id, tuple(sorted(self.group(adv.id) - {adv.id})),
                     adv.severity.level if adv.severity else None, project, file_version(filename)[1], filename,
                     allowed=not enforced)


def read_store(data: bytes | Mapping[str, Any]) -> AdvisorySet:
    """The advisories of a store file (``{"records": [compact records]}``, :meth:`Advisory.to_json`), raw or parsed."""
    try:
        records = (json.loads(data) if isinstance(data, bytes) else data).get("records", [])
    except (ValueError, AttributeError) as e:
        raise RecordError(f"not an advisory store: {e}") from None
    parsed = (parse_record(r) for r in _list(records, "records"))
    return AdvisorySet.of(r for r in parsed if r is not None)


def _modified_key(text: str) -> datetime:
    """An RFC 3339 ``modified``; an unreadable one sorts oldest (any readable record replaces it)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
