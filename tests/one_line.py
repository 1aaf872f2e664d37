"""Helper of the command-line tests: a command refused with exit status 2 and one line on
stderr that matches a pattern."""

import re

import pytest


def assert_refused_in_one_line(main, argv, capsys, message: str) -> str:
    """Run ``main(argv)``; it must exit with status 2 and write exactly one stderr line matching
    the regular expression ``message``. Returns that line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), lines
    return lines[0]
