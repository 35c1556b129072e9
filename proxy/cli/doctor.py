"""``tufproxy doctor``: check a running deployment end to end, one line per check, the fix beside a problem.

It asks what the parts already answer (``/healthz``, ``/readyz``, the gateway's
``metadata/``, the edge's ``simple/``) and compares what must agree: the
``--root`` an edge pins is the gateway's own; the gateway's timestamp is
fresh and far from expiry; the clocks agree.  Then it prints the pip and uv
lines that use the edge.  Each part's ``/metrics`` adds what only it knows:
the edge's hot path and last refresh, the gateway's signing errors and
advisory feeds, either's bucket errors.  Exit status 1 when a check found a problem (a
negative answer, as ``mirror verify`` gives), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from proxy.protocol.errors import CommandError
from proxy.protocol.provenance import RULE_CHANGED, RULE_INVALID, RULE_MISSING, RULE_UNAVAILABLE

TIMEOUT = 10.0
MAX_BODY = 1 << 20
MAX_SKEW = timedelta(seconds=60)  # TUF expiry is judged on each host's own clock
EXPIRY_WARNING = timedelta(hours=6)


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    status: str  # ok, warning or problem
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<8} {self.name}: {self.detail}"


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    date: datetime | None


def _get(url: str) -> _Answer:
    """One bounded GET; an HTTP error status is an answer too. OSError when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            return _Answer(r.status, r.read(MAX_BODY), _date(r.headers.get("Date")))
    except urllib.error.HTTPError as e:
        return _Answer(e.code, e.read(MAX_BODY), _date(e.headers.get("Date")))


def _date(value: str | None) -> datetime | None:
    try:
        return parsedate_to_datetime(value) if value else None
    except (TypeError, ValueError):
        return None


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _part(name: str, base: str) -> tuple[list[Check], _Answer | None]:
    """Reachable and ready: ``/healthz`` then ``/readyz`` (its problems, as the part words them)."""
    try:
        health = _get(f"{base}healthz")
    except OSError as e:
        return [Check("problem", f"{name} reachable", f"{base}: {getattr(e, 'reason', e)}; is it running, "
                      "and is this its address?")], None
    checks = [Check("ok" if health.status == 200 else "problem", f"{name} reachable", f"{base} (HTTP {health.status})")]
    ready = _get(f"{base}readyz")
    problems = _json(ready.body).get("problems") or []
    checks.append(Check("ok", f"{name} ready", "yes") if ready.status == 200 else
                  Check("problem", f"{name} ready", "; ".join(map(str, problems)) or f"HTTP {ready.status}"))
    return checks, ready


def skew_check(name: str, their_date: datetime | None, now: datetime) -> Check:
    """Their clock against ours (HTTP Date has whole seconds)."""
    if their_date is None:
        return Check("warning", f"{name} clock", "no Date header to compare clocks with")
    skew = their_date - now
    status = "ok" if abs(skew) <= MAX_SKEW else "problem"
    fix = "" if status == "ok" else ": run NTP on both hosts (expiry is judged on each host's clock)"
    return Check(status, f"{name} clock", f"{skew.total_seconds():+.0f} s from this host's{fix}")


def expiry_check(expires: datetime, now: datetime) -> Check:
    """The gateway's published timestamp: valid, and not about to lapse."""
    left = expires - now
    if left <= timedelta(0):
        return Check("problem", "timestamp", f"expired at {expires.isoformat()}: is the gateway's online key there "
                     "and the gateway running? (it re-signs at an eighth of the lifetime)")
    status = "ok" if left > EXPIRY_WARNING else "warning"
    return Check(status, "timestamp", f"expires {expires.isoformat()} (in {left.total_seconds() / 3600:.1f} h)")


