"""Build vispos objects from YAML files or dicts whose keys are the constructors' keyword names.

A config is a mapping with a ``type`` (a registered name) and the constructor's keyword
arguments; a value that is itself a mapping with a ``type`` (or a list of them) is built first::

    type: Joiner
    backbone: {type: TimmBackbone, model_name: resnet50, out_indices: [4]}
    position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 128, normalize: true}
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import yaml

__all__ = ["build_from_config", "register", "registered", "load_config"]

_REGISTRY: dict[str, Callable[..., Any]] = {}
_BUILTINS_DONE = False


def register(obj: Callable[..., Any] | None = None, *, name: str | None = None):
    """Registers a class (or factory) under ``name`` (default: its ``__name__``).

    Usable as ``register(MyModule)`` or as a decorator ``@register(name="Mine")``.

    Raises:
        ValueError: the name is already registered to another object.
    """

    def _add(target: Callable[..., Any]) -> Callable[..., Any]:
        key = name or target.__name__
        if key in _REGISTRY and _REGISTRY[key] is not target:
            raise ValueError(f"config type {key!r} is already registered to {_REGISTRY[key]!r}")
        _REGISTRY[key] = target
        return target

    return _add if obj is None else _add(obj)


def registered() -> list[str]:
    """The registered config type names, sorted."""
    _register_builtins()
    return sorted(_REGISTRY)


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a YAML config file into a dict.

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory.
        ValueError: the file is not UTF-8 text or not valid YAML, or its top level is not a
            mapping.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise FileNotFoundError(f"config file {path!r} is a directory, expected a YAML file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} does not exist")
    with open(path, encoding="utf-8") as fh:
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            first = " ".join(str(exc).split())
            raise ValueError(f"config file {path!r} is not valid YAML: {first}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"config file {path!r} is not UTF-8 text (YAML expected): {exc}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"config file {path!r} must hold a mapping with a 'type' key, got {type(data).__name__}")
    return dict(data)


def _register_builtins() -> None:
    global _BUILTINS_DONE
    if _BUILTINS_DONE:
        return
    from . import encodings
    from .backbones import DetrEncoder, Joiner, TimmBackbone, TorchvisionBackbone, VolumeBackbone

    for cls in (TimmBackbone, TorchvisionBackbone, VolumeBackbone, Joiner, DetrEncoder):
        register(cls)
    for name in encodings.__all__:
        obj = getattr(encodings, name)
        if isinstance(obj, type):
            register(obj)
    _BUILTINS_DONE = True


def _build(node: Any, where: str) -> Any:
    if isinstance(node, Mapping) and "type" in node:
        return _build_mapping(node, where)
    if isinstance(node, list):
        return [_build(v, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def _build_mapping(cfg: Mapping[str, Any], where: str) -> Any:
    kind = cfg["type"]
    allowed_types = [k for k in sorted(_REGISTRY) if not k.startswith("_")]
    if not isinstance(kind, str) or kind not in allowed_types:
        raise ValueError(f"{where}: unknown type {kind!r}; registered types are {allowed_types}")
    target = _REGISTRY[kind]
    params = inspect.signature(target).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    unknown = sorted(k for k in kwargs if k not in names)
    if unknown and not accepts_any:
        raise ValueError(f"{where} ({kind}): unknown keys {unknown}; allowed keys are {names}")
    required = [
        n for n in names
        if params[n].default is inspect.Parameter.empty and n not in kwargs
    ]
    if required:
        raise ValueError(f"{where} ({kind}): missing required keys {required}; allowed keys are {names}")
    built = {k: _build(v, f"{where}.{k}") for k, v in kwargs.items()}
    for k, v in built.items():
        if "dtype" in k and isinstance(v, str):
            built[k] = _dtype(v, f"{where}.{k}")
    return target(**built)


def _dtype(name: str, where: str):
    import torch

    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{where}: {name!r} is not a torch dtype (e.g. 'float16', 'bfloat16', 'float32')")
    return value


def build_from_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> Any:
    """Builds the object a config describes (recursively).

    Args:
        path_or_dict (str | PathLike | Mapping): a YAML file path, or an already-loaded mapping
            with a ``type`` key. The mapping is not modified.

    Returns:
        The constructed object (e.g. a :class:`~vispos.backbones.Joiner`).

    Raises:
        FileNotFoundError: the file does not exist.
        TypeError: ``path_or_dict`` is neither a path nor a mapping.
        ValueError: invalid YAML; no ``type``; an unknown type (the message lists the registered
            ones); an unknown or missing key (the message lists the allowed ones).
    """
    _register_builtins()
    if isinstance(path_or_dict, (str, os.PathLike)):
        cfg: Mapping[str, Any] = load_config(path_or_dict)
        where = os.fspath(path_or_dict)
    elif isinstance(path_or_dict, Mapping):
        cfg, where = path_or_dict, "config"
    else:
        raise TypeError(f"path_or_dict must be a path or a mapping, got {type(path_or_dict).__name__}")
    if "type" not in cfg:
        raise ValueError(f"{where}: a config needs a 'type' key; registered types are {registered()}")
    return _build_mapping(cfg, where)
