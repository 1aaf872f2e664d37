"""mkdocs hook: under ``--strict`` a public object of vispos without a docstring fails the build.

mkdocstrings renders an undocumented object silently; this hook warns for each one (and mkdocs'
strict mode turns warnings into a failed build). Public means listed in ``__all__`` of the
modules the API pages render.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import sys

log = logging.getLogger("mkdocs.hooks.vispos")

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):<code>~?([^<]*)</code>")

MODULES = (
    "vispos", "vispos.backbones", "vispos.transformer", "vispos.config", "vispos.encodings",
    "vispos.app.data", "vispos.app.figures", "vispos.app.png", "vispos.monai", "vispos.invariance",
)


def on_config(config, **kwargs):
    """Documents this checkout: its root goes first on ``sys.path`` (before any installed copy),
    since API pages import vispos (``force_inspection``) and so does :func:`on_pre_build`."""
    root = os.path.dirname(os.path.abspath(config.config_file_path))
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_pre_build(config, **kwargs) -> None:
    """Warns once for every module or public class / function of ``MODULES`` without a docstring."""
    missing = []
    for name in MODULES:
        module = importlib.import_module(name)
        if not (module.__doc__ or "").strip():
            missing.append(name)
        for attr in getattr(module, "__all__", []):
            obj = getattr(module, attr)
            if attr.startswith("__") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not (inspect.getdoc(obj) or "").strip():
                missing.append(f"{name}.{attr}")
    for qualname in sorted(set(missing)):
        log.warning("public object without a docstring: %s", qualname)


def on_page_content(html: str, **kwargs) -> str:
    """Docstrings use Sphinx roles (``:class:`~vispos.X```); show them as plain code, last name only
    when the reference starts with ``~`` (as Sphinx does)."""

    def plain(match: re.Match) -> str:
        full = match.group(0)
        target = match.group(1)
        name = target.rsplit(".", 1)[-1] if "<code>~" in full else target
        return f"<code>{name}</code>"

    return _ROLE.sub(plain, html)
