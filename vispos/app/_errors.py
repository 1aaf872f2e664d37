"""The command line's user-facing errors: :class:`CLIError` and the parser that reports a usage
error in one line (:class:`OneLineParser`).

Its own module so that :mod:`vispos.app.cli` and the subcommands it dispatches to (their argument
modules and their work modules) share it without importing each other. torch-free.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["CLIError", "OneLineParser"]


class CLIError(Exception):
    """A user-facing error of the ``vispos`` command: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors are one line on stderr,
    ``PROG: error: MESSAGE``, with exit status 2 (argparse's), and no usage block before it:
    argparse's messages name the flag already, and ``PROG --help`` shows the usage. The
    subcommands' parsers are of this class too (``add_subparsers`` makes them of the parent's).
    """

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        if text.startswith("unrecognized arguments") or "required" in text:
            text += f"; see `{self.prog} --help`"
        self.exit(2, f"{self.prog}: error: {text}\n")
