"""The model names timm and torchvision offer, read from their source files without importing
them (so without torch), and the refusal of a backbone name that is neither, with suggestions.

``vispos train --backbone`` and a config's backbone are checked here before torch is imported:
a mistyped name is answered in well under a second (timm alone takes seconds to import) with the
nearest names (:mod:`vispos._suggest`). Each model is a function decorated with timm's
``@register_model`` (or torchvision's ``@register_model()``), which is what the two libraries'
``list_models()`` return; a test holds the two lists equal. Should a library's source stop
matching (no name found at all), the library itself is imported and asked.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re

from .._suggest import did_you_mean

__all__ = ["model_names", "backbone_problem"]

#: a registered model function: the decorator on its own line, other decorators (torchvision's
#: ``@handle_legacy_interface(...)``, over several lines) between it and the ``def``
_REGISTERED = {
    "timm": re.compile(r"^@register_model[ \t]*\n(?:[ \t]*[@\w\"'(),=.:\[\] ].*\n)*?def[ \t]+(\w+)[ \t]*\(", re.M),
    "torchvision": re.compile(r"^@register_model\(\)[ \t]*\n(?:[ \t]*[@\w\"'(),=.:\[\] ].*\n)*?def[ \t]+(\w+)[ \t]*\(",
                              re.M),
}


@functools.lru_cache(maxsize=None)
def model_names(package: str) -> frozenset[str]:
    """The model names ``package`` registers: timm's every model (``timm.list_models()``), or
    torchvision's classification models (``torchvision.models.list_models(module=torchvision.models)``).

    Args:
        package (str): ``"timm"`` or ``"torchvision"``.

    Returns:
        frozenset of str: empty when the package is not installed.

    Raises:
        ValueError: ``package`` is neither.
    """
    if package not in _REGISTERED:
        raise ValueError(f"package must be 'timm' or 'torchvision', got {package!r}")
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return frozenset()
    folder = os.path.join(os.path.dirname(spec.origin), "models")
    names: set[str] = set()
    try:
        files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
    except OSError:
        files = []
    for name in files:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                names.update(_REGISTERED[package].findall(f.read()))
        except (OSError, UnicodeDecodeError):
            continue
    if names:
        return frozenset(names)
    module = importlib.import_module(package)  # the source changed shape: ask the library
    if package == "timm":
        return frozenset(module.list_models())
    return frozenset(module.models.list_models(module=module.models))


def backbone_problem(name: str, package: str, also: tuple[str, ...] = ()) -> str | None:
    """Why ``name`` is not a model of ``package`` (``"timm"`` or ``"torchvision"``), with the
    nearest names, or None when it is one (a timm name may carry a pretrained tag, ``.a1_in1k``)
    or when the package is not installed (its own import error says so later).

    Args:
        name (str): the name given.
        package (str): the library whose model it must be.
        also (tuple of str): other names the caller accepts (``"vit"``), suggested too.
    """
    names = model_names(package)
    base = name.split(".")[0] if package == "timm" else name
    if not names or base in names or name in also:
        return None
    other = "torchvision" if package == "timm" else "timm"
    where = f"; it is a {other} model" if base in model_names(other) else ""
    hint = did_you_mean(base, [*also, *sorted(names)])
    return f"{name!r} is not a {package} model name{where}" + (f"; {hint}" if hint else "")
