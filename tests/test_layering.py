"""The import graph of ``proxy``: every module imports, and no two modules import each other.

Read from the source (every ``import`` statement, at any depth: a function-level
import is still a dependency), so a cycle is caught even where the order of
imports happens to hide it at run time.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "proxy"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[str]:
    """The ``proxy`` modules ``name`` imports: a submodule where one is named, else the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "proxy")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if base.split(".")[0] != "proxy":
                continue
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base


def graph() -> dict[str, set[str]]:
    return {name: set(imported(name, path)) - {name} for name, path in MODULES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"proxy.__main__"}))  # that one runs the CLI
def test_every_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_the_import_graph_has_no_cycle() -> None:
    edges = graph()
    assert len(edges) == len(MODULES) > 30
    assert all(target in MODULES for targets in edges.values() for target in targets), edges
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


# What runs the proxy or a command: nothing below it may import these.
TOP = ("proxy.cli", "proxy.serve", "proxy.serve_cli", "proxy.workers", "proxy.server", "proxy.mirror",
       "proxy.repository", "proxy.gateway", "proxy.cache_cli")


def _is_top(name: str) -> bool:
    return any(name == t or name.startswith(f"{t}.") for t in TOP)


def test_lower_layers_never_import_higher_ones() -> None:
    edges = graph()
    assert {name for name, targets in edges.items() if "proxy.cli" in targets} == {"proxy.__main__"}
    # The trust core (its own command line aside) and every helper module stay below what runs them.
    for name, targets in edges.items():
        if not _is_top(name) and name != "proxy.trust.cli" and name != "proxy.__main__":
            assert not [t for t in targets if _is_top(t)], f"{name} imports {sorted(t for t in targets if _is_top(t))}"


# A command imports its own module and what that needs, never what serves HTTP or runs another command.
FOREIGN_TO_CLIENT = ("proxy.serve", "proxy.server", "proxy.workers", "proxy.gateway", "proxy.mirror",
                     "proxy.repository", "proxy.resolver", "aiohttp.web", "prometheus_client", "diskcache")


def test_tufproxy_client_imports_only_what_it_runs() -> None:
    code = ("import sys\nfrom proxy.cli import main\ntry:\n    main(['client', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint(' '.join(sorted(sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--metadata-dir" in done.stdout, done.stderr
    loaded = set(done.stderr.split())
    assert "proxy.trust.cli" in loaded
    assert not {m for m in loaded if any(m == f or m.startswith(f"{f}.") for f in FOREIGN_TO_CLIENT)}


def test_every_command_is_registered_by_the_module_the_table_names() -> None:
    from proxy.cli import COMMANDS, build_parser

    def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    whole = commands(build_parser())
    assert list(whole) == list(COMMANDS)  # nothing registered that the table (and --help) does not name
    for name, (module, _) in COMMANDS.items():
        alone = commands(build_parser(name))
        assert alone[name].format_help() == whole[name].format_help(), f"{module} does not register {name}"
