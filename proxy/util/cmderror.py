"""The one error type of the command line, and the exit status it gives.

Every subcommand raises :class:`CommandError` for a failure the user can
act on; ``proxy.cli.main`` prints it as one line on stderr.  A module of its
own, with no imports, so any layer may raise it without importing the CLI.
"""

# Exit statuses, as grep has them: 1 is a negative answer (refusals, an unsound
# tree), 2 an error that stopped the command (always one line on stderr).
EXIT_REFUSED = 1
EXIT_ERROR = 2


class CommandError(Exception):
    """A user-facing failure: printed as one line on stderr, exit status ``exit_status``.

    :data:`EXIT_ERROR` unless the command's contract says otherwise (``tufproxy
    client`` answers a refused update with :data:`EXIT_REFUSED`, as TUF's
    conformance CLI requires).
    """

    def __init__(self, message: str, exit_status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_status = exit_status
