"""Every ``tufproxy`` command shown in README.md and docs/ is one the command line accepts.

A command in a code block is split into words and walked down the real
argparse parser: each subcommand must exist and each ``--flag`` must be one
of that subcommand's options, so a renamed or removed flag fails here, not
in a reader's terminal.  The generated reference pages are checked to be
built from the code.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.cli import build_parser
from proxy.storage.audit import _words_parser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import gen_ref  # noqa: E402 - the docs' own generator, beside the pages

_BLOCK = re.compile(r"```(?:sh|bash|console|shell)\n(.*?)```", re.DOTALL)
_COMMAND = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?tufproxy\s+(.*)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commands(text: str) -> Iterator[str]:
    """The tufproxy command lines of ``text``'s shell blocks (continuations joined, comments dropped)."""
    for block in _BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            if (found := _COMMAND.search(line)) and not line.lstrip().startswith("#"):
                yield found.group(1).split(" && ")[0].split(" | ")[0].strip()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What in ``words`` the parser would not accept: unknown subcommands and flags."""
    problems = []
    while words and (children := _subparsers(parser)):
        word = words[0]
        if word.startswith("-"):
            break
        if word not in children:
            return [f"no subcommand {word!r} in {parser.prog}"]
        parser, words = children[word], words[1:]
    if parser.prog == "tufproxy audit" and words[:1] == ["who-got"]:
        # ``audit`` parses its own words (options among LOGs): who-got's parser is built there.
        parser, words = _words_parser(True), words[1:]
    known = {s for a in parser._actions for s in a.option_strings}
    for word in words:
        if word.startswith("--") and word.split("=", 1)[0] not in known:
            problems.append(f"{parser.prog} has no {word.split('=', 1)[0]}")
    return problems


CASES = [(doc.relative_to(ROOT).as_posix(), line) for doc in documents() for line in commands(doc.read_text())]


def test_the_documents_show_commands() -> None:
    assert len(CASES) > 20


@pytest.mark.parametrize(("doc", "line"), CASES)
def test_every_documented_command_is_accepted(doc: str, line: str) -> None:
    words = shlex.split(line.replace("…", ""), comments=True)
    assert not check(words, build_parser()), f"{doc}: tufproxy {line}"


def test_the_checker_catches_a_wrong_flag_and_command() -> None:
    parser = build_parser()
    assert check(["serve", "--upstream", "u", "--root", "r"], parser) == []
    assert check(["serve", "--upstreams", "u"], parser) == ["tufproxy serve has no --upstreams"]
    assert check(["gateway", "sevre", "DIR"], parser) == ["no subcommand 'sevre' in tufproxy gateway"]


def test_the_reference_pages_come_from_the_code() -> None:
    cli, metrics, reasons = gen_ref.cli_page(), gen_ref.metrics_page(), gen_ref.refusals_page()
    for path, parser in gen_ref.commands(build_parser()):
        assert f"## `{' '.join(path)}`" in cli and parser.format_help().rstrip() in cli
    assert "`tufproxy_refusals_total` | counter | `kind`, `reason`" in metrics
    assert "`tufproxy_gateway_requests_total` | counter | `route`, `status`" in metrics
    assert "| `hash-mismatch` | repository | 502 | yes |" in reasons
    assert "| `foreign-link` | operator | 502 | yes |" in reasons
