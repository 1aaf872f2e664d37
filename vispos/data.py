"""Deprecated alias of :mod:`vispos.app.data` (image and volume loaders), kept so
``vispos.data`` imports work for one more release; importing it warns.

The loaders moved to the app side; import from :mod:`vispos.app.data`.
"""

from ._deprecation import warn_module

warn_module("vispos.data", "vispos.app.data")

from .app.data import *  # noqa: E402,F401,F403 - the alias re-exports the module's public API
from .app.data import __all__  # noqa: E402,F401
