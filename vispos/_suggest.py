"""Suggestions for a mistyped name: the nearest known names, best first ("did you mean").

torch-free (the config reader and the ``vispos`` command's parsers use it before torch is
imported). Ranking is :class:`difflib.SequenceMatcher`'s ratio on lower-cased names (Python's own
``NameError`` suggestions and argparse's ``suggest_on_error`` work alike), so ``"resnet5O"`` and
``"resnet18x"`` give ``resnet50`` and ``resnet18`` first, never a name that merely shares a prefix.
"""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Iterable

__all__ = ["close_names", "did_you_mean", "public_homes"]

#: how similar (difflib's ratio, 0..1) a name must be to be suggested: 0.6 is difflib's own
#: default, and keeps one or two wrong characters in a name of five or more
CUTOFF = 0.6


def close_names(word: str, names: Iterable[str], n: int = 5, cutoff: float = CUTOFF) -> list[str]:
    """Up to ``n`` of ``names`` nearest ``word``, best first (ties in the order of ``names``);
    compared without case. An empty list when none is at least ``cutoff`` similar."""
    if not isinstance(word, str) or not word:
        return []
    by_key: dict[str, str] = {}
    for name in names:
        by_key.setdefault(name.lower(), name)
    return [by_key[k] for k in difflib.get_close_matches(word.lower(), list(by_key), n=n, cutoff=cutoff)]


def did_you_mean(word: str, names: Iterable[str], n: int = 3) -> str:
    """``"did you mean 'x'?"`` (or ``'x', 'y' or 'z'``) for the nearest of ``names``, else
    ``""``: a clause for an error message."""
    close = close_names(word, names, n=n)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"did you mean {listed}?"


def _literal_all(path: str) -> list[str]:
    """The names of a module's ``__all__ = [...]`` written as a literal list or tuple of strings
    (read from the source, nothing imported); ``[]`` otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return []
            return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []
    return []


def public_homes(package: str, folder: str, name: str) -> list[str]:
    """The public modules directly under a package (``PACKAGE.X`` for ``X.py`` or ``X/``, ``X`` not
    private) whose literal ``__all__`` holds ``name``, read from their source without importing
    them: where to import a name the package itself does not export. Sorted by module name."""
    homes = []
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return []
    for entry in entries:
        stem, ext = os.path.splitext(entry)
        if stem.startswith("_"):
            continue
        path = os.path.join(folder, entry, "__init__.py") if not ext else os.path.join(folder, entry)
        if (ext == ".py" or (not ext and os.path.isfile(path))) and name in _literal_all(path):
            homes.append(f"{package}.{stem}")
    return homes
