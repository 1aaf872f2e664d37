"""The command line's user-facing error type.

Its own module so that :mod:`vispos.app.cli` and the subcommands it dispatches to (their argument
modules and their work modules) share it without importing each other.
"""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(Exception):
    """A user-facing error of the ``vispos`` command: printed as one line, exit status 2."""
