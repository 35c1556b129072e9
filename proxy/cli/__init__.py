"""Rank 8: the ``tufproxy`` command line: one parser, one subcommand per job.

Each subcommand has a module in this package (``audit`` aside, beside its log) and registers itself
through a ``register(subparsers)`` function; this module only assembles
them and turns every error into one line on stderr, ``<command>: error:
<what>``, with exit status 2 (argparse's usage errors included), and sets up
the one log format every command shares (:mod:`proxy.util.logs`).

Only the module of the command being run is imported (``tufproxy client``
runs in loops: a conformance suite calls it a thousand times); the others
are known by :data:`COMMANDS`, whose one-line help ``tufproxy --help`` lists.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from proxy import __version__
from proxy.protocol.errors import EXIT_ERROR, CommandError
from proxy.util import logs, malloc

__all__ = ["COMMANDS", "build_parser", "main"]

# Each command: the module whose ``register`` defines it, and its line in ``tufproxy --help``; in --help order.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("proxy.cli.serve", "run the verifying proxy in front of untrusted mirrors (or a local signed tree)"),
    "demo": ("proxy.cli.serve", "one command, no services: a signed repository, a mirror of it and the proxy, "
                                "on 127.0.0.1"),
    "repo": ("proxy.cli.repo", "create and maintain a PEP 458 signed repository (be your own root of trust)"),
    "audit": ("proxy.storage.audit", "summarise an audit log: refusals by reason, target and client"),
    "client": ("proxy.cli.client", "a command-line TUF client (init, refresh, download) over the proxy's trust core"),
    "mirror": ("proxy.cli.mirror", "verified mirrors for air-gapped sites: sync a selection, verify a carried tree"),
    "gateway": ("proxy.cli.gateway", "publish a plain index's packages as a PEP 458 repository signed with your "
                                     "own keys"),
    "cache": ("proxy.cli.cache", "inspect a proxy's cache directory"),
    "why": ("proxy.cli.why", "ask a gateway why a version or file is not offered (cooldown, denied, private, ...)"),
    "doctor": ("proxy.cli.doctor", "check a running gateway and edge end to end, one line per check with the fix"),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is one line (and where help is), exit 2, and a flag
    is never abbreviated (``--index-ur`` is a typo, not ``--index-url``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but what nobody recognised is reported by the (sub)command it was given to,
        with the nearest flag it has."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _find(self, getattr(parsed, "prog", self.prog))
            command.error(_unrecognised(command, extras))
        return parsed


def _find(parser: argparse.ArgumentParser, prog: str) -> argparse.ArgumentParser:
    """The (sub)command parser called ``prog`` under ``parser`` (``parser`` itself if none is)."""
    if parser.prog == prog:
        return parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found = _find(child, prog)
                if found is not parser and found.prog == prog:
                    return found
    return parser


def _unrecognised(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: --files-orgin (did you mean --files-origin?)``."""
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    hints = []
    for word in extras:
        near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1) if word.startswith("--") else []
        hints.append(f"{word} (did you mean {near[0]}?)" if near else word)
    return f"unrecognized arguments: {' '.join(hints)}"


class _Commands(argparse._SubParsersAction):
    """The top-level subcommands: each one's help comes from :data:`COMMANDS`."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("help", COMMANDS[name][1])
        return super().add_parser(name, **kwargs)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``tufproxy`` argument parser: whole, or with only ``command``'s module imported.

    The other commands are placeholders that name and explain themselves in
    ``--help`` but parse nothing.
    """
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, action=_Commands)
    wanted = None if command is None else COMMANDS[command][0] if command in COMMANDS else ""
    registered: set[str] = set()
    for name, (module, _) in COMMANDS.items():
        if wanted is not None and module != wanted:
            sub.add_parser(name)
        elif module not in registered:  # a module registers all of its commands at once, in order
            importlib.import_module(module).register(sub)
            registered.add(module)
    _name_commands(parser)
    return parser


def _command(argv: Sequence[str]) -> str:
    """The command named in ``argv`` (the first word that is not an option: the top level takes no values)."""
    return next((a for a in argv if not a.startswith("-")), "")


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
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    logs.configure(("warning", "info", "debug")[min(args.verbose, 2)])
    malloc.tune()
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
