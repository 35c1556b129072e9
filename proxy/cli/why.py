"""``tufproxy why REQUIREMENT --gateway URL|--edge URL``: why a version or file is not offered.

The gateway answers ``GET /_tufproxy/why/<project>`` with what a publish
would offer now and what its policy hides, by rule (cooldown cut-off and
each file's upload-time, denied, private, not on the index); this prints
the files the requirement's versions have, one line each.  An edge of the
gateway answers the same path by asking its gateways in turn, for people
who reach only the edge.  Exit status 0
when at least one file the requirement allows is offered, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from proxy.gateway.policy import FILE_RULES
from proxy.mirror.select import read_filename
from proxy.protocol.errors import CommandError

TIMEOUT = 60.0  # the gateway reads the index page first
MAX_BODY = 4 << 20


def explain(requirement: Requirement, answer: dict[str, Any]) -> tuple[list[str], bool]:
    """The lines to print for ``requirement`` from the gateway's answer, and whether anything is offered."""
    name = canonicalize_name(requirement.name)
    if answer.get("refused"):
        return [f"{name}: not offered: {answer['refused']}"], False

    def allowed(filename: str) -> bool:
        version = read_filename(filename)[0]
        return version is not None and requirement.specifier.contains(version, prereleases=True)

    offered = [f for f in answer.get("offered", []) if allowed(f)]
    hidden = [h for h in answer.get("hidden", []) if allowed(str(h.get("filename")))]
    cutoff = answer.get("cutoff")
    lines = [f"hidden  {h['filename']}: by {h['rule']}" + (f" {h['advisory']}" if h.get("advisory") else "")
             + (f", uploaded {h['upload_time']}" if h.get("upload_time") else ", no upload-time")
             + (f" (files uploaded after {cutoff} are held back)" if cutoff and h["rule"] in FILE_RULES else "")
             for h in hidden]
    versions = sorted({str(read_filename(f)[0]) for f in offered})
    if offered:
        lines.append(f"offered {len(offered)} file(s) of {requirement}: {', '.join(versions)}")
    elif not hidden:
        lines.append(f"{requirement}: no file of the index matches it")
    if answer.get("revoked"):
        lines.append(f"{name} is revoked at this gateway")
    return lines, bool(offered)


def _cmd_why(args: argparse.Namespace) -> int:
    try:
        requirement = Requirement(args.requirement)
    except InvalidRequirement as e:
        raise CommandError(f"not a requirement: {args.requirement!r} ({e})") from None
    asked = args.gateway or args.edge
    if not asked or (args.gateway and args.edge):
        raise CommandError("give --gateway URL or --edge URL (an edge relays its gateway's answer)")
    base = asked if asked.endswith("/") else f"{asked}/"
    url = f"{base}_tufproxy/why/{quote(canonicalize_name(requirement.name))}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            answer = json.loads(r.read(MAX_BODY))
    except urllib.error.HTTPError as e:
        detail = _detail(e.read(MAX_BODY))
        raise CommandError(f"{url}: HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")) from None
    except (OSError, ValueError) as e:
        raise CommandError(f"{url}: {e}") from None
    lines, offered = explain(requirement, answer if isinstance(answer, dict) else {})
    print("\n".join(lines))
    return 0 if offered else 1


def _detail(body: bytes) -> str:
    """The reason a refusal's JSON body gives, on one line, bounded."""
    try:
        answer = json.loads(body)
    except ValueError:
        return ""
    detail = answer.get("detail") if isinstance(answer, dict) else None
    return " ".join(str(detail).split())[:300] if detail else ""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy why``."""
    p = subparsers.add_parser(
        "why",
        description="Ask a gateway why versions or files of a project are not offered: hidden by the cooldown "
        "(with the cut-off and each file's upload-time), denied, claimed private, revoked, or not on the index. "
        "Exit status 1 when nothing the requirement allows is offered.",
    )
    p.add_argument("requirement", metavar="REQUIREMENT", help="a project, optionally with versions ('lib>=2')")
    p.add_argument("--gateway", metavar="URL", help="the gateway, e.g. http://gateway.internal:8081/")
    p.add_argument("--edge", metavar="URL", help="or an edge in front of it (it relays the gateway's answer, under "
                   "its own access rules), e.g. http://edge.internal:8080/")
    p.set_defaults(func=_cmd_why)
