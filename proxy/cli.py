"""The ``tufproxy`` command line: one parser, one subcommand per job.

Each subcommand lives beside the code it drives and registers itself
through a ``register(subparsers)`` function; this module only assembles
them and turns our own errors into one clear line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from proxy import __version__

# module path of each subcommand's ``register``; order is --help order.
_SUBCOMMANDS = (
    "proxy.serve",
    "proxy.repository.cli",
    "proxy.audit",
    "proxy.trust.cli",
    "proxy.mirror.cli",
    "proxy.gateway.cli",
    "proxy.cache_cli",
)


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    """The full ``tufproxy`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="tufproxy",
        description=(
            "A verifying, caching proxy and mirror for Python package indexes. "
            "Every index page and distribution file is checked against signed "
            "TUF (PEP 458) metadata before it is cached or served."
        ),
    )
    parser.add_argument("--version", action="version", version=f"tufproxy {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _SUBCOMMANDS:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tufproxy`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except CommandError as e:
        print(f"tufproxy {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
