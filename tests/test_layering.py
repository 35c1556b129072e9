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
import re
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


# The layers (docs/concepts/architecture.md): a module imports only from its own rank or below.
RANKS = {
    "proxy.util": 0,
    "proxy.protocol": 1,
    "proxy.transport": 2,
    "proxy.trust": 3,
    "proxy.storage": 4,
    "proxy.serving": 5,
    "proxy.repository": 6,
    "proxy.gateway": 7,
    "proxy.mirror": 7,
    "proxy.cli": 8,
}


def package_of(name: str) -> str:
    """The ranked package that holds module ``name`` (``proxy`` itself and ``__main__`` stand apart)."""
    if name in ("proxy", "proxy.__main__"):
        return name
    return ".".join(name.split(".")[:2])


def rank(name: str) -> int:
    return {"proxy": 0, "proxy.__main__": 9}.get(name, RANKS.get(package_of(name), -1))


def test_every_module_lives_in_a_ranked_package() -> None:
    assert not [m for m in MODULES if rank(m) < 0], "a module outside the rank table"
    for package in RANKS:
        path = ROOT / package.replace(".", "/") / "__init__.py"
        text = path.read_text()
        assert text.startswith('"""'), f"{package} has no docstring saying what it owns"
        assert "__all__" in text, f"{package} has no __all__"


def test_lower_layers_never_import_higher_ones() -> None:
    upward = sorted(f"{m} ({rank(m)}) -> {t} ({rank(t)})" for m, ts in graph().items() for t in ts if rank(t) > rank(m))
    assert not upward, "\n".join(upward)


def test_packages_form_no_cycle_and_gateway_and_mirror_stay_apart() -> None:
    packages: dict[str, set[str]] = {}
    for m, ts in graph().items():
        packages.setdefault(package_of(m), set()).update(package_of(t) for t in ts if package_of(t) != package_of(m))
    cycle = find_cycle(packages)
    assert cycle is None, " -> ".join(cycle or ())
    assert "proxy.mirror" not in packages["proxy.gateway"] and "proxy.gateway" not in packages["proxy.mirror"]


def test_the_rank_checker_catches_an_upward_import() -> None:
    assert rank("proxy.protocol.index") < rank("proxy.transport.upstream") < rank("proxy.cli.serve")
    assert rank("proxy.gateway.app") == rank("proxy.mirror.sync")


def test_the_protocol_layer_loads_no_aiohttp() -> None:
    code = ("import sys, pkgutil, importlib, proxy.protocol as p\n"
            "for m in pkgutil.iter_modules(p.__path__):\n    importlib.import_module(f'proxy.protocol.{m.name}')\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'asyncio', 'diskcache', 'obstore'))\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# A command imports its own module and what that needs, never what serves HTTP or runs another command.
FOREIGN_TO_CLIENT = ("proxy.serving.serve", "proxy.serving.server", "proxy.serving.workers", "proxy.gateway", "proxy.mirror",
                     "proxy.repository", "proxy.serving.resolver", "aiohttp.web", "prometheus_client", "diskcache")


def test_tufproxy_client_imports_only_what_it_runs() -> None:
    code = ("import sys\nfrom proxy.cli import main\ntry:\n    main(['client', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint(' '.join(sorted(sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--metadata-dir" in done.stdout, done.stderr
    loaded = set(done.stderr.split())
    assert "proxy.cli.client" in loaded
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


def test_the_readme_and_the_architecture_page_show_this_rank_table() -> None:
    root = Path(__file__).resolve().parents[1]
    for doc in (root / "README.md", root / "docs" / "concepts" / "architecture.md"):
        shown = {f"proxy.{name}": int(rank) for rank, names in
                 re.findall(r"^\| (\d) \| (`proxy\.[a-z]+`(?:, `proxy\.[a-z]+`)*) \|", doc.read_text(), re.M)
                 for name in re.findall(r"`proxy\.([a-z]+)`", names)}
        assert shown == RANKS, doc
