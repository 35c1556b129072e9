"""One option resolver (proxy.protocol.options): ``serve`` and ``gateway serve`` read the same inputs the same way.

The same flags, ``TUFPROXY_*`` variables and TOML file are given to both
commands, parsed by their real argument parsers: each setting both declare
resolves to the same value by the same precedence, and a bad value gets the
same one-line error, whichever source it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import build_parser, main
from proxy.cli.gateway import OPTIONS as GATEWAY_OPTIONS
from proxy.cli.gateway import resolve_serve
from proxy.protocol.options import ConfigError, Option, add_options, load_config, resolve_values
from proxy.serving.config import OPTIONS as SERVE_OPTIONS
from proxy.serving.config import resolve

# What each command needs besides the settings under test (a mirror to read, a directory to serve).
SERVE = ["serve", "--upstream", "http://127.0.0.1:9/", "--root", "root.json"]
GATEWAY = ["gateway", "serve", "gateway-dir", "--index-url", "http://127.0.0.1:9/simple/"]


def serve_values(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    return vars(resolve(build_parser("serve").parse_args([*SERVE, *argv]), env))


def gateway_values(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    return resolve_serve(build_parser("gateway").parse_args([*GATEWAY, *argv]), env)[0]


COMMANDS: dict[str, Callable[[list[str], dict[str, str]], dict[str, Any]]] = {
    "serve": serve_values, "gateway serve": gateway_values}

# (setting, flag value, variable value, TOML line, default): each a different value, to tell the sources apart.
SHARED = [
    ("read_timeout", ("9", 9.0), ("7", 7.0), ("read_timeout = 5", 5.0), 30.0),
    ("connect_timeout", ("2.5", 2.5), ("3", 3.0), ("connect_timeout = 4.5", 4.5), 10.0),
    ("listen", ("127.0.0.1:1", ("127.0.0.1", 1)), ("[::1]:2", ("::1", 2)), ('listen = "0.0.0.0:3"', ("0.0.0.0", 3)),
     None),
    ("max_file_size", ("1G", 2**30), ("512M", 2**29), ("max_file_size = 1024", 1024), 4 * 2**30),
    ("log_level", ("debug", "debug"), ("warning", "warning"), ('log_level = "error"', "error"), "info"),
    ("audit_log", ("a.log", Path("a.log")), ("b.log", Path("b.log")), ('audit_log = "c.log"', Path("c.log")), None),
]


def test_the_shared_settings_are_the_ones_both_declare() -> None:
    serve = {o.name: o for o in SERVE_OPTIONS}
    shared = {o.name for o in GATEWAY_OPTIONS if o.name in serve}
    assert {name for name, *_ in SHARED} <= shared
    for name in {name for name, *_ in SHARED}:
        (gateway,) = [o for o in GATEWAY_OPTIONS if o.name == name]
        assert gateway.parse is serve[name].parse, name  # one parser: one conversion


@pytest.mark.parametrize("name,flag,env,toml,default", SHARED, ids=[s[0] for s in SHARED])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_flag_beats_env_beats_file_beats_default(tmp_path: Path, command: str, name: str, flag: tuple[str, Any],
                                                 env: tuple[str, Any], toml: tuple[str, Any], default: Any) -> None:
    values = COMMANDS[command]
    conf = tmp_path / "c.toml"
    conf.write_text(toml[0] + "\n")
    option = Option(name, "")
    argv, environ = ["--config", str(conf), option.flag, flag[0]], {option.env: env[0]}
    assert values(argv, environ)[name] == flag[1]
    assert values(argv[:2], environ)[name] == env[1]
    assert values(argv[:2], {})[name] == toml[1]
    if default is not None:
        assert values([], {})[name] == default


# (where the bad value goes, the value, the error line after "<source>: ").
BAD = [
    ("flag", "--read-timeout", "soon", "wants a number more than 0, not 'soon'"),
    ("env", "TUFPROXY_READ_TIMEOUT", "-1", "wants a number more than 0, not '-1'"),
    ("toml", "read_timeout", "true", "wants a number, not true"),
    ("toml", "read_timeout", "[1, 2]", "takes one value, not a list"),
    ("toml", "listen", "8080", "wants HOST:PORT, not int 8080"),
    ("toml", "max_file_size", '"lots"', "not a size: 'lots' (try 512M, 10G)"),
    ("flag", "--listen", "nowhere", "wants HOST:PORT, not 'nowhere'"),
]


@pytest.mark.parametrize("where,key,value,why", BAD, ids=[f"{w}-{k}-{v}" for w, k, v, _ in BAD])
def test_a_bad_value_is_the_same_one_line_error_in_both(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, where: str, key: str,
                                                        value: str, why: str) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f"{key} = {value}\n" if where == "toml" else "")
    argv = ["--config", str(conf), *([key, value] if where == "flag" else [])]
    if where == "env":
        monkeypatch.setenv(key, value)
    source = {"flag": key, "env": key, "toml": f"{conf}: {key}"}[where]
    lines = []
    for command in (SERVE, GATEWAY):
        assert main([*command, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        lines.append(err.split(": error: ", 1)[1].strip())
    assert lines[0] == lines[1] == f"{source}: {why}"


def test_an_unknown_key_and_a_broken_file_are_refused_alike(tmp_path: Path) -> None:
    known = [o.name for o in SERVE_OPTIONS]
    with pytest.raises(ConfigError, match=r"^unknown settings in f.toml: refersh_interval$"):
        load_config("refersh_interval = 1\n", "f.toml", known)
    with pytest.raises(ConfigError, match=r"^cannot read config file f.toml: "):
        load_config("workers = \n", "f.toml", known)
    for command in (SERVE, GATEWAY):
        (tmp_path / "u.toml").write_text("refersh_interval = 1\n")
        assert main([*command, "--config", str(tmp_path / "u.toml")]) == 2


def test_repeated_settings_take_flags_lists_and_split_text() -> None:
    urls = Option("upstream", "", [], SERVE_OPTIONS[0].parse, repeat=True)
    parser = __import__("argparse").ArgumentParser()
    add_options(parser, [urls])
    args = parser.parse_args(["--upstream", "http://a/", "--upstream", "http://b/,http://c"])
    assert resolve_values(args, [urls], {}, {}) == {"upstream": ["http://a/", "http://b/", "http://c/"]}
    assert resolve_values(None, [urls], {"TUFPROXY_UPSTREAM": "http://d http://e"}, {}) == {
        "upstream": ["http://d/", "http://e/"]}
    assert resolve_values(None, [urls], {}, {"upstream": ["http://f"]}) == {"upstream": ["http://f/"]}
    assert resolve_values(None, [urls], {}, {}) == {"upstream": []}


def test_mirror_sync_words_a_bad_value_as_serve_and_gateway_serve_do(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    mirror = ["mirror", "sync", "--upstream", "http://127.0.0.1:9/", "--root", "root.json", "--dest",
              str(tmp_path / "dest"), "--project", "p"]
    lines = []
    for command in (SERVE, GATEWAY, mirror):
        assert main([*command, "--max-file-size", "lots"]) == 2
        lines.append(capsys.readouterr().err.split(": error: ", 1)[1].strip())
    assert lines == ["--max-file-size: not a size: 'lots' (try 512M, 10G)"] * 3
    assert not (tmp_path / "dest").exists()
