"""Deprecated alias of :mod:`vispos.app.cli` (the ``vispos`` command), kept so ``vispos.cli:main``
and ``python -m vispos.cli`` work for one more release; importing it warns.

The command moved to the app side; run ``vispos`` (or ``python -m vispos.app.cli``)
and import from :mod:`vispos.app.cli`.
"""

import sys

from ._deprecation import warn_module

warn_module("vispos.cli", "vispos.app.cli (the `vispos` command; python -m vispos.app.cli)")

from .app.cli import DEFAULT_CONFIG, DEFAULT_VOLUME_CONFIG, main  # noqa: E402 - after the warning

__all__ = ["main", "DEFAULT_CONFIG", "DEFAULT_VOLUME_CONFIG"]

if __name__ == "__main__":  # pragma: no cover - python -m vispos.cli
    sys.exit(main())
