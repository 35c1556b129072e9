"""Read and publish rules: ``PATTERN=WHO``, and the one decision they make. Pure: no I/O.

``PATTERN`` is a shell-style pattern (``fnmatch``) matched against the
normalised project name (``acme-*``, ``*``); ``WHO`` is ``anonymous``,
``authenticated``, a user name or ``@group``, several joined by ``|``.
Every rule whose pattern matches a project counts (their WHOs add up);
a project no rule matches gets the default.  A resource that is not one
project (the root list, signed metadata, metrics) is matched by the
rules whose pattern is ``*`` alone.

A private project is never ``anonymous``: for it, ``anonymous`` reads as
``authenticated`` unless the operator accepted the risk
(``--allow-anonymous-private yes``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from proxy.protocol.errors import Fault

ANONYMOUS = "anonymous"
AUTHENTICATED = "authenticated"
_NAME = re.compile(r"@?[A-Za-z0-9._-]{1,64}")
_PATTERN = re.compile(r"[A-Za-z0-9._*?\[\]!-]{1,200}")


class RuleError(ValueError):
    """A rule that cannot be read."""

    reason = "bad-configuration"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class Rule:
    pattern: str
    who: frozenset[str]

    def matches(self, project: str | None) -> bool:
        return self.pattern == "*" if project is None else fnmatch.fnmatchcase(project, self.pattern)


def parse_rule(text: str) -> Rule:
    """``PATTERN=WHO[|WHO...]``."""
    pattern, sep, who = str(text).strip().partition("=")
    pattern = pattern.strip()
    names = frozenset(w.strip() for w in who.split("|") if w.strip())
    if not sep or not _PATTERN.fullmatch(pattern) or not names:
        raise RuleError(f"wants PATTERN=WHO (WHO: anonymous, authenticated, a user or @group), not {text!r}")
    bad = [n for n in names if not _NAME.fullmatch(n)]
    if bad:
        raise RuleError(f"{text!r}: {bad[0]!r} is not anonymous, authenticated, a user or @group")
    if not any(c in pattern for c in "*?[") and pattern != canonicalize_name(pattern):
        pattern = canonicalize_name(pattern)
    return Rule(pattern, names)


def parse_rules(values: Iterable[str] | str | None) -> tuple[Rule, ...]:
    """Rules from repeated flags, a TOML list, or one whitespace-separated string (an environment variable)."""
    if values is None:
        return ()
    items = values.split() if isinstance(values, str) else [w for v in values for w in str(v).split()]
    return tuple(parse_rule(v) for v in items)


@dataclass(frozen=True)
class Rules:
    """One kind of rules (read or publish) with the default WHO for what no rule matches."""

    rules: tuple[Rule, ...] = ()
    default: frozenset[str] = frozenset({ANONYMOUS})
    anonymous_private: bool = False

    def who(self, project: str | None) -> frozenset[str]:
        matched = [r.who for r in self.rules if r.matches(project)]
        return frozenset().union(*matched) if matched else self.default

    def needs_user(self, project: str | None, private: bool = False) -> bool:
        """Whether an anonymous client is refused before anything about ``project`` is looked up."""
        return not self.allows(project, None, {}, private)

    def allows(self, project: str | None, user: str | None, groups: Mapping[str, frozenset[str]],
               private: bool = False) -> bool:
        """May ``user`` (None: anonymous) read (or publish) ``project`` (None: the repository as a whole)?"""
        who = self.who(project)
        if ANONYMOUS in who and (not private or self.anonymous_private):
            return True
        if user is None:
            return False
        if AUTHENTICATED in who or ANONYMOUS in who or user in who:
            return True
        return any(w.startswith("@") and user in groups.get(w[1:], ()) for w in who)


def project_of(path: str) -> str | None:
    """The project a request path names (``/simple/<p>/...``, ``/packages/<p>/...``, ``/_tufproxy/why/<p>``),
    normalised; None for others."""
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "_tufproxy" and parts[2] == "why" and parts[3]:
        return canonicalize_name(parts[3]) if len(parts[3]) <= 200 else parts[3]
    if len(parts) >= 3 and parts[1] in ("simple", "packages") and parts[2] and parts[2][:1] != ".":
        name = parts[2]
        if parts[1] == "simple" and len(parts) == 3:
            return None  # /simple/<file of the root list>
        return canonicalize_name(name) if len(name) <= 200 else name
    return None


# How the gateway marks a private project in signed metadata: the TUF ``custom`` field of its page
# targets, signed by the same key that signs the page's hashes (docs/guides/access-control.md says why).
PRIVATE_CUSTOM = {"tufproxy": {"private": True}}


def marked_private(fields: Mapping[str, object]) -> bool:
    """Whether a target's unrecognised fields (``{"custom": ...}``) mark it private."""
    custom = fields.get("custom")
    mark = custom.get("tufproxy") if isinstance(custom, dict) else None
    return isinstance(mark, dict) and mark.get("private") is True


def not_listed(project: str) -> str:
    """What the gateway says of a project no index lists; an edge says it of a private one to whoever may not
    read it, so the two cannot be told apart."""
    return f"{project}: no index lists it"
