"""The command line helps a newcomer: no silent abbreviations, typos answered with the nearest flag and the
subcommand's own help, defaults in ``--help`` that say what happens, errors naming the right ``init``.
(The demo's printed lines, client venv first, run in tests/test_serve_cli.py.)

Every invocation is a real ``python -m proxy`` subprocess.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_cli_errors import ERROR_LINE, tufproxy


@pytest.mark.parametrize("argv,says", [
    # An abbreviation is a typo too: it once started a gateway.
    (["gateway", "serve", "{tmp}", "--index-ur", "http://127.0.0.1:9/"],
     "unrecognized arguments: --index-ur (did you mean --index-url?) http://127.0.0.1:9/ "
     "(see tufproxy gateway serve --help)"),
    (["gateway", "serve", "{tmp}", "--index-url", "http://127.0.0.1:9/", "--files-orgin", "http://127.0.0.1:9/"],
     "--files-orgin (did you mean --files-origin?)"),
    (["serve", "--upstrem=http://127.0.0.1:9/"], "--upstrem=http://127.0.0.1:9/ (did you mean --upstream?) "
     "(see tufproxy serve --help)"),
    (["mirror", "sync", "--upstream", "http://127.0.0.1:9/", "--root", "r.json", "--dest", "d", "--projekt", "x"],
     "--projekt (did you mean --project?) x (see tufproxy mirror sync --help)"),
    (["repo", "init", "{tmp}/r", "--bin", "4"], "(see tufproxy repo init --help)"),
], ids=["abbreviation", "typo", "typo-with-value", "nested", "abbreviation-of-int-flag"])
def test_an_unknown_flag_names_the_nearest_one_and_the_subcommands_help(argv: list[str], says: str,
                                                                        tmp_path: Path) -> None:
    done = tufproxy([a.replace("{tmp}", str(tmp_path)) for a in argv], tmp_path)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert ERROR_LINE.fullmatch(line) and says in line, line
    assert not (tmp_path / "r").exists()


def _option_helps(text: str) -> dict[str, str]:
    """Each ``--flag``'s help text in a ``--help`` output, on one line."""
    helps: dict[str, str] = {}
    for block in re.split(r"\n  (?=--)", text.split("options:", 1)[1]):
        flag = block.split()[0]
        helps[flag] = " ".join(block.split())
    return helps


@pytest.mark.parametrize("command", [["serve"], ["gateway", "serve"]])
def test_help_shows_the_default_that_happens(command: list[str], tmp_path: Path) -> None:
    helps = _option_helps(tufproxy([*command, "--help"], tmp_path).stdout)
    if command == ["serve"]:
        assert "default: detected from the verified targets delegations" in helps["--profile"]
    for flag, text in helps.items():
        # One default per option, and never "none" beside a sentence that says otherwise.
        assert text.count("default") <= 1 or "default: none" not in text, (flag, text)
        assert "(default" not in text, (flag, text)
    if command == ["serve"]:
        assert "[env TUFPROXY_VERIFY_BEFORE_SEND; default: no]" in helps["--verify-before-send"]
        assert "default: none]" not in helps["--metadata-path"] + helps["--root"] + helps["--audit-log"]


@pytest.mark.parametrize("action", [["serve", "{dir}", "--index-url", "http://127.0.0.1:9/"], ["ledger", "{dir}"],
                                    ["policy", "{dir}"], ["revoke", "{dir}", "lib"]])
def test_a_missing_gateway_directory_names_gateway_init(action: list[str], tmp_path: Path) -> None:
    directory = tmp_path / "gw"
    done = tufproxy(["gateway", *(a.replace("{dir}", str(directory)) for a in action)], tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert f"create one with 'tufproxy gateway init {directory}'" in line and "repo init" not in line, line
