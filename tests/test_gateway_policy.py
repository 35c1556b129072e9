"""The gateway policy as pure decisions: ages, cut-offs, trimming, project rules, index choice, settings."""

from __future__ import annotations

import argparse
import re
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.gateway.policy import (
    POLICY_KEYS,
    IndexState,
    Policy,
    PolicyError,
    add_policy_arguments,
    format_age,
    iso_age,
    parse_age,
    parse_pattern,
    parse_timestamp,
    resolve_policy,
)
from proxy.protocol.errors import Fault
from proxy.protocol.index import DistFile, ProjectPage, parse_project_json, render_project_json

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)

# ---------------------------------------------------------------- age grammar


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400d", 400 * DAY),
        ("7 days", 7 * DAY),
        ("24 hours", DAY),
        ("P7D", 7 * DAY),  # pip 26's form
        ("PT36H", timedelta(hours=36)),
        ("p7d", 7 * DAY),
        ("1 week", 7 * DAY),
        ("1 week, 2 days", 9 * DAY),
        ("1w2d", 9 * DAY),
        ("3d4h59m", timedelta(days=3, hours=4, minutes=59)),
        ("3 days, 4 hours, 59 minutes", timedelta(days=3, hours=4, minutes=59)),
        ("2 days 12:00:00", timedelta(days=2, hours=12)),
        ("2d, 12:00:00", timedelta(days=2, hours=12)),
        ("12:30:00", timedelta(hours=12, minutes=30)),
        ("2.5h", timedelta(hours=2, minutes=30)),
        ("1,5 hours", timedelta(hours=1, minutes=30)),
        ("5m", timedelta(minutes=5)),  # friendly m is minutes
        ("1 hr 30 mins", timedelta(hours=1, minutes=30)),
        ("0d", timedelta(0)),
        ("P1W2DT3.5H", timedelta(days=9, hours=3, minutes=30)),
        ("P0M7D", 7 * DAY),  # zero months carry no length
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("-7 days", 7 * DAY),  # uv takes the span's absolute value
        ("7 days ago", 7 * DAY),
        ("+P7D", 7 * DAY),
        ("  400d  ", 400 * DAY),
    ],
)
def test_accepted_ages(text: str, expected: timedelta) -> None:
    assert parse_age(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("6 months", "use days instead, e.g. '180 days'"),
        ("1 year", "use days instead, e.g. '365 days'"),
        ("2 mos", "months"),
        ("1y", "years"),
        ("P1Y", "years"),
        ("P2M", "months"),  # before T, M is months
        ("", "empty age"),
        ("7", "not a duration"),
        ("7 Days", "not a duration"),
        ("7 dayz", "unknown unit 'dayz'"),
        ("1.5 days", "only hours and smaller"),
        ("P1.5D", "not an ISO 8601 duration"),
        ("PT1.5H30M", "only the last unit"),
        ("1.5h 30m", "nothing may follow a fraction"),
        ("2 hours 1 day", "largest first"),
        ("7 days 7 days", "largest first"),
        ("1h 12:00:00", "not a duration"),
        ("7 days,", "not a duration"),
        ("P", "names no unit"),
        ("PT", "names no unit"),
        ("- 7 days", "not a duration"),
        ("99999999 days", "too long"),
    ],
)
def test_refused_ages(text: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_age(text)
    assert fragment in str(caught.value)


def test_an_age_must_be_a_string() -> None:
    with pytest.raises(PolicyError, match="string, not int"):
        parse_age(7)


@pytest.mark.parametrize("text", ["400d", "PT36H", "1 day 2 hours 3 minutes 4.5 seconds", "0s", "P1W"])
def test_iso_age_reads_back(text: str) -> None:
    age = parse_age(text)
    assert parse_age(iso_age(age)) == age


def test_format_age() -> None:
    assert format_age(parse_age("400d")) == "400 days"
    assert format_age(parse_age("PT36H")) == "1 day 12 hours"
    assert format_age(timedelta(0)) == "0 seconds"


# ---------------------------------------------------------------- timestamps and patterns


def test_timestamps() -> None:
    assert parse_timestamp("2025-01-31T00:00:00Z") == datetime(2025, 1, 31, tzinfo=UTC)
    assert parse_timestamp("2025-01-31 02:00:00+02:00") == datetime(2025, 1, 31, tzinfo=UTC)
    assert parse_timestamp("2025-01-31t00:00:00.123456789z").microsecond == 123456
    toml_value = tomllib.loads("t = 2025-01-31T00:00:00-01:00")["t"]
    assert parse_timestamp(toml_value) == datetime(2025, 1, 31, 1, tzinfo=UTC)


@pytest.mark.parametrize("value", ["2025-01-31", "2025-01-31T00:00:00", "yesterday", "2025-02-30T00:00:00Z"])
def test_refused_timestamps(value: str) -> None:
    with pytest.raises(PolicyError):
        parse_timestamp(value)


def test_naive_toml_datetime_is_refused() -> None:
    with pytest.raises(PolicyError, match="no UTC offset"):
        parse_timestamp(tomllib.loads("t = 2025-01-31T00:00:00")["t"])


def test_patterns_are_normalised() -> None:
    assert parse_pattern("Acme_Internal.*") == "acme-internal-*"
    for bad in ["", "a/b", "a b", "a[bc]", "x" * 201, 5]:
        with pytest.raises(PolicyError, match="not a project-name pattern"):
            parse_pattern(bad)


# ---------------------------------------------------------------- trimming


def _file(filename: str, uploaded: str | None) -> DistFile:
    return DistFile(filename=filename, url=f"../../packages/{filename}", hashes={"sha256": "ab" * 32},
                    upload_time=uploaded)


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _page() -> ProjectPage:
    return ProjectPage(
        name="demo-lib",
        files=(
            _file("demo_lib-1.0-py3-none-any.whl", _iso(NOW - 500 * DAY)),
            _file("demo_lib-1.0.tar.gz", _iso(NOW - 500 * DAY)),
            _file("demo_lib-1.1-py3-none-any.whl", _iso(NOW - 401 * DAY)),
            _file("demo_lib-1.1.tar.gz", _iso(NOW - 10 * DAY)),  # a late sdist of an old release
            _file("demo_lib-2.0-py3-none-any.whl", _iso(NOW - 3 * DAY)),
            _file("demo_lib-2.0.tar.gz", _iso(NOW - 3 * DAY)),
        ),
        versions=("1.0", "1.1", "1.5", "2.0"),  # 1.5 has no file at the index
    )


def test_cooldown_trims_files_and_versions() -> None:
    trimmed = Policy(min_release_age=parse_age("400d")).apply(_page(), NOW)
    assert [f.filename for f in trimmed.page.files] == [
        "demo_lib-1.0-py3-none-any.whl", "demo_lib-1.0.tar.gz", "demo_lib-1.1-py3-none-any.whl"]
    # 2.0 lost every file; 1.1 keeps its wheel; 1.5 had none to lose.
    assert trimmed.page.versions == ("1.0", "1.1", "1.5")
    assert [h.filename for h in trimmed.hidden] == [
        "demo_lib-1.1.tar.gz", "demo_lib-2.0-py3-none-any.whl", "demo_lib-2.0.tar.gz"]
    assert trimmed.by_rule() == {"min-release-age": 3}
    assert trimmed.cutoff is not None and trimmed.cutoff.when == NOW - 400 * DAY
    fields = trimmed.audit_fields()
    assert fields["project"] == "demo-lib" and fields["hidden_count"] == 3
    assert fields["rules"] == {"min-release-age": 3} and fields["cutoff"] == "2025-04-27T12:00:00Z"


def test_trimmed_page_renders_and_parses_back() -> None:
    trimmed = Policy(min_release_age=parse_age("7 days")).apply(_page(), NOW)
    again = parse_project_json(render_project_json(trimmed.page), "demo-lib")
    assert again.versions == ("1.0", "1.1", "1.5")
    assert "demo_lib-2.0.tar.gz" not in {f.filename for f in again.files}


def test_file_uploaded_at_the_cutoff_is_left_out() -> None:
    page = ProjectPage("p", (_file("p-1.0.tar.gz", _iso(NOW - 7 * DAY)),), ("1.0",))
    assert Policy(min_release_age=7 * DAY).apply(page, NOW).page.files == ()
    assert len(Policy(min_release_age=7 * DAY).apply(page, NOW + timedelta(microseconds=1)).page.files) == 1


def test_file_appears_once_the_cutoff_moves_past_it() -> None:
    policy = Policy(min_release_age=parse_age("400d"))
    newest = "demo_lib-2.0-py3-none-any.whl"
    assert newest not in {f.filename for f in policy.apply(_page(), NOW).page.files}
    later = policy.apply(_page(), NOW + 398 * DAY)
    assert newest in {f.filename for f in later.page.files} and "2.0" in later.page.versions


def test_nothing_hidden_returns_the_same_page() -> None:
    page = _page()
    assert Policy().apply(page, NOW).page is page
    assert Policy(min_release_age=DAY).apply(page, NOW + 1000 * DAY).page is page


@pytest.mark.parametrize("uploaded", [None, "", "not a time"])
def test_missing_upload_time(uploaded: str | None) -> None:
    page = ProjectPage("p", (_file("p-1.0.tar.gz", uploaded), _file("p-0.9.tar.gz", _iso(NOW - 30 * DAY))),
                       ("0.9", "1.0"))
    excluded = Policy(min_release_age=7 * DAY).apply(page, NOW)
    assert [f.filename for f in excluded.page.files] == ["p-0.9.tar.gz"]
    assert excluded.page.versions == ("0.9",)
    assert excluded.by_rule() == {"missing-upload-time": 1}
    included = Policy(min_release_age=7 * DAY, missing_upload_time="include").apply(page, NOW)
    assert included.page is page
    # Without a cooldown there is nothing to compare against: the file stays.
    assert Policy().apply(page, NOW).page is page


def test_upload_time_offsets_and_naive_times() -> None:
    page = ProjectPage("p", (
        _file("p-1.0.tar.gz", "2026-05-31T13:30:00+02:00"),  # 11:30 UTC: older than a day
        _file("p-1.1.tar.gz", "2026-05-31T12:30:00"),  # naive: read as UTC, newer than a day
    ), ("1.0", "1.1"))
    trimmed = Policy(min_release_age=DAY).apply(page, NOW)
    assert [f.filename for f in trimmed.page.files] == ["p-1.0.tar.gz"]


def test_unparseable_filenames_keep_their_versions() -> None:
    page = ProjectPage("p", (
        _file("p-1.0.tar.gz", _iso(NOW - 30 * DAY)),
        _file("p-2.0.exe", _iso(NOW)),  # packaging cannot tell its version
    ), ("1.0", "2.0", "not-a-version"))
    trimmed = Policy(min_release_age=DAY).apply(page, NOW)
    assert [h.filename for h in trimmed.hidden] == ["p-2.0.exe"]
    assert trimmed.page.versions == ("1.0", "2.0", "not-a-version")


def test_versions_compare_as_pep_440() -> None:
    page = ProjectPage("p", (_file("p-1.0.0.tar.gz", _iso(NOW)), _file("p-0.9.tar.gz", _iso(NOW - 9 * DAY))),
                       ("0.9", "1.0"))
    assert Policy(min_release_age=DAY).apply(page, NOW).page.versions == ("0.9",)


def test_exempt_projects_get_everything() -> None:
    policy = Policy(min_release_age=400 * DAY, cooldown_exempt=("demo-*",))
    assert policy.cutoff("Demo_Lib", NOW) is None
    assert policy.apply(_page(), NOW).page == _page()
    assert policy.cutoff("other", NOW) is not None


def test_per_project_age_replaces_the_global_cutoffs() -> None:
    policy = Policy(min_release_age=400 * DAY, uploaded_before=NOW - 900 * DAY, project_age={"demo-lib": 2 * DAY})
    cut = policy.cutoff("demo-lib", NOW)
    assert cut is not None and cut.rule == "project-age" and cut.when == NOW - 2 * DAY
    trimmed = policy.apply(_page(), NOW)
    assert {f.filename for f in trimmed.page.files} >= {"demo_lib-2.0.tar.gz"}
    assert trimmed.hidden == ()


def test_the_earlier_global_cutoff_wins() -> None:
    policy = Policy(min_release_age=7 * DAY, uploaded_before=NOW - 450 * DAY)
    cut = policy.cutoff("x", NOW)
    assert cut is not None and (cut.rule, cut.when) == ("uploaded-before", NOW - 450 * DAY)
    cut = Policy(min_release_age=7 * DAY, uploaded_before=NOW).cutoff("x", NOW)
    assert cut is not None and cut.rule == "min-release-age"
    trimmed = policy.apply(_page(), NOW)
    assert trimmed.by_rule() == {"uploaded-before": 4}
    assert trimmed.page.versions == ("1.0", "1.5")


# ---------------------------------------------------------------- project rules


def test_deny_and_allow() -> None:
    policy = Policy(allow_project=("demo-*", "requests"), deny_project=("demo-evil*",))
    assert policy.admit("requests") is None and policy.admit("Demo_Lib") is None
    denied = policy.admit("demo.evil-pkg")
    assert denied is not None and denied.kind is Fault.NOT_FOUND and denied.rule == "deny-project"
    assert "denied by policy" in denied.message and "demo-evil*" in denied.message
    other = policy.admit("numpy")
    assert other is not None and other.rule == "allow-project" and "denied by policy" in other.message
    assert Policy(deny_project=("bad",)).admit("numpy") is None


# ---------------------------------------------------------------- several indexes

L, A, U = IndexState.LISTED, IndexState.ABSENT, IndexState.UNREACHABLE


def test_first_listing_index_wins_and_is_asked_in_order() -> None:
    policy = Policy()
    assert policy.choose_index("x", [None, None], None).probe == 0
    assert policy.choose_index("x", [L, None], None).index == 0
    assert policy.choose_index("x", [A, None], None).probe == 1
    assert policy.choose_index("x", [A, L], None).index == 1
    refused = policy.choose_index("x", [A, A], None).refusal
    assert refused is not None and refused.kind is Fault.NOT_FOUND


def test_claimed_private_name_only_comes_from_the_first_index() -> None:
    policy = Policy(private_project=("acme-*",))
    assert policy.choose_index("Acme_Tool", [L, None], None).index == 0
    refused = policy.choose_index("acme-tool", [A, None], None).refusal
    assert refused is not None and refused.kind is Fault.NOT_FOUND and refused.rule == "private-project"
    assert "never taken from another index" in refused.message
    # The second index is never even asked, whatever the ledger says.
    assert policy.choose_index("acme-tool", [None, None], 1).probe == 0
    assert policy.choose_index("acme-tool", [A, L], 1).refusal is not None
    unreachable = policy.choose_index("acme-tool", [U, None], None).refusal
    assert unreachable is not None and unreachable.kind is Fault.UPSTREAM


def test_unreachable_index_never_falls_through() -> None:
    policy = Policy()
    refused = policy.choose_index("x", [U, L], None).refusal
    assert refused is not None and refused.kind is Fault.UPSTREAM and "index 1 is unreachable" in refused.message
    assert policy.choose_index("x", [A, U], None).refusal is not None


def test_the_ledger_pins_a_project_to_its_index() -> None:
    policy = Policy()
    # Published from the first index: an unreachable first index is a refusal, never the second.
    refused = policy.choose_index("x", [U, L], 0).refusal
    assert refused is not None and refused.kind is Fault.UPSTREAM
    # ...and once the first index stops listing it, the second index's "x" is not taken either.
    gone = policy.choose_index("x", [A, L], 0).refusal
    assert gone is not None and gone.kind is Fault.NOT_FOUND and "no longer lists it" in gone.message
    # Published from the second index: only the second is asked.
    assert policy.choose_index("x", [None, None], 1).probe == 1
    assert policy.choose_index("x", [U, L], 1).index == 1
    assert policy.choose_index("x", [L, L], 1).index == 1
    # Its index was removed from the configuration: no other index replaces it.
    removed = policy.choose_index("x", [L], 1).refusal
    assert removed is not None and "no longer configured" in removed.message


# ---------------------------------------------------------------- settings


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    return parser.parse_args(list(argv))


TOML = """
min_release_age = "7 days"
uploaded_before = 2025-01-01T00:00:00Z
cooldown_exempt = ["Internal_*"]
project_age = { requests = "P1D", "Foo.Bar" = "1 week, 2 days" }
deny_project = ["evil-*"]
private_project = ["acme-*"]
"""


def test_flags_beat_env_beat_file() -> None:
    file_values = tomllib.loads(TOML)
    args = _args("--min-release-age", "400d", "--project-age", "NumPy=30 days", "--project-age", "b=PT36H")
    env = {"TUFPROXY_DENY_PROJECT": "bad-one, bad-two", "TUFPROXY_MIN_RELEASE_AGE": "1d"}
    policy = resolve_policy(args, env, file_values, "gw.toml")
    assert policy.min_release_age == 400 * DAY
    assert policy.project_age == {"numpy": 30 * DAY, "b": timedelta(hours=36)}
    assert policy.deny_project == ("bad-one", "bad-two")
    assert policy.cooldown_exempt == ("internal-*",)
    assert policy.uploaded_before == datetime(2025, 1, 1, tzinfo=UTC)
    assert policy.missing_upload_time == "exclude"
    file_only = resolve_policy(None, {}, file_values, "gw.toml")
    assert file_only.project_age == {"requests": DAY, "foo-bar": 9 * DAY}


def test_env_project_ages_may_hold_commas() -> None:
    policy = resolve_policy(None, {"TUFPROXY_PROJECT_AGE": "a=1 week, 2 days, b=P1D"}, {})
    assert policy.project_age == {"a": 9 * DAY, "b": DAY}


def test_defaults() -> None:
    assert resolve_policy(None, {}, {}) == Policy()


@pytest.mark.parametrize(
    ("argv", "env", "toml", "message"),
    [
        (["--min-release-age", "6 months"], {}, "", "--min-release-age: '6 months' uses months"),
        ([], {"TUFPROXY_MIN_RELEASE_AGE": "1 year"}, "", "TUFPROXY_MIN_RELEASE_AGE: '1 year' uses years"),
        ([], {}, 'min_release_age = "7 dayz"', "gw.toml: min_release_age: '7 dayz': unknown unit"),
        ([], {}, "min_release_age = 7", "gw.toml: min_release_age: an age is a string"),
        ([], {}, 'uploaded_before = "2025-01-01"', "gw.toml: uploaded_before: '2025-01-01' is not an RFC 3339"),
        (["--uploaded-before", "soon"], {}, "", "--uploaded-before: 'soon' is not an RFC 3339"),
        (["--deny-project", "a/b"], {}, "", "--deny-project: 'a/b' is not a project-name pattern"),
        ([], {}, 'allow_project = ["ok", "not ok"]', "gw.toml: allow_project: 'not ok' is not a project-name"),
        (["--cooldown-exempt", "x y"], {}, "", "--cooldown-exempt: 'x y' is not"),
        (["--private-project", "!"], {}, "", "--private-project: '!' is not"),
        (["--project-age", "numpy"], {}, "", "--project-age: 'numpy' is not NAME=AGE"),
        ([], {}, 'project_age = { "x y" = "1d" }', "gw.toml: project_age: 'x y' is not a project name"),
        ([], {}, 'project_age = { a = "1d", A = "2d" }', "gw.toml: project_age: 'A' is given twice"),
        ([], {}, 'project_age = { a = "3 months" }', "gw.toml: project_age: a: '3 months' uses months"),
        (["--missing-upload-time", "maybe"], {}, "", "--missing-upload-time: 'maybe' is not exclude or include"),
    ],
)
def test_errors_name_the_setting(argv: list[str], env: dict[str, str], toml: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        resolve_policy(_args(*argv), env, tomllib.loads(toml), "gw.toml")
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_help_lists_every_policy_flag() -> None:
    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    text = parser.format_help()
    for key in POLICY_KEYS:
        assert "--" + key.replace("_", "-") in text and "TUFPROXY_" + key.upper() in text


def test_describe_and_json_round_trip() -> None:
    policy = resolve_policy(_args("--min-release-age", "400d", "--allow-project", "demo-*"), {},
                            tomllib.loads(TOML), "gw.toml")
    text = policy.describe(NOW)
    assert "min-release-age: 400 days (files uploaded before 2025-04-27T12:00:00Z now)" in text
    assert "private-project (first index only): acme-*" in text
    assert "allow-project: demo-*" in text
    assert "allow-project: all projects" in Policy().describe()
    data = policy.to_json()
    assert data["min_release_age"] == "P400D" and data["project_age"] == {"foo-bar": "P9D", "requests": "P1D"}
    assert set(data) == POLICY_KEYS
    assert resolve_policy(None, {}, data, "policy.json") == policy


def test_the_gateway_guides_example_configuration_is_a_valid_policy() -> None:
    readme = (Path(__file__).parent.parent / "docs" / "guides" / "gateway.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", readme, re.S) if "private_project" in b]
    values = tomllib.loads(block)
    policy = resolve_policy(None, {}, {k: v for k, v in values.items() if k in POLICY_KEYS}, "gateway.md")
    assert policy.min_release_age == 7 * DAY and policy.private_project == ("acme-*",)
    assert len(values["index_url"]) == 2  # the claim needs the organisation's own index first
