"""Access control's pure parts: htpasswd and group files, rules, the guard (cache, throttle, bad headers)."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import argon2
import bcrypt
import pytest

from proxy.protocol.access import RuleError, Rules, parse_rule, parse_rules, project_of
from proxy.serving import passwords
from proxy.serving.guard import (
    BAD_CREDENTIALS,
    FORBIDDEN,
    THROTTLED,
    UNAUTHENTICATED,
    Guard,
    Pending,
    Refusal,
    User,
)
from proxy.serving.passwords import AuthFileError, Passwords


def htpasswd_line(user: str, password: str, scheme: str = "2y") -> str:
    if scheme == "argon2id":
        return f"{user}:{argon2.PasswordHasher().hash(password)}"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    return f"{user}:${scheme}${hashed[4:]}"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bcrypt_2y_2b_and_argon2id_are_accepted_and_weak_hashes_are_not(tmp_path: Path) -> None:
    f = write(tmp_path / "htpasswd", "\n".join([
        htpasswd_line("alice", "wonder-1"), htpasswd_line("bob", "builder-2", "2b"),
        htpasswd_line("carol", "argon-3", "argon2id"), "dave:$apr1$abcdefgh$0123456789abcdefghijkl",
        "# comment", "eve:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g="]) + "\n")
    pw = Passwords(f)
    assert pw.check("alice", "wonder-1") and pw.check("bob", "builder-2") and pw.check("carol", "argon-3")
    assert not pw.check("alice", "wonder-2") and not pw.check("carol", "argon-4")
    assert not pw.exists("dave") and not pw.exists("eve") and not pw.check("nobody", "x")
    # htpasswd -B reads 72 bytes; bcrypt 5 refuses longer input: ours truncates as htpasswd does.
    long = "p" * 100
    write(f, htpasswd_line("long", long[:72]) + "\n")
    os.utime(f, ns=(time.time_ns() + 10**9,) * 2)
    passwords_now = Passwords(f)
    assert passwords_now.check("long", long)


def test_the_file_is_re_read_when_it_changes_and_a_broken_one_keeps_the_last(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(passwords, "STAT_INTERVAL", 0.0)
    f = write(tmp_path / "htpasswd", htpasswd_line("alice", "one") + "\n")
    pw = Passwords(f)
    generation = pw.generation
    assert pw.check("alice", "one")
    write(f, htpasswd_line("alice", "two") + "\n")
    assert pw.check("alice", "two") and not pw.check("alice", "one")
    assert pw.generation != generation
    f.write_bytes(b"\xff\xfe not utf-8")
    assert pw.check("alice", "two")  # kept
    with pytest.raises(AuthFileError, match="cannot read"):
        Passwords(tmp_path / "absent")


def test_groups_file_and_rules() -> None:
    groups = passwords.parse_groups("staff: alice bob\n# x\nops: carol\nstaff: dave\n")
    assert groups == {"staff": frozenset({"alice", "bob", "dave"}), "ops": frozenset({"carol"})}
    read = Rules(parse_rules(["acme-*=@staff", "Acme_Tools=carol|@ops", "public-*=anonymous"]))
    assert read.allows("acme-secret", "alice", groups) and not read.allows("acme-secret", "carol", groups)
    assert read.allows("acme-tools", "carol", groups)  # normalised pattern, and rules add up
    assert not read.allows("acme-secret", None, groups)
    assert read.allows("numpy", None, groups)  # the default: anonymous
    # A private project is never anonymous, unless the operator accepted it.
    assert not read.allows("public-x", None, groups, private=True)
    assert read.allows("public-x", "anyone", groups, private=True)
    assert Rules(parse_rules("public-*=anonymous"), anonymous_private=True).allows("public-x", None, {}, private=True)
    # The repository as a whole: only '*' rules count.
    gateway = Rules(parse_rules("*=@staff"), default=frozenset({"authenticated"}))
    assert gateway.allows(None, "bob", groups) and not gateway.allows(None, "carol", groups)
    for bad in ("acme", "=alice", "acme=", "acme=al ice", "a/b=alice"):
        with pytest.raises(RuleError):
            parse_rule(bad)
    assert project_of("/simple/Acme.Tools/") == "acme-tools" and project_of("/packages/acme/acme-1.whl") == "acme"
    assert project_of("/simple/") is None and project_of("/simple/index.json") is None and project_of("/metrics") is None
    # tufproxy why --edge: the gateway's account of a project is read under that project's rules.
    assert project_of("/_tufproxy/why/Acme.Tools") == "acme-tools" and project_of("/_tufproxy/why/") is None


def guard_for(tmp_path: Path, **kwargs) -> Guard:
    f = write(tmp_path / "htpasswd", htpasswd_line("alice", "right") + "\n")
    return Guard(Passwords(f), Rules(parse_rules("acme-*=alice"), default=frozenset({"anonymous"})), **kwargs)


def identify(guard: Guard, header: str | None, client: str = "10.0.0.1") -> User | Refusal:
    found = guard.identify(header, client)
    return guard.verify(found) if isinstance(found, Pending) else found


def test_guard_checks_once_then_remembers_by_keyed_hash(tmp_path: Path, monkeypatch) -> None:
    guard = guard_for(tmp_path)
    checks = []
    real = guard.passwords.check
    monkeypatch.setattr(guard.passwords, "check", lambda u, p: checks.append(u) or real(u, p))
    assert identify(guard, None) == User(None)
    assert identify(guard, basic("alice", "right")) == User("alice")
    assert identify(guard, basic("alice", "right")) == User("alice")
    assert checks == ["alice"]
    assert guard.remembered(basic("alice", "right")) == User("alice")
    assert guard.remembered(basic("alice", "wrong")) is None
    # Nothing the cache holds is the password or the header.
    assert all(b"right" not in key and len(key) == 32 for key in guard._cache)
    assert guard.authorize(User(None), "acme-x").reason == UNAUTHENTICATED
    assert guard.authorize(User("bob"), "acme-x").reason == FORBIDDEN
    assert guard.authorize(User("alice"), "acme-x") is None and guard.authorize(User(None), "numpy") is None


def test_a_remembered_success_expires(tmp_path: Path) -> None:
    now = [1000.0]
    guard = guard_for(tmp_path, cache_ttl=10, clock=lambda: now[0])
    assert identify(guard, basic("alice", "right")) == User("alice")
    now[0] += 11
    assert guard.remembered(basic("alice", "right")) is None


def test_failures_are_throttled_per_client_and_per_user(tmp_path: Path) -> None:
    now = [1000.0]
    guard = guard_for(tmp_path, max_failures=3, window=60, clock=lambda: now[0])
    assert identify(guard, basic("alice", "right"), "10.0.0.9") == User("alice")
    for _ in range(3):
        assert identify(guard, basic("alice", "wrong"), "10.0.0.1").reason == UNAUTHENTICATED
    throttled = identify(guard, basic("mallory", "x"), "10.0.0.1")
    assert throttled.reason == THROTTLED and throttled.status == 429 and 1 <= throttled.retry_after <= 60
    # The same user from another address: throttled by name; a remembered success still passes.
    assert identify(guard, basic("alice", "guess"), "10.0.0.2").reason == THROTTLED
    assert identify(guard, basic("alice", "right"), "10.0.0.9") == User("alice")
    now[0] += 61
    assert identify(guard, basic("alice", "wrong"), "10.0.0.1").reason == UNAUTHENTICATED


@pytest.mark.parametrize("header", [
    "Basic " + "A" * 5000, "Basic ***", "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
    "Basic " + base64.b64encode(b"no-colon").decode(), "Basic " + base64.b64encode(b"a\x01b:x").decode(),
    "Basic " + base64.b64encode(b"u:" + b"p" * 2000).decode(),
])
def test_absurd_headers_are_a_400(tmp_path: Path, header: str) -> None:
    found = identify(guard_for(tmp_path), header)
    assert isinstance(found, Refusal) and found.reason == BAD_CREDENTIALS and found.status == 400


def test_a_401_challenges_for_basic(tmp_path: Path) -> None:
    found = identify(guard_for(tmp_path), "Bearer abc")
    assert found.status == 401 and found.headers()["WWW-Authenticate"].startswith('Basic realm="tufproxy"')
    assert "abc" not in found.message


def test_the_hot_path_reads_one_authorization_header_and_refuses_two() -> None:
    from proxy.protocol.requesthead import recognise

    head = recognise(b"GET /simple/x/ HTTP/1.1\r\nHost: a\r\nAuthorization: Basic YTpi\r\n\r\n")
    assert head is not None and head.authorization == "Basic YTpi"
    assert recognise(b"GET /simple/x/ HTTP/1.1\r\nHost: a\r\nAuthorization: Basic YTpi\r\n"
                     b"Authorization: Basic YTpj\r\n\r\n") is None


def test_credentials_taken_from_urls_never_print(tmp_path: Path, monkeypatch) -> None:
    from proxy.transport.credentials import OriginAuth, basic

    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    auth = OriginAuth()
    clean = auth.add("https://edge:s3cret-Pw@gateway.example:8443/")
    assert clean == "https://gateway.example:8443/" and "s3cret" not in repr(auth)
    sent = auth.headers("https://gateway.example:8443/metadata/timestamp.json")
    assert sent == {"Authorization": basic("edge", "s3cret-Pw")}
    assert auth.headers("https://gateway.example/") == {} and auth.headers("http://gateway.example:8443/") == {}
