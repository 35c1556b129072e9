"""PEP 740 provenance policy: publisher specs, modes and the one decision per file.

Pure (no I/O, no Sigstore): the gateway verifies attestations with
``pypi-attestations`` (:mod:`proxy.gateway.provenance`) and hands the
outcome here.  :func:`decide` is the one place that says whether a file is
left out and by which rule:

* ``off``: provenance is not read.
* ``verify``: present but invalid provenance leaves the file out
  (``provenance-invalid``); a file without provenance is published.
* ``pin``: as ``verify``; in addition the project's first verified
  publisher is pinned, and later files without provenance
  (``provenance-missing``) or from another publisher (``publisher-changed``)
  are left out.
* ``require``: as ``pin``, and every file needs valid provenance.

In every mode but ``off``, a file whose provenance could not be checked
now (its object not fetched, or, online, no current Sigstore trust root)
is left out by ``provenance-unavailable``: an upstream's fault, not the
repository's, and not remembered, so the next refresh tries again.

A publisher pinned up front (``--trusted-publisher``) is checked in every
mode but ``off``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.utils import InvalidName, canonicalize_name

MODES = ("off", "verify", "pin", "require")
RULE_INVALID = "provenance-invalid"
RULE_MISSING = "provenance-missing"
RULE_CHANGED = "publisher-changed"
RULE_UNAVAILABLE = "provenance-unavailable"

# PEP 740 publisher kinds and the spec prefixes that name them.
_KINDS = {"github": "GitHub", "gitlab": "GitLab", "google": "Google"}
_SPEC_HINT = "give github:OWNER/REPO[@WORKFLOW], gitlab:NAMESPACE/PROJECT[@WORKFLOW] or google:EMAIL"


@dataclass(frozen=True)
class PublisherSpec:
    """A trusted publisher: kind, repository (or e-mail) and, optionally, the workflow."""

    kind: str  # github | gitlab | google
    identity: str  # OWNER/REPO, NAMESPACE/PROJECT or EMAIL
    workflow: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}:{self.identity}" + (f"@{self.workflow}" if self.workflow else "")

    def matches(self, seen: PublisherSpec) -> bool:
        """True when ``seen`` (a verified publisher) is this one; no workflow here means any workflow."""
        if self.kind != seen.kind or self.identity.lower() != seen.identity.lower():
            return False
        return self.workflow is None or self.workflow == seen.workflow

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "identity": self.identity, "workflow": self.workflow}


def parse_spec(text: Any) -> PublisherSpec:
    """``github:OWNER/REPO[@WORKFLOW]``, ``gitlab:NAMESPACE/PROJECT[@WORKFLOW]`` or ``google:EMAIL``."""
    if not isinstance(text, str) or len(text) > 400:
        raise ValueError(f"not a publisher: {str(text)[:80]!r}; {_SPEC_HINT}")
    kind, sep, rest = text.strip().partition(":")
    kind = kind.lower()
    if not sep or kind not in _KINDS or not rest:
        raise ValueError(f"not a publisher: {text[:80]!r}; {_SPEC_HINT}")
    if kind == "google":
        local, at, domain = rest.partition("@")
        if not local or not at or "." not in domain or any(c.isspace() for c in rest):
            raise ValueError(f"not an e-mail address: {rest[:80]!r}; {_SPEC_HINT}")
        return PublisherSpec(kind, rest)
    identity, _, workflow = rest.partition("@")
    parts = identity.split("/")
    if len(parts) < 2 or (kind == "github" and len(parts) != 2) or not all(parts) or any(c.isspace() for c in rest):
        raise ValueError(f"not a repository: {identity[:80]!r}; {_SPEC_HINT}")
    return PublisherSpec(kind, identity, workflow or None)


def from_publisher(publisher: Mapping[str, Any]) -> PublisherSpec:
    """The spec of a PEP 740 publisher object (as ``pypi-attestations`` dumps it)."""
    kind = {v: k for k, v in _KINDS.items()}.get(str(publisher.get("kind")))
    if kind == "github":
        return PublisherSpec(kind, str(publisher["repository"]), publisher.get("workflow"))
    if kind == "gitlab":
        return PublisherSpec(kind, str(publisher["repository"]), publisher.get("workflow_filepath"))
    if kind == "google":
        return PublisherSpec(kind, str(publisher["email"]))
    raise ValueError(f"publisher kind {publisher.get('kind')!r} is not one this gateway pins")


def _pairs(value: Any, what: str) -> list[tuple[str, str]]:
    items = value if isinstance(value, list | tuple) else [value]
    out = []
    for item in items:
        for part in (item.split(",") if isinstance(item, str) else [item]):
            if not isinstance(part, str) or "=" not in part:
                raise ValueError(f"give {what}, not {str(part)[:80]!r}")
            left, _, right = part.strip().partition("=")
            out.append((left.strip(), right.strip()))
    return out


def parse_trusted_publishers(value: Any) -> dict[str, PublisherSpec]:
    """``PROJECT=SPEC`` items (a list, or comma-separated text) by normalised project."""
    out: dict[str, PublisherSpec] = {}
    for project, spec in _pairs(value, "PROJECT=SPEC"):
        try:
            out[canonicalize_name(project, validate=True)] = parse_spec(spec)
        except InvalidName:
            raise ValueError(f"not a project name: {project[:80]!r}") from None
    return out


def parse_mode(value: Any) -> str:
    if value not in MODES:
        raise ValueError(f"give one of {', '.join(MODES)}, not {str(value)[:40]!r}")
    return str(value)


def parse_project_modes(value: Any) -> tuple[tuple[str, str], ...]:
    """``PATTERN=MODE`` items; the first pattern that matches a project wins."""
    return tuple((canonicalize_name(p) if "*" not in p and "?" not in p else p.lower(), parse_mode(m))
                 for p, m in _pairs(value, "PATTERN=MODE"))


@dataclass(frozen=True)
class Outcome:
    """What verification found for one file: ``missing``, ``invalid`` (with why), ``unavailable`` (could not be
    checked now, with why) or ``verified``."""

    state: str
    detail: str = ""
    publisher: PublisherSpec | None = None
    digest: str | None = None  # sha256 of the provenance object verified


@dataclass(frozen=True)
class ProvenancePolicy:
    """The mode per project and the publishers pinned up front."""

    mode: str = "pin"
    trusted: Mapping[str, PublisherSpec] | None = None
    project_modes: tuple[tuple[str, str], ...] = ()

    def mode_for(self, project: str) -> str:
        return next((m for p, m in self.project_modes if fnmatch.fnmatchcase(project, p)), self.mode)

    def expected(self, project: str, pinned: PublisherSpec | None) -> PublisherSpec | None:
        """The publisher ``project``'s files must come from: the operator's, else the ledger's pin."""
        return (self.trusted or {}).get(project) or pinned

    def describe(self) -> str:
        """One line for start-up: the mode, the publishers pinned up front, the per-project modes."""
        trusted = ", ".join(f"{p}={s}" for p, s in sorted((self.trusted or {}).items())) or "none"
        modes = ", ".join(f"{p}={m}" for p, m in self.project_modes) or "none"
        return f"provenance {self.mode}; trusted publishers: {trusted}; per project: {modes}"


def decide(mode: str, expected: PublisherSpec | None, outcome: Outcome) -> str | None:
    """The rule that leaves the file out, or None to publish it; see the module docstring."""
    if mode == "off":
        return None
    if outcome.state == "invalid":
        return RULE_INVALID
    if outcome.state == "unavailable":
        return RULE_UNAVAILABLE
    if outcome.state == "missing":
        if mode == "require" or (mode == "pin" and expected is not None):
            return RULE_MISSING
        return None
    assert outcome.publisher is not None
    if expected is not None and not expected.matches(outcome.publisher):
        return RULE_CHANGED
    return None
