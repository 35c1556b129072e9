"""``tufproxy serve`` settings and startup, and ``tufproxy demo`` as a new user runs it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.serving.config import OPTIONS, ConfigError, add_arguments, resolve
from tests.support.net import free_port


def parse(argv: list[str], env: dict[str, str] | None = None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(argv), env or {})


def test_flags_beat_env_which_beats_the_toml_file(tmp_path: Path) -> None:
    conf = tmp_path / "tufproxy.toml"
    conf.write_text('upstream = ["http://file.example/"]\nroot = "root.json"\nrefresh_interval = 5\ncache_size = "1G"\n'
                    'listen = "0.0.0.0:9000"\n')
    c = parse(["--config", str(conf)])
    assert c.upstream == ["http://file.example/"] and c.refresh_interval == 5 and c.cache_size == 2**30
    assert c.listen == ("0.0.0.0", 9000)
    c = parse(["--config", str(conf)], {"TUFPROXY_REFRESH_INTERVAL": "7", "TUFPROXY_UPSTREAM": "http://env.example"})
    assert c.refresh_interval == 7 and c.upstream == ["http://env.example/"]
    c = parse(["--config", str(conf), "--refresh-interval", "9", "--upstream", "http://a/", "--upstream", "http://b/"],
              {"TUFPROXY_REFRESH_INTERVAL": "7"})
    assert c.refresh_interval == 9 and c.upstream == ["http://a/", "http://b/"]
    assert c.metadata_url("http://a/") == "http://a/metadata/"


@pytest.mark.parametrize("argv,message", [
    ([], "--upstream"),
    (["--upstream", "ftp://x/"], "http"),
    (["--upstream", "http://x/", "--cache-size", "lots"], "size"),
    (["--upstream", "http://x/", "--listen", "nowhere"], "HOST:PORT"),
    (["--upstream", "http://x/", "--refresh-interval", "-1"], "more than 0"),
])
def test_bad_settings_are_refused_with_a_reason(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(argv)


def test_a_synced_mirror_names_its_profile_and_a_flag_overrides_it(tmp_path: Path) -> None:
    (tmp_path / ".mirror").mkdir()
    assert parse(["--repository", str(tmp_path)]).profile is None  # no manifest yet: detected when serving
    (tmp_path / ".mirror/manifest.json").write_text('{"profile": "gateway", "targets": []}')
    assert parse(["--repository", str(tmp_path)]).profile == "gateway"
    assert parse(["--repository", str(tmp_path), "--profile", "tufproxy"]).profile == "tufproxy"
    assert parse(["--upstream", "http://127.0.0.1:9/", "--root", "r.json"]).profile is None


def test_unknown_toml_keys_are_refused(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('upstream = ["http://x/"]\nrefersh_interval = 1\n')
    with pytest.raises(ConfigError, match="refersh_interval"):
        parse(["--config", str(conf)])


def test_serve_help_documents_every_option() -> None:
    out = subprocess.run([sys.executable, "-m", "proxy", "serve", "--help"], capture_output=True, text=True).stdout
    for opt in OPTIONS:
        assert opt.flag in out and opt.env in out, opt.name


def test_unusable_cache_dir_is_a_clear_error_and_exit_2(tmp_path: Path, sample_repo) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache dir should be")
    proc = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--repository", str(sample_repo.repo.public_dir),
         "--cache-dir", str(blocker / "cache"), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "cache dir" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_demo_prints_a_pip_line_that_works(tmp_path: Path) -> None:
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "proxy", "demo", "--dir", str(tmp_path / "demo"), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        for line in demo.stdout:  # the demo prints its pip line once it is listening
            lines.append(line)
            if line.strip().startswith("pip install --index-url"):
                break
        else:
            raise AssertionError("demo exited without a pip line:\n" + "".join(lines))
        tried = [line.strip() for line in lines if line.startswith("  ")]
        # First a client venv (a distribution's Python refuses pip outside one) and how to get uv.
        assert tried[0].startswith("python3 -m venv ") and tried[1].startswith("pip install uv"), tried
        # The venv line and the pip line as a user pastes them: the venv's own pip, not the test's.
        script = f"set -e\n{tried[0]}\n{tried[2]}\npython -c 'import demo_app, demo_lib, demo_base'\n"
        r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"})
        assert r.returncode == 0, (script, r.stdout, r.stderr)
        assert "Successfully installed demo-app-1.0 demo-base-2.0 demo-lib-1.1" in r.stdout
    finally:
        demo.terminate()
        assert demo.wait(timeout=30) == 0