def root_check(pinned: bytes, served: bytes | None, version: int) -> Check:
    """The root an edge pins must be byte for byte the gateway's root of that version."""
    if served is None:
        return Check("problem", "root", f"the gateway serves no {version}.root.json: is --root another "
                     "repository's root?")
    if served != pinned:
        return Check("problem", "root", f"--root is not the gateway's {version}.root.json: pin "
                     f"DIR/public/metadata/{version}.root.json of this gateway")
    return Check("ok", "root", f"--root is the gateway's {version}.root.json")


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _metrics(base: str) -> Samples | None:
    """``/metrics`` parsed by prometheus-client (name -> (labels, value)); None when it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        answer = _get(f"{base}metrics")
        if answer.status != 200:
            return None
        found: Samples = {}
        for family in text_string_to_metric_families(answer.body.decode(errors="replace")):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((sample.labels, sample.value))
        return found
    except (OSError, ValueError):
        return None


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples carrying ``labels``; None when it has none."""
    values = [v for have, v in samples.get(name, []) if all(have.get(k) == w for k, w in labels.items())]
    return sum(values) if values else None


def metric_checks(part: str, samples: Samples | None, now: datetime) -> list[Check]:
    """What the part's own metrics say: the hot path, refreshes, signing, the advisory feeds, the bucket."""
    if samples is None:
        return [Check("warning", f"{part} metrics", "/metrics is not readable here (behind access control?): "
                      "hot path, signing, feed and bucket checks skipped")]
    checks = []
    if part == "edge":
        hot = _value(samples, "tufproxy_hot_path_installed")
        checks.append(Check("ok", "hot path", "installed: warm pages are answered below aiohttp's web layer") if hot
                      else Check("warning", "hot path", "not installed (see the edge's start-up log: an aiohttp that "
                                 "moved its internals?); pages are served, more slowly"))
        refreshed = _value(samples, "tufproxy_last_successful_refresh_timestamp_seconds")
        if refreshed:
            age = now.timestamp() - refreshed
            checks.append(Check("ok" if age < 3600 else "warning", "edge refresh",
                                f"last successful metadata refresh {age:.0f} s ago"
                                + ("" if age < 3600 else ": is its upstream reachable? (tufproxy_refresh_failures_total)")))
    else:
        foreign = _value(samples, "tufproxy_gateway_refusals_total", reason="foreign-origin") or 0
        if foreign:
            checks.append(Check("problem", "foreign origins", f"{foreign:.0f} page(s) refused since start for linking "
                                "files on an origin not allowed: add it with --files-origin (the gateway's audit "
                                "log names it: tufproxy audit)"))
        refused = sum(_value(samples, "tufproxy_gateway_refusals_total", reason=rule) or 0
                      for rule in (RULE_INVALID, RULE_MISSING, RULE_CHANGED, RULE_UNAVAILABLE))
        checks.append(Check("ok", "provenance", "no file refused for its provenance since start") if not refused else
                      Check("warning", "provenance", f"{refused:.0f} file(s) refused since start for their provenance "
                            "(missing, invalid, from another publisher, or not checkable then): "
                            "tufproxy audit on the gateway's audit log "
                            "names them; tufproxy why PROJECT --gateway URL says which rule"))
        blocked = _value(samples, "tufproxy_gateway_advisory_blocked_files") or 0
        checks.append(Check("ok", "advisory blocks", f"{blocked:.0f} file(s) kept out by advisories now"))
        errors = _value(samples, "tufproxy_gateway_signing_errors_total") or 0
        checks.append(Check("ok", "signing", "no signing errors since start") if not errors else
                          Check("warning", "signing", f"{errors:.0f} signing error(s) since start: is the token or KMS "
                                "there? (the gateway's log says which key)"))
        answered = _value(samples, "tufproxy_gateway_advisory_feeds_answered_timestamp_seconds")
        if answered:  # 0: no --advisories-url
            age = now.timestamp() - answered
            checks.append(Check("ok" if age < 6 * 3600 else "warning", "advisory feeds",
                                f"every --advisories-url answered {age:.0f} s ago"
                                + ("" if age < 6 * 3600 else ": check the feed URLs (the gateway's log says why)")))
    bucket = _value(samples, "tufproxy_bucket_errors_total")
    if bucket is not None:
        requests = _value(samples, "tufproxy_bucket_requests_total") or 0
        checks.append(Check("ok" if not bucket else "warning", f"{part} bucket",
                            f"{requests:.0f} request(s), {bucket:.0f} failed since start"
                            + ("" if not bucket else ": credentials, endpoint or the store (the log says which)")))
    return checks


