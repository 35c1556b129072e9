"""The AWS shared files (``~/.aws/credentials``, ``~/.aws/config``): the bucket's keys, region and endpoint.

``object_store`` reads the environment, web identity, the container
endpoint and the instance role, but not these files; this module reads
them (with :mod:`configparser`, as the AWS SDKs lay them out) so the
bucket follows the standard chain, first match wins:

1. ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``) in the environment;
2. web identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` with ``AWS_ROLE_ARN``, as IRSA sets them);
3. the profile (``AWS_PROFILE``, else ``default``) in the shared credentials
   file (``AWS_SHARED_CREDENTIALS_FILE``, else ``~/.aws/credentials``), then
   in the config file (``AWS_CONFIG_FILE``, else ``~/.aws/config``);
4. the rest of ``object_store``'s chain: the ECS container endpoint, the instance role.

1, 2 and 4 are ``object_store``'s own; this module supplies 3.  The region
is ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else the profile's ``region``;
the endpoint is ``--s3-endpoint-url``, else ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, else the profile's ``endpoint_url`` (or its ``s3``
section's).  A profile that gets its keys another way (``role_arn``,
``sso_*``, ``credential_process``) is refused with one line, never
skipped silently, as is an ``AWS_PROFILE`` found in neither file.

Keys are never formatted into a message: :attr:`AwsSettings.secrets` lists
what error text must be scrubbed of.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from proxy.protocol.errors import Fault

_ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_OTHER_WAYS = ("role_arn", "credential_process", "sso_session", "sso_start_url", "sso_account_id")


class ProfileError(ValueError):
    """A shared file or profile that cannot be used as found (one line, no secrets)."""

    reason = "bucket-credentials"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class AwsSettings:
    """What to add to the S3 client's own configuration, and where the keys came from."""

    options: dict[str, str] = field(default_factory=dict)  # S3Store keyword arguments
    source: str = "the environment or a role"  # for messages; never a key
    secrets: tuple[str, ...] = ()  # values error text must not show

    @property
    def endpoint(self) -> str | None:
        return self.options.get("endpoint")


def resolve(endpoint_url: str | None, environ: Mapping[str, str] = os.environ) -> AwsSettings:
    """The bucket's credentials, region and endpoint per the module docstring."""
    env_secrets = tuple(v for name in _ENV_KEYS if (v := environ.get(name)))
    endpoint = endpoint_url or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    name = environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE")
    credentials_file = _path(environ, "AWS_SHARED_CREDENTIALS_FILE", "credentials")
    config_file = _path(environ, "AWS_CONFIG_FILE", "config")
    from_credentials = _section(credentials_file, name or "default")
    from_config = _section(config_file, f"profile {name}" if name and name != "default" else "default")
    if from_config is None and name == "default":
        from_config = _section(config_file, "profile default")
    if name and from_credentials is None and from_config is None:
        raise ProfileError(f"AWS profile {name!r} is in neither {credentials_file} nor {config_file}")
    profile = {**(from_config or {}), **(from_credentials or {})}  # the credentials file wins, as in the SDKs
    options: dict[str, str] = {}
    if not (environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")) and profile.get("region"):
        options["region"] = profile["region"]
    endpoint = endpoint or profile.get("endpoint_url") or _nested(profile.get("s3", ""), "endpoint_url")
    if endpoint:
        options["endpoint"] = endpoint
    where = f"profile {name or 'default'!r} in {credentials_file if from_credentials else config_file}"
    if environ.get("AWS_ACCESS_KEY_ID") and environ.get("AWS_SECRET_ACCESS_KEY"):
        return AwsSettings(options, "AWS_ACCESS_KEY_ID in the environment", env_secrets)
    if environ.get("AWS_WEB_IDENTITY_TOKEN_FILE") and environ.get("AWS_ROLE_ARN"):
        return AwsSettings(options, "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)", env_secrets)
    key, secret = profile.get("aws_access_key_id"), profile.get("aws_secret_access_key")
    if key and secret:
        options.update(access_key_id=key, secret_access_key=secret)
        if token := profile.get("aws_session_token"):
            options["session_token"] = token
        return AwsSettings(options, where, (*env_secrets, key, secret, *(t for t in [token] if t)))
    other = [k for k in _OTHER_WAYS if profile.get(k)]
    if other:
        raise ProfileError(f"{where} gets its keys by {other[0]}, which tufproxy does not read: give keys in the "
                           "profile or the environment, or use web identity or an instance role")
    return AwsSettings(options, "the container or instance role", env_secrets)


def _path(environ: Mapping[str, str], variable: str, name: str) -> Path:
    given = environ.get(variable)
    return Path(given).expanduser() if given else Path(environ.get("HOME") or Path.home()) / ".aws" / name


def _section(path: Path, section: str) -> dict[str, str] | None:
    """One section of an INI file as a dict; None if the file or the section is absent."""
    parser = configparser.RawConfigParser(default_section="\0", strict=False)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        parser.read_string(text, str(path))
    except configparser.Error as e:
        raise ProfileError(f"{path} is not a valid AWS shared file: {str(e).splitlines()[0]}") from None
    return dict(parser.items(section)) if parser.has_section(section) else None


def _nested(value: str, key: str) -> str | None:
    """``key`` from an indented sub-section (``s3 =`` followed by ``  endpoint_url = ...`` lines)."""
    for line in value.splitlines():
        name, sep, found = line.partition("=")
        if sep and name.strip() == key:
            return found.strip()
    return None
