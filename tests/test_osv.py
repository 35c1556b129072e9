"""proxy.protocol.osv: OSV records as OSV publishes them, matched against PyPI files."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from proxy.protocol.osv import (
    RULE_MALICIOUS,
    RULE_VULNERABLE,
    AdvisorySet,
    Range,
    RecordError,
    Rules,
    parse_level,
    parse_record,
)

V3_CRITICAL = "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"  # 9.8
V3_MEDIUM = "CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:U/C:L/I:L/A:N"  # 5.4
V4_HIGH = "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:N/VA:N/SC:N/SI:N/SA:N"  # 8.7
SHA = hashlib.sha256(b"evil wheel").hexdigest()


def mal(ident: str = "MAL-2024-1", name: str = "Evil_Pkg", versions=("1.0",), modified="2024-05-01T00:00:00Z", **extra):
    """A record in the form the OpenSSF malicious-packages repository publishes."""
    return {
        "schema_version": "1.5.0", "id": ident, "modified": modified, "published": "2024-05-01T00:00:00Z",
        "summary": f"Malicious code in {name} (PyPI)",
        "affected": [{"package": {"ecosystem": "PyPI", "name": name}, "versions": list(versions)}],
        "database_specific": {"malicious-packages-origins": [{"source": "ossf-package-analysis", "sha256": SHA,
                                                              "versions": list(versions)}]},
        **extra,
    }


def pysec(ident="PYSEC-2024-7", name="requests-like", events=({"introduced": "0"}, {"fixed": "2.0"}),
          severity=(("CVSS_V3", V3_CRITICAL),), aliases=("GHSA-aaaa-bbbb-cccc",), modified="2024-06-01T00:00:00Z", **extra):
    return {
        "id": ident, "modified": modified, "aliases": list(aliases),
        "severity": [{"type": t, "score": s} for t, s in severity],
        "affected": [{"package": {"ecosystem": "PyPI", "name": name, "purl": f"pkg:pypi/{name}"},
                      "ranges": [{"type": "ECOSYSTEM", "events": list(events)},
                                 {"type": "GIT", "repo": "https://git.example/r", "events": [{"introduced": "abc"}]}]}],
        **extra,
    }


def adv(record):
    parsed = parse_record(record)
    assert parsed is not None
    return parsed


def test_malicious_record_blocks_its_exact_versions_and_its_file_hash() -> None:
    aset = AdvisorySet.of([adv(mal())])
    rules = Rules()
    block = aset.block(rules, "evil-pkg", "evil_pkg-1.0-py3-none-any.whl")
    assert block is not None and block.rule == RULE_MALICIOUS and block.id == "MAL-2024-1" and block.version == "1.0"
    assert aset.block(rules, "evil-pkg", "evil_pkg-1.1.tar.gz") is None
    # The hash names the file whatever version its name says.
    assert aset.block(rules, "evil-pkg", "evil_pkg-9.9.tar.gz", {SHA}) is not None
    assert aset.block(Rules(block_malicious=False), "evil-pkg", "evil_pkg-1.0.tar.gz") is None


def test_names_are_normalised_and_other_ecosystems_ignored() -> None:
    record = mal(name="Evil.Pkg")
    record["affected"].append({"package": {"ecosystem": "npm", "name": "evil"}, "versions": ["1.0"]})
    parsed = adv(record)
    assert [a.project for a in parsed.affected] == ["evil-pkg"]
    assert parse_record({"id": "GHSA-x", "modified": "2024-01-01T00:00:00Z",
                         "affected": [{"package": {"ecosystem": "npm", "name": "x"}, "versions": ["1"]}]}) is None


def test_exact_versions_compare_normalised() -> None:
    aset = AdvisorySet.of([adv(mal(versions=("1.0.0-RC1",)))])
    assert aset.block(Rules(), "evil-pkg", "evil_pkg-1.0.0rc1.tar.gz") is not None


@pytest.mark.parametrize(("events", "affected", "clean"), [
    (({"introduced": "0"}, {"fixed": "2.0"}), ["0.1", "1.9.9", "2.0rc1"], ["2.0", "3"]),
    (({"introduced": "1.0"}, {"last_affected": "1.5"}), ["1.0", "1.5"], ["0.9", "1.5.1"]),
    (({"introduced": "1.0"}, {"fixed": "1.2"}, {"introduced": "2.0"}, {"fixed": "2.1"}), ["1.1", "2.0.5"], ["1.2", "1.9", "2.1"]),
    (({"introduced": "1.0"}, {"limit": "1.4"}), ["1.0", "1.3"], ["1.4", "2.0", "0.5"]),
])
def test_ecosystem_ranges(events, affected, clean) -> None:
    aset = AdvisorySet.of([adv(pysec(events=events))])
    rules = Rules(block_malicious=False, block_vulnerable="low")
    for v in affected:
        assert aset.block(rules, "requests-like", f"requests_like-{v}.tar.gz") is not None, v
    for v in clean:
        assert aset.block(rules, "requests-like", f"requests_like-{v}.tar.gz") is None, v


@given(st.lists(st.integers(0, 30), min_size=1, max_size=6, unique=True).map(sorted), st.integers(0, 32))
def test_ranges_match_a_brute_force_reading(bounds, probe) -> None:
    """Alternating introduced/fixed events: affected exactly inside [introduced, fixed)."""
    events = tuple(("introduced" if i % 2 == 0 else "fixed", f"{b}.0") for i, b in enumerate(bounds))
    inside = False
    for i, b in enumerate(bounds):
        if probe >= b:
            inside = i % 2 == 0
    assert Range(events).contains(Version(f"{probe}.0")) is inside


def test_severity_from_cvss_v3_and_v4_and_database_specific() -> None:
    assert adv(pysec()).severity.level == "critical" and adv(pysec()).severity.score == 9.8
    v4 = adv(pysec(severity=(("CVSS_V4", V4_HIGH),)))
    assert v4.severity.level == "high" and v4.severity.score == 8.7 and v4.severity.source == "CVSS_V4"
    both = adv(pysec(severity=(("CVSS_V3", V3_MEDIUM), ("CVSS_V4", V4_HIGH))))
    assert both.severity.level == "high"
    ghsa = adv(pysec(severity=(), database_specific={"severity": "MODERATE"}))
    assert ghsa.severity.level == "medium" and ghsa.severity.score is None
    assert adv(pysec(severity=())).severity is None


def test_block_vulnerable_threshold() -> None:
    aset = AdvisorySet.of([adv(pysec(severity=(("CVSS_V3", V3_MEDIUM),)))])
    f = "requests_like-1.0-py3-none-any.whl"
    assert aset.block(Rules(block_vulnerable="none"), "requests-like", f) is None
    assert aset.block(Rules(block_vulnerable="high"), "requests-like", f) is None
    block = aset.block(Rules(block_vulnerable="medium"), "requests-like", f)
    assert block is not None and block.rule == RULE_VULNERABLE and block.severity == "medium"
    assert block.aliases == ("GHSA-aaaa-bbbb-cccc",)


def test_newest_modified_wins_and_withdrawn_lifts() -> None:
    aset = AdvisorySet.of([adv(mal())])
    assert aset.add([adv(mal(modified="2024-04-01T00:00:00Z", versions=("2.0",)))]) == 0  # older: ignored
    assert aset.block(Rules(), "evil-pkg", "evil_pkg-1.0.tar.gz") is not None
    assert aset.add([adv(mal(modified="2024-07-01T00:00:00.5Z", withdrawn="2024-07-01T00:00:00Z"))]) == 1
    assert aset.block(Rules(), "evil-pkg", "evil_pkg-1.0.tar.gz") is None
    assert aset.block(Rules(), "evil-pkg", "x-1.0.tar.gz", {SHA}) is None


def test_allow_advisory_covers_its_aliases_both_ways() -> None:
    ghsa = {"id": "GHSA-aaaa-bbbb-cccc", "modified": "2024-06-02T00:00:00Z", "aliases": ["CVE-2024-1"],
            "affected": [{"package": {"ecosystem": "PyPI", "name": "requests-like"}, "versions": ["1.0"]}],
            "database_specific": {"severity": "HIGH"}}
    aset = AdvisorySet.of([adv(pysec()), adv(ghsa)])
    assert aset.group("CVE-2024-1") == {"PYSEC-2024-7", "GHSA-aaaa-bbbb-cccc", "CVE-2024-1"}
    f = "requests_like-1.0.tar.gz"
    assert aset.block(Rules(block_vulnerable="high"), "requests-like", f) is not None
    assert not aset.block(Rules(block_vulnerable="high"), "requests-like", f).allowed
    for allowed in ("PYSEC-2024-7", "GHSA-aaaa-bbbb-cccc", "CVE-2024-1"):
        block = aset.block(Rules(block_vulnerable="high", allow=frozenset({allowed})), "requests-like", f)
        assert block is not None and block.allowed, allowed  # kept, and reported as an accepted risk


def test_compact_form_round_trips() -> None:
    for record in (mal(), pysec(severity=(("CVSS_V4", V4_HIGH),)), mal(withdrawn="2024-07-01T00:00:00Z")):
        parsed = adv(record)
        assert parse_record(parsed.to_json()) == parsed


@pytest.mark.parametrize("record", [
    [], {"modified": "2024"}, {"id": "X", "modified": 3}, {"id": "bad id!", "modified": "x"},
    {"id": "X", "modified": "x", "affected": "PyPI"},
    {"id": "X", "modified": "x", "affected": [{"package": {"ecosystem": "PyPI", "name": "a"}, "ranges": [
        {"type": "ECOSYSTEM", "events": [{"fixed": "1"}]}]}]},
    {"id": "X", "modified": "x", "affected": [{"package": {"ecosystem": "PyPI", "name": "a"}, "ranges": [
        {"type": "ECOSYSTEM", "events": [{"introduced": "0", "fixed": "1"}]}]}]},
    pysec(severity=(("CVSS_V3", "CVSS:3.1/AV:Q"),)),
])
def test_malformed_records_raise_record_error(record) -> None:
    with pytest.raises(RecordError):
        parse_record(record)


def test_levels() -> None:
    assert parse_level(" High ") == "high"
    with pytest.raises(ValueError):
        parse_level("severe")


_EVENT = st.tuples(st.sampled_from(["introduced", "fixed", "last_affected", "limit"]), st.integers(0, 12).map(lambda n: f"{n // 4}.{n % 4}"))


@given(st.lists(st.lists(_EVENT, min_size=1, max_size=5), min_size=1, max_size=5), st.lists(st.integers(0, 14), min_size=1, max_size=20))
def test_the_per_project_matcher_agrees_with_each_range(ranges, probes) -> None:
    """The bisect-and-remember matcher answers exactly what evaluating every range would."""
    records = []
    for i, events in enumerate(ranges):
        events = [("introduced", "0"), *events] if all(k != "introduced" for k, _ in events) else events
        records.append(adv(pysec(ident=f"PYSEC-1-{i}", aliases=(), events=tuple({k: v} for k, v in events))))
    aset = AdvisorySet.of(records)
    for n in probes:  # the same version twice, in any order: the remembered cells must stay right
        version = f"{n // 4}.{n % 4}"
        expected = {r.id for r in records if any(rg.contains(Version(version)) for rg in r.affected[0].ranges)}
        assert {a.id for a in aset.matching("requests-like", f"requests_like-{version}.tar.gz")} == expected
