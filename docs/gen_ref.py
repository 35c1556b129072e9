"""The reference pages, generated from the code at build time so they cannot drift from it.

mkdocs-gen-files runs this during ``mkdocs build``: the command line from the
argparse parser, the metrics from the Prometheus registries that ``serve``
and ``gateway serve`` export, and the refusal reasons from the one refusal
table.  ``tests/test_docs.py`` imports the same functions.
"""

from __future__ import annotations

import argparse
import inspect
import pkgutil
from collections.abc import Iterator

import proxy
from proxy.protocol import refusals


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("tufproxy",)) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command of ``parser``, depth first, with its words."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))


def cli_page() -> str:
    from proxy.cli import build_parser

    out = ["# Command line", "", "Every command's `--help`, as `tufproxy` prints it.", ""]
    for path, parser in commands(build_parser()):
        out += [f"## `{' '.join(path)}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _metrics(owner: object) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    from prometheus_client.metrics import MetricWrapperBase

    for value in vars(owner).values():
        if isinstance(value, MetricWrapperBase):
            yield value._name, value._type, value._documentation, tuple(value._labelnames)
        elif hasattr(value, "__dict__") and not isinstance(value, type) and type(value).__module__.startswith("proxy."):
            yield from _metrics(value)


def metrics_page() -> str:
    from proxy.gateway.metrics import GatewayMetrics
    from proxy.util.metrics import Metrics

    out = ["# Metrics", "", "What `/metrics` exports, read from the registries themselves. Labels are bounded: "
           "never a project, a file name, a URL or a credential.", ""]
    for title, owner in (("`tufproxy serve` (edges)", Metrics()), ("`tufproxy gateway serve`", GatewayMetrics())):
        out += [f"## {title}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for name, kind, doc, labels in sorted(set(_metrics(owner))):
            suffix = "_total" if kind == "counter" and not name.endswith("_total") else ""
            out.append(f"| `{name}{suffix}` | {kind} | {', '.join(f'`{x}`' for x in labels) or '-'} | {doc} |")
        out.append("")
    return "\n".join(out)


def error_classes() -> Iterator[type[BaseException]]:
    """Every exception class defined in a module of ``proxy`` (each must declare a fault and a reason)."""
    import importlib

    for info in pkgutil.walk_packages(proxy.__path__, "proxy."):
        if info.name == "proxy.__main__":
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                yield cls


def refusals_page() -> str:
    out = ["# Refusal reasons", "",
           "Every error the proxy and the gateway can give, whose fault it is, and what the client sees "
           "(`X-Tufproxy-Reason` carries the reason; audit records carry reason and fault; "
           "`tufproxy_refusals_total{kind}` is the fault). Generated from `proxy/protocol/refusals.py`.", "",
           "| reason | fault | HTTP status | audited | raised as |", "|---|---|---|---|---|"]
    rows = set()
    for cls in error_classes():
        r = refusals.row(cls.__new__(cls))
        rows.add((cls.reason, r.kind, r.status, "yes" if r.audit else "no", f"`{cls.__module__}.{cls.__qualname__}`"))
    out += [f"| `{a}` | {b} | {c} | {d} | {e} |" for a, b, c, d, e in sorted(rows)]
    out += ["", "Reasons given per instance (a gateway's page refusal names its own, such as `foreign-origin`, "
            "`bad-page`, `oversized-page`) take their fault's row.", "",
            "| fault | HTTP status | audited | meaning |", "|---|---|---|---|"]
    out += [f"| {f.value} | {r.status} | {'yes' if r.audit else 'no'} | {r.prefix} |"
            for f, r in refusals.BY_FAULT.items()]
    return "\n".join(out) + "\n"


PAGES = {"reference/cli.md": cli_page, "reference/metrics.md": metrics_page, "reference/refusals.md": refusals_page}

if __name__ == "<run_path>":  # run by mkdocs-gen-files during the build; the tests import the functions
    import mkdocs_gen_files

    for page, make in PAGES.items():
        with mkdocs_gen_files.open(page, "w") as f:
            f.write(make())
