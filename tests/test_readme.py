"""README's quick start: the two commands a new user copies, and CI running the second word for word."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start() -> list[str]:
    """The lines of README's first code block."""
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block is not None
    return block.group(1).strip().splitlines()


def test_ci_runs_readmes_test_command_word_for_word() -> None:
    demo, tests = quick_start()
    assert (ROOT / ".ci/run").read_text().strip().splitlines()[-1] == tests
    # Both work on a PEP 668 system Python: a virtual environment, and nothing run from outside it.
    for line in (demo, tests):
        first, *rest = line.split(" && ")
        assert first == "python3 -m venv .venv"
        assert all(step.startswith(".venv/bin/") for step in rest), line


def test_the_virtual_environment_is_ignored_and_not_collected() -> None:
    assert "/.venv/" in (ROOT / ".gitignore").read_text().splitlines()
    assert re.search(r'^testpaths = \["tests"\]$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
