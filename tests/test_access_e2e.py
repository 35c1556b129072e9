"""Access control end to end: an internal index that demands basic auth, a gateway, an edge, real pip and uv.

The leak of issue 36, closed: a gateway given an internal index's credentials no longer serves its
projects to anyone, and an edge serves them only to the users its rules allow; anonymous clients get
public projects and cannot tell a private project from an absent one.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import clean_env, uv_path
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex

INDEX_PASSWORD = "idx-Secret-4412"
GATEWAY_PASSWORD = "gw-Edge-Pass-9931"
ALICE_PASSWORD = "alice-Pass-7781"
BOB_PASSWORD = "bob-Pass-2290"
NEW_ALICE_PASSWORD = "alice-Rotated-5523"
PASSWORDS = (INDEX_PASSWORD, GATEWAY_PASSWORD, ALICE_PASSWORD, BOB_PASSWORD, NEW_ALICE_PASSWORD)


def htpasswd(path: Path, users: dict[str, str]) -> Path:
    lines = [f"{u}:$2y${bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=5)).decode()[4:]}" for u, p in users.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(url: str, auth: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url, method="POST", data=b"", headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def with_credentials(url: str, user: str, password: str) -> str:
    return url.replace("http://", f"http://{user}:{password}@")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # type: ignore[type-arg]
    """An internal index (basic auth) with secretpkg, a public one with publicpkg, a gateway, an edge."""
    tmp = tmp_path_factory.mktemp("access")
    internal = TestIndex(basic_auth=basic("reader", INDEX_PASSWORD))
    public = TestIndex()
    with internal, public:
        internal.add(build_wheel(tmp / "dists", "secretpkg", "1.0"))
        internal.add(build_wheel(tmp / "dists", "internalpkg", "1.0"))
        public.add(build_wheel(tmp / "dists", "publicpkg", "1.0"))
        gateway_init(tmp / "gw")
        gw_users = htpasswd(tmp / "gw.htpasswd", {"edge": GATEWAY_PASSWORD})
        gw = GatewayProcess(tmp / "gw", "--index-url", with_credentials(internal.url, "reader", INDEX_PASSWORD),
                            "--index-url", public.url, "--auth-file", str(gw_users))
        users = htpasswd(tmp / "edge.htpasswd", {"alice": ALICE_PASSWORD, "bob": BOB_PASSWORD})
        (tmp / "groups").write_text("staff: alice\n")
        with gw:
            edge = ProxyProcess(tmp / "edge", "--profile", "gateway", "--upstream",
                                with_credentials(gw.base, "edge", GATEWAY_PASSWORD), "--root", str(gw.root),
                                "--workers", "1", "--refresh-interval", "0.5", "--audit-log", str(tmp / "edge.audit"),
                                "--auth-file", str(users), "--auth-groups", str(tmp / "groups"),
                                "--read-rule", "secret*=@staff")
            with edge:
                yield {"tmp": tmp, "gw": gw, "edge": edge, "users": users, "internal": internal}


def test_a_gateway_over_a_password_protected_index_without_auth_file_refuses_to_start(tmp_path: Path) -> None:
    with TestIndex(basic_auth=basic("reader", INDEX_PASSWORD)) as internal:
        gateway_init(tmp_path / "gw")
        r = subprocess.run([sys.executable, "-m", "proxy", "gateway", "serve", str(tmp_path / "gw"), "--listen",
                            "127.0.0.1:0", "--index-url", with_credentials(internal.url, "reader", INDEX_PASSWORD)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and internal.url in lines[0] and "--auth-file" in lines[0], lines
    assert "--allow-anonymous-private yes" in lines[0]
    assert INDEX_PASSWORD not in r.stdout + r.stderr


@pytest.mark.slow
def test_the_gateway_serves_anonymous_clients_nothing_but_health(world: dict) -> None:  # type: ignore[type-arg]
    gw = world["gw"]
    for path in ("simple/", "simple/secretpkg/", "metadata/timestamp.json", "metadata/1.root.json", "metrics",
                 "packages/secretpkg/secretpkg-1.0-py3-none-any.whl"):
        status, headers, _ = get(gw.base + path)
        assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="tufproxy"'), path
    assert get(gw.base + "healthz")[0] == 200
    # An anonymous publish: 401, and nothing fetched or signed for it.
    asked = len(world["internal"].requests)
    assert post(f"{gw.base}_tufproxy/publish/secretpkg") == 401
    assert post(f"{gw.base}_tufproxy/publish/secretpkg", basic("edge", "wrong")) == 401
    assert len(world["internal"].requests) == asked
    # Nothing asked for secretpkg before (this module's tests run in order): still nothing signed for it.
    assert not (gw.directory / "public" / "simple" / "secretpkg").exists()
    assert any(r.get("reason") == "unauthenticated" and r.get("target", "").startswith("/_tufproxy/publish/")
               for r in gw.audit())


def test_anonymous_clients_of_the_edge_get_public_projects_and_learn_nothing_private(world: dict) -> None:  # type: ignore[type-arg]
    edge = world["edge"]
    alice = basic("alice", ALICE_PASSWORD)
    status, _, page = get(edge.url + "secretpkg/", alice)
    assert status == 200 and b"secretpkg-1.0-py3-none-any.whl" in page
    assert get(edge.url + "publicpkg/")[0] == 200
    # Anonymous: a private project no rule names is what an absent project is, name aside: page, file, .metadata.
    bob = basic("bob", BOB_PASSWORD)
    assert get(edge.url + "internalpkg/", bob)[0] == 200  # private: any authenticated user (the default)
    for private, absent in (("simple/internalpkg/", "simple/nosuchpkg/"),
                            ("packages/internalpkg/internalpkg-1.0-py3-none-any.whl",
                             "packages/nosuchpkg/nosuchpkg-1.0-py3-none-any.whl"),
                            ("packages/internalpkg/internalpkg-1.0-py3-none-any.whl.metadata",
                             "packages/nosuchpkg/nosuchpkg-1.0-py3-none-any.whl.metadata")):
        seen, expected = get(edge.base + private), get(edge.base + absent)
        assert seen[0] == expected[0] == 404, (private, seen, expected)
        assert seen[2].replace(b"internalpkg", b"X") == expected[2].replace(b"nosuchpkg", b"X"), (seen[2], expected[2])
        # Nor do their headers tell them apart: the absent one's miss asked the gateway, and saying so would.
        assert "Server-Timing" not in seen[1] and "Server-Timing" not in expected[1], (seen[1], expected[1])
        assert get(edge.base + private, bob)[0] == 200
    # Under a rule (secret*=@staff) every name is 401 to anonymous clients, published or not, alike.
    secret, absent = get(edge.url + "secretpkg/"), get(edge.url + "secretnothere/")
    assert secret[0] == absent[0] == 401 and secret[2] == absent[2]
    root = get(edge.url)
    assert root[0] == 200 and b"publicpkg" in root[2] and b"secretpkg" not in root[2] and b"internalpkg" not in root[2]
    assert get(edge.url, alice)[2] == root[2]  # the signed root list never names private projects
    # A user outside @staff: the rule says no (403), for an absent name under the rule too.
    assert get(edge.url + "secretpkg/", bob)[0] == get(edge.url + "secretnothere/", bob)[0] == 403
    metrics = get(edge.base + "metrics")[2].decode()
    assert "secretpkg" not in metrics and 'tufproxy_access_refusals_total{reason="forbidden"}' in metrics


def test_an_edge_without_auth_file_serves_private_projects_to_nobody(world: dict) -> None:  # type: ignore[type-arg]
    gw, tmp = world["gw"], world["tmp"]
    edge = ProxyProcess(tmp / "open-edge", "--profile", "gateway", "--upstream",
                        with_credentials(gw.base, "edge", GATEWAY_PASSWORD), "--root", str(gw.root), "--workers", "1",
                        "--audit-log", str(tmp / "open-edge.audit"))
    with edge:
        assert get(edge.url + "publicpkg/")[0] == 200
        # Without --auth-file nobody is authenticated here, whatever the client sends: fail closed.
        assert get(edge.url + "internalpkg/", basic("alice", ALICE_PASSWORD))[0] == 404
        assert get(edge.url + "internalpkg/")[0] == 404
        assert b"internalpkg" not in get(edge.url)[2]
    assert "serves them to nobody" in edge.log()


def run_client(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env={**clean_env(), **env})


def pip_download(index_url: str, dest: Path, *requirements: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run_client([sys.executable, "-m", "pip", "--no-cache-dir", "--isolated", "--disable-pip-version-check",
                       "download", "--no-deps", "--index-url", index_url, "-d", str(dest), *requirements], env or {})


def test_pip_with_credentials_in_the_url_and_in_netrc(world: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    edge = world["edge"]
    anonymous = pip_download(edge.url, tmp_path / "anon", "secretpkg")
    assert (anonymous.returncode != 0 and not (tmp_path / "anon").exists()) or not list((tmp_path / "anon").iterdir())
    r = pip_download(with_credentials(edge.url, "alice", ALICE_PASSWORD), tmp_path / "url", "secretpkg")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in (tmp_path / "url").iterdir()] == ["secretpkg-1.0-py3-none-any.whl"]
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login alice password {ALICE_PASSWORD}\n")
    netrc.chmod(0o600)
    r = pip_download(edge.url, tmp_path / "netrc-dl", "secretpkg", env={"NETRC": str(netrc)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert ALICE_PASSWORD not in r.stdout + r.stderr


@pytest.mark.skipif(uv_path() is None, reason="uv is not installed")
def test_uv_with_uv_index_variables(world: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    edge = world["edge"]
    argv = [uv_path(), "pip", "install", "--python", sys.executable, "--target", str(tmp_path / "t"),
            "--index", f"internal={edge.url}", "--index-strategy", "first-index", "secretpkg"]
    env = {"UV_INDEX_INTERNAL_USERNAME": "alice", "UV_INDEX_INTERNAL_PASSWORD": ALICE_PASSWORD}
    r = run_client(argv, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "t" / "secretpkg").is_dir()
    r = run_client([*argv[:-1], "publicpkg"], {})
    assert r.returncode == 0, r.stdout + r.stderr


def _sync(world: dict, upstream: str, dest: Path) -> subprocess.CompletedProcess[str]:  # type: ignore[type-arg]
    """``tufproxy mirror sync`` of secretpkg from the world's gateway, auditing into the world's directory."""
    return subprocess.run([sys.executable, "-m", "proxy", "mirror", "sync", "--profile", "gateway", "--upstream",
                           upstream, "--root", str(world["gw"].root), "--dest", str(dest), "--project", "secretpkg",
                           "--audit-log", str(world["tmp"] / "sync.audit")],
                          capture_output=True, text=True, timeout=180)


def test_mirror_sync_authenticates_to_the_gateway(world: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    gw = world["gw"]

    def sync(upstream: str, dest: Path) -> subprocess.CompletedProcess[str]:
        return _sync(world, upstream, dest)
    anonymous = sync(gw.base, tmp_path / "anon")
    assert anonymous.returncode != 0 and "401" in anonymous.stdout + anonymous.stderr
    r = sync(with_credentials(gw.base, "edge", GATEWAY_PASSWORD), tmp_path / "mirror")
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((tmp_path / "mirror").rglob("secretpkg-1.0-py3-none-any.whl"))
    assert GATEWAY_PASSWORD not in r.stdout + r.stderr + anonymous.stdout + anonymous.stderr


def test_the_htpasswd_file_is_re_read_while_running(world: dict) -> None:  # type: ignore[type-arg]
    edge = world["edge"]
    htpasswd(world["users"], {"alice": NEW_ALICE_PASSWORD, "bob": BOB_PASSWORD})
    wait_for(lambda: get(edge.url + "secretpkg/", basic("alice", NEW_ALICE_PASSWORD))[0] == 200, timeout=20,
             what="the new password accepted")
    assert get(edge.url + "secretpkg/", basic("alice", ALICE_PASSWORD))[0] == 401


def test_wrong_passwords_are_refused_then_throttled(world: dict) -> None:  # type: ignore[type-arg]
    # After the others: loopback is one client address, throttled for a minute from here on.
    edge = world["edge"]
    statuses = [get(edge.url + "publicpkg/", basic("mallory", f"guess-{i}"))[0] for i in range(12)]
    assert statuses[0] == 401 and 429 in statuses, statuses
    first = statuses.index(429)
    assert all(s == 401 for s in statuses[:first]) and all(s == 429 for s in statuses[first:])
    status, headers, body = get(edge.url + "publicpkg/", basic("mallory", "guess-x"))
    assert status == 429 and int(headers["Retry-After"]) >= 1 and b"guess" not in body
    audit = (world["tmp"] / "edge.audit").read_text()
    assert '"reason": "throttled"' in audit and '"reason": "unauthenticated"' in audit


def test_no_password_reaches_a_log_or_audit_file(world: dict) -> None:  # type: ignore[type-arg]
    # Run last in this module (pytest keeps file order): every log and audit file written so far.  Under
    # pytest-xdist this module's tests may be split between workers, each with a world of its own, so the
    # authenticated sync whose audit file is read is run here too.
    tmp = world["tmp"]
    synced = _sync(world, with_credentials(world["gw"].base, "edge", GATEWAY_PASSWORD), tmp / "mirror-for-logs")
    assert synced.returncode == 0 and GATEWAY_PASSWORD not in synced.stdout + synced.stderr, synced.stderr
    files = [p for p in tmp.rglob("*") if p.is_file() and p.suffix in (".log", ".audit", ".jsonl", ".json")]
    assert (tmp / "sync.audit") in files
    files += [world["gw"].log_path, world["gw"].audit_path, world["edge"].log_path]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        for password in PASSWORDS:
            assert password not in text, f"{password} in {path}"
            assert base64.b64encode(password.encode()).decode()[:12] not in text
