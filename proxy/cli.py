"""The ``tufproxy`` command line: one parser, one subcommand per job.

Each subcommand lives beside the code it drives and registers itself
through a ``register(subparsers)`` function; this module only assembles
them and turns every error into one line on stderr, ``<command>: error:
<what>``, with exit status 2 (argparse's usage errors included), and sets up
the one log format every command shares (:mod:`proxy.logs`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from proxy import __version__, logs
from proxy.cmderror import EXIT_ERROR, CommandError

# module path of each subcommand's ``register``; order is --help order.
_SUBCOMMANDS = (
    "proxy.serve_cli",
    "proxy.repository.cli",
    "proxy.audit",
    "proxy.trust.cli",
    "proxy.mirror.cli",
    "proxy.gateway.cli",
    "proxy.cache_cli",
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is one line (and where help is), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full ``tufproxy`` argument parser."""
    parser = _Parser(
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
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser) -> None:
    """Let every (sub)command know its full name (``tufproxy mirror sync``) for its error lines."""
    parser.set_defaults(prog=parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _name_commands(child)


def _os_error(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tufproxy`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(("warning", "info", "debug")[min(args.verbose, 2)])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CommandError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return e.exit_status
    except OSError as e:  # a file or socket the command needed, named by the OS
        message = _os_error(e)
    except Exception as e:  # a bug: still one line; -vv logs the traceback
        logging.getLogger(__name__).debug("internal error", exc_info=True)
        message = f"internal error: {type(e).__name__}: {e}"
    print(f"{args.prog}: error: {message}", file=sys.stderr)
    return EXIT_ERROR
