"""The command line's user-facing errors: :class:`CLIError` and the parser that reports a usage
error in one line (:class:`OneLineParser`).

Its own module so that :mod:`vispos.app.cli` and the subcommands it dispatches to (their argument
modules and their work modules) share it without importing each other. torch-free.
"""

from __future__ import annotations

import argparse
import ast
import re
from typing import NoReturn

from .._suggest import did_you_mean

__all__ = ["CLIError", "OneLineParser"]


class CLIError(Exception):
    """A user-facing error of the ``vispos`` command: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors are one line on stderr,
    ``PROG: error: MESSAGE``, with exit status 2 (argparse's), and no usage block before it:
    argparse's messages name the flag already, and ``PROG --help`` shows the usage. A value
    outside a flag's choices gets the nearest choices too (``did you mean 'sine'?``, as
    :mod:`vispos._suggest` ranks them). The subcommands' parsers are of this class too
    (``add_subparsers`` makes them of the parent's).
    """

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        if text.startswith("unrecognized arguments") or "required" in text:
            text += f"; see `{self.prog} --help`"
        hint = _choice_hint(text)
        if hint:
            text += f"; {hint}"
        self.exit(2, f"{self.prog}: error: {text}\n")


#: argparse's message for a value outside ``choices``
_INVALID_CHOICE = re.compile(r"invalid choice: (?P<given>'[^']*'|\"[^\"]*\") \(choose from (?P<choices>.*)\)$")


def _choice_hint(text: str) -> str:
    """``"did you mean 'sine'?"`` for argparse's "invalid choice: 'sin' (choose from ...)", else ""."""
    found = _INVALID_CHOICE.search(text)
    if not found:
        return ""
    try:
        given = ast.literal_eval(found["given"])
        choices = [ast.literal_eval(c.strip()) for c in found["choices"].split(",")]
    except (ValueError, SyntaxError):
        return ""
    return did_you_mean(given, [str(c) for c in choices])