def _gateway_checks(base: str, root: Path | None, now: datetime) -> list[Check]:
    checks, ready = _part("gateway", base)
    if ready is None:
        return checks
    checks.append(skew_check("gateway", ready.date, now))
    origin = _json(ready.body).get("files_origin_problem")
    checks.append(Check("problem", "files origin", str(origin)[:400]) if origin else
                  Check("ok", "files origin", "none found at start-up (the files of the index's first pages)"))
    timestamp = _get(f"{base}metadata/timestamp.json")
    try:
        expires = datetime.fromisoformat(_json(timestamp.body)["signed"]["expires"].replace("Z", "+00:00"))
    except (KeyError, TypeError, ValueError, AttributeError):
        checks.append(Check("problem", "timestamp", f"{base}metadata/timestamp.json: HTTP {timestamp.status}, "
                            "no signed expiry"))
    else:
        checks.append(expiry_check(expires, now))
    if root is not None:
        pinned = root.read_bytes()
        version = _json(pinned).get("signed", {}).get("version")
        if not isinstance(version, int):
            raise CommandError(f"{root} is not a root.json")
        served = _get(f"{base}metadata/{version}.root.json")
        checks.append(root_check(pinned, served.body if served.status == 200 else None, version))
    return checks + metric_checks("gateway", _metrics(base), now)


def _edge_checks(base: str, now: datetime) -> list[Check]:
    checks, ready = _part("edge", base)
    if ready is None:
        return checks
    checks.append(skew_check("edge", ready.date, now))
    page = _get(f"{base}simple/")
    checks.append(Check("ok", "edge serves", f"{base}simple/ (HTTP 200)") if page.status == 200 else
                  Check("problem", "edge serves", f"{base}simple/: HTTP {page.status} "
                        f"{page.body[:200].decode(errors='replace').strip()}"))
    return checks + metric_checks("edge", _metrics(base), now)


def _url(value: str) -> str:
    return value if value.endswith("/") else f"{value}/"


def _cmd_doctor(args: argparse.Namespace) -> int:
    if not (args.edge or args.gateway):
        raise CommandError("give --edge URL, --gateway URL or both")
    now = datetime.now(UTC)
    checks: list[Check] = []
    if args.gateway:
        checks += _gateway_checks(_url(args.gateway), Path(args.root) if args.root else None, now)
    if args.edge:
        checks += _edge_checks(_url(args.edge), now)
    for check in checks:
        print(check.line())
    if args.edge:
        index = f"{_url(args.edge)}simple/"
        print(f"pip:  pip config set global.index-url {index}")
        print(f"uv:   UV_DEFAULT_INDEX={index} (or [[tool.uv.index]] url = \"{index}\", default = true)")
    problems = sum(c.status == "problem" for c in checks)
    print(f"{problems} problem(s), {sum(c.status == 'warning' for c in checks)} warning(s)")
    return 1 if problems else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``tufproxy doctor``."""
    p = subparsers.add_parser(
        "doctor",
        description="Check a running deployment: each part reachable and ready, the edge's --root the gateway's, "
        "the timestamp's freshness and time to expiry, clock skew, and from each part's /metrics the edge's hot "
        "path and last refresh, signing errors, advisory feeds and bucket errors; then print the pip and uv lines. "
        "Exit status 1 when a problem was found.",
    )
    p.add_argument("--edge", metavar="URL", help="an edge (tufproxy serve), e.g. http://edge.internal:8080/")
    p.add_argument("--gateway", metavar="URL", help="a gateway (tufproxy gateway serve), e.g. http://gateway.internal:8081/")
    p.add_argument("--root", metavar="FILE", help="the root.json edges pin: checked against the gateway's")
    p.set_defaults(func=_cmd_doctor)
