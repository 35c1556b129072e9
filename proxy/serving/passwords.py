"""The htpasswd file (``--auth-file``) and the group file (``--auth-groups``), re-read when they change.

htpasswd lines are ``user:hash``: bcrypt (``$2y$``/``$2b$``/``$2a$``, what
``htpasswd -B`` writes) or argon2id (``$argon2id$``).  Other schemes (MD5
``$apr1$``, SHA1, crypt) are refused when the file is read, one warning
each, so a weak hash never opens the door.  The group file is Apache's
AuthGroupFile format: ``group: user user ...``.

A file is looked at (``stat``) at most once a second; when its size,
mtime or inode changed it is read again, and a file that cannot be read
or parsed keeps the last good contents (with a warning), so a half-written
file never locks everyone out or lets anyone in.  Each change bumps
:attr:`Passwords.generation`, which invalidates cached successes.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import argon2
import bcrypt

from proxy.protocol.errors import Fault

log = logging.getLogger(__name__)
T = TypeVar("T")
STAT_INTERVAL = 1.0
MAX_FILE = 16 * 2**20
# bcrypt reads at most 72 bytes (htpasswd -B truncates there); bcrypt>=5 refuses longer input.
BCRYPT_MAX = 72
_USER = re.compile(r"[^:\s#][^:\s]{0,255}")
_ARGON2 = argon2.PasswordHasher()


class AuthFileError(ValueError):
    """An htpasswd or group file that cannot be used at all."""

    reason = "bad-configuration"
    fault = Fault.OPERATOR


class _Watched(Generic[T]):
    """A file's parsed contents, re-parsed when the file changes (see the module docstring)."""

    def __init__(self, path: Path, parse: Callable[[str], T]) -> None:
        self.path = Path(path)
        self._parse = parse
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self.generation = 0
        self.value = self._read()  # the first read must work: a bad file is a start-up error

    def _read(self) -> T:
        st = os.stat(self.path)
        if st.st_size > MAX_FILE:
            raise AuthFileError(f"{self.path}: larger than {MAX_FILE} bytes")
        with open(self.path, encoding="utf-8") as f:
            value = self._parse(f.read())
        self._stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        self.generation += 1
        return value

    def current(self) -> T:
        now = time.monotonic()
        if now - self._checked >= STAT_INTERVAL:
            self._checked = now
            try:
                st = os.stat(self.path)
                changed = (st.st_ino, st.st_size, st.st_mtime_ns) != self._stamp
            except OSError as e:
                log.warning("cannot stat %s (%s): keeping what was read before", self.path, e.strerror)
                changed = False
            if changed:
                try:
                    self.value = self._read()
                    log.info("re-read %s", self.path)
                except (OSError, UnicodeDecodeError, AuthFileError) as e:
                    log.warning("cannot re-read %s (%s): keeping what was read before", self.path, e)
        return self.value


def parse_htpasswd(text: str, source: str = "htpasswd") -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not _USER.fullmatch(user):
            log.warning("%s line %d: not user:hash, skipped", source, number)
            continue
        if not hashed.startswith(("$2y$", "$2b$", "$2a$", "$argon2id$")):
            # The scheme only, never the hash: a log line must not carry what an attacker could crack.
            log.warning("%s line %d: user %s has a %s hash; only bcrypt (htpasswd -B) and argon2id are accepted: "
                        "skipped", source, number, user, hashed.split("$")[1] if hashed.startswith("$") else "crypt/SHA")
            continue
        users[user] = hashed.encode("ascii", "replace")
    return users


def parse_groups(text: str) -> dict[str, frozenset[str]]:
    groups: dict[str, set[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, members = line.partition(":")
        if not sep or not name.strip():
            raise AuthFileError(f"not 'group: user user ...': {line[:80]!r}")
        groups.setdefault(name.strip(), set()).update(members.split())
    return {name: frozenset(members) for name, members in groups.items()}


@functools.lru_cache(maxsize=8)
def _dummy(like: bytes) -> bytes:
    """A hash of the same kind and cost as ``like``, to check when the user is unknown: an absent user
    costs what a present one does, so timing does not tell which names exist."""
    if like.startswith(b"$argon2id$"):
        params = argon2.extract_parameters(like.decode("ascii"))
        return argon2.PasswordHasher.from_parameters(params).hash(b"tufproxy-no-such-user").encode()
    cost = int(like[4:6]) if like[4:6].isdigit() else 5
    return bcrypt.hashpw(b"tufproxy-no-such-user", bcrypt.gensalt(rounds=max(4, min(cost, 16))))


def check_hash(hashed: bytes, password: str) -> bool:
    """Whether ``password`` matches ``hashed`` (bcrypt or argon2id); the libraries compare in constant time."""
    secret = password.encode("utf-8")
    if hashed.startswith(b"$argon2id$"):
        try:
            return _ARGON2.verify(hashed.decode("ascii"), secret)
        except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError, ValueError):
            return False
    if hashed.startswith(b"$2y$"):
        hashed = b"$2b$" + hashed[4:]  # the same algorithm; PHP's name for it
    try:
        return bcrypt.checkpw(secret[:BCRYPT_MAX], hashed)
    except ValueError:
        return False


class Passwords:
    """``--auth-file`` and ``--auth-groups``: who exists, with what password, in which groups."""

    def __init__(self, auth_file: Path, groups_file: Path | None = None) -> None:
        try:
            self._users = _Watched(auth_file, lambda text: parse_htpasswd(text, str(auth_file)))
            self._groups = _Watched(groups_file, parse_groups) if groups_file is not None else None
        except OSError as e:
            raise AuthFileError(f"cannot read {e.filename}: {e.strerror}") from None
        except (UnicodeDecodeError, AuthFileError) as e:
            raise AuthFileError(f"{groups_file or auth_file}: {e}") from None
        if not self._users.value:
            log.warning("%s has no usable users: every request that needs one is refused", auth_file)

    @property
    def generation(self) -> tuple[int, int]:
        self._users.current()
        return self._users.generation, self._groups.generation if self._groups else 0

    def check(self, user: str, password: str) -> bool:
        """Whether ``user`` exists with ``password``; an unknown user costs one bcrypt check too."""
        users = self._users.current()
        hashed = users.get(user)
        ok = check_hash(hashed if hashed is not None else _dummy(next(iter(users.values()), b"$2b$05$")), password)
        return ok and hashed is not None

    def exists(self, user: str) -> bool:
        return user in self._users.current()

    def groups(self) -> dict[str, frozenset[str]]:
        return self._groups.current() if self._groups is not None else {}
