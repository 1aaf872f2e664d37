"""Alias of :mod:`vispos.app.data` (image and volume loaders), kept so ``vispos.data`` imports work.

The loaders moved to the app side in issue 19; import from :mod:`vispos.app.data` in new code.
"""

from .app.data import *  # noqa: F401,F403 - the alias re-exports the module's public API
from .app.data import __all__  # noqa: F401
