"""The AWS shared files as the bucket reads them: which source wins, and one-line refusals.

(That a replica really uses these settings against a bucket that refuses
anonymous writes is tests/test_bucket.py's job.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.transport.awsprofile import ProfileError, resolve

KEYS = "aws_access_key_id = AKFILE\naws_secret_access_key = file-secret\n"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(f"[default]\n{KEYS}\n[other]\naws_access_key_id = AKOTHER\n"
                                                   "aws_secret_access_key = other-secret\naws_session_token = tok\n")
    (tmp_path / ".aws" / "config").write_text(
        "[default]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:1\n"
        "[profile other]\nregion = us-east-2\ns3 =\n  endpoint_url = http://127.0.0.1:2\n"
        "[profile assumed]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n"
        "[profile regiononly]\nregion = ap-south-1\n")
    return tmp_path


def test_the_default_profile_gives_keys_region_and_endpoint(home: Path) -> None:
    got = resolve(None, {"HOME": str(home)})
    assert got.options == {"access_key_id": "AKFILE", "secret_access_key": "file-secret", "region": "eu-west-1",
                           "endpoint": "http://127.0.0.1:1"}
    assert got.source == f"profile 'default' in {home / '.aws' / 'credentials'}"
    assert set(got.secrets) == {"AKFILE", "file-secret"}
    assert "file-secret" not in got.source


def test_a_named_profile_with_a_token_and_a_nested_s3_endpoint(home: Path) -> None:
    got = resolve(None, {"HOME": str(home), "AWS_PROFILE": "other"})
    assert got.options == {"access_key_id": "AKOTHER", "secret_access_key": "other-secret", "session_token": "tok",
                           "region": "us-east-2", "endpoint": "http://127.0.0.1:2"}


def test_environment_keys_win_and_the_flag_and_environment_endpoint_region_win_over_the_profile(home: Path) -> None:
    env = {"HOME": str(home), "AWS_ACCESS_KEY_ID": "AKENV", "AWS_SECRET_ACCESS_KEY": "env-secret",
           "AWS_REGION": "us-west-2", "AWS_ENDPOINT_URL": "http://127.0.0.1:3"}
    got = resolve(None, env)
    assert got.options == {"endpoint": "http://127.0.0.1:3"}  # keys and region: object_store reads the environment
    assert got.source == "AWS_ACCESS_KEY_ID in the environment" and "env-secret" in got.secrets
    assert resolve("http://127.0.0.1:4", env).endpoint == "http://127.0.0.1:4"


def test_web_identity_wins_over_the_files_and_a_role_is_left_to_object_store(home: Path, tmp_path: Path) -> None:
    got = resolve(None, {"HOME": str(home), "AWS_WEB_IDENTITY_TOKEN_FILE": "/t", "AWS_ROLE_ARN": "arn:x"})
    assert "access_key_id" not in got.options and got.source.startswith("web identity")
    got = resolve(None, {"HOME": str(home), "AWS_PROFILE": "regiononly"})
    assert got.options == {"region": "ap-south-1"} and got.source == "the container or instance role"
    assert resolve(None, {"HOME": str(tmp_path / "nobody")}).options == {}


def test_explicit_file_variables(home: Path, tmp_path: Path) -> None:
    (tmp_path / "keys").write_text(f"[default]\n{KEYS}".replace("AKFILE", "AKELSEWHERE"))
    got = resolve(None, {"HOME": str(tmp_path / "nobody"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "keys"),
                         "AWS_CONFIG_FILE": str(home / ".aws" / "config")})
    assert got.options["access_key_id"] == "AKELSEWHERE" and got.options["region"] == "eu-west-1"


@pytest.mark.parametrize("env, files, message", [
    ({"AWS_PROFILE": "missing"}, None, "AWS profile 'missing' is in neither"),
    ({"AWS_PROFILE": "assumed"}, None, "gets its keys by role_arn, which tufproxy does not read"),
    ({}, "[default\nbroken", "is not a valid AWS shared file"),
])
def test_unusable_profiles_are_one_line_without_secrets(home: Path, env: dict[str, str], files: str | None,
                                                        message: str) -> None:
    if files is not None:
        (home / ".aws" / "config").write_text(files)
    with pytest.raises(ProfileError) as e:
        resolve(None, {"HOME": str(home), **env})
    assert message in str(e.value) and "\n" not in str(e.value) and "secret" not in str(e.value)
