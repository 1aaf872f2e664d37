"""Alias of :mod:`vispos.app.cli` (the ``vispos`` command), kept so ``vispos.cli:main`` and
``python -m vispos.cli`` work.

The command moved to the app side in issue 19; import from :mod:`vispos.app.cli` in new code.
"""

import sys

from .app.cli import DEFAULT_CONFIG, DEFAULT_VOLUME_CONFIG, main

__all__ = ["main", "DEFAULT_CONFIG", "DEFAULT_VOLUME_CONFIG"]

if __name__ == "__main__":  # pragma: no cover - python -m vispos.cli
    sys.exit(main())
