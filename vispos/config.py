"""Build vispos objects from YAML files or dicts whose keys are the constructors' keyword names.

A config is a mapping with a ``type`` (a registered name) and the constructor's keyword
arguments; a value that is itself a mapping with a ``type`` (or a list of them) is built first::

    type: Joiner
    backbone: {type: TimmBackbone, model_name: resnet50, out_indices: [4]}
    position_embedding: {type: PositionEmbeddingSine, num_pos_feats: 128, normalize: true}

A config file is named by its path, or, from any working directory, by the name of a config
that ships inside the package (``vispos/configs/``): ``"detr_resnet50"``,
``"detr_resnet50.yaml"`` or ``"configs/detr_resnet50.yaml"`` (:func:`resolve_config`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import reprlib
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import yaml

from ._suggest import close_names, did_you_mean

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["build_from_config", "register", "registered", "load_config", "resolve_config", "packaged_configs"]

_REGISTRY: dict[str, Callable[..., Any]] = {}
_BUILTINS_DONE = False

#: the largest config file :func:`load_config` reads (bytes); real configs are a few hundred
MAX_CONFIG_BYTES = 1 << 20
#: the most nodes a config may hold with every YAML alias expanded (a "billion laughs" file
#: of a few hundred bytes expands to millions), and how deeply it may nest
MAX_CONFIG_NODES = 10_000
MAX_CONFIG_DEPTH = 50
#: the longest error message a constructor's error may add (its values can be long)
_MAX_MESSAGE = 500

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def _short(value: Any) -> str:
    """A bounded ``repr`` for messages: long strings and containers are cut with ``...``, and
    the cost does not grow with the value (reprlib stops early)."""
    return _REPR.repr(value)


def _clip(text: str, limit: int = _MAX_MESSAGE) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def register(obj: Callable[..., Any] | None = None, *, name: str | None = None):
    """Registers a class (or factory) under ``name`` (default: its ``__name__``).

    Usable as ``register(MyModule)`` or as a decorator ``@register(name="Mine")``.

    Raises:
        ValueError: the name is already registered to another object (the built-in types
            included, whether or not their modules are imported yet).
    """

    def _add(target: Callable[..., Any]) -> Callable[..., Any]:
        _register_builtins()
        key = name or target.__name__
        if key in _LAZY_BUILTINS:
            _lookup(key)
        _enter(key, target)
        return target

    return _add if obj is None else _add(obj)


def _enter(key: str, target: Callable[..., Any]) -> None:
    if key in _REGISTRY and _REGISTRY[key] is not target:
        raise ValueError(f"config type {key!r} is already registered to {_REGISTRY[key]!r}")
    _REGISTRY[key] = target


def registered() -> list[str]:
    """The registered config type names, sorted (the backbones' modules are not imported to
    list them)."""
    _register_builtins()
    return sorted(set(_REGISTRY) | set(_LAZY_BUILTINS))


#: the folder inside the package that holds the shipped configs (the repository's top-level
#: ``configs/`` is a link to it)
_PACKAGED = "configs"
_SUFFIXES = (".yaml", ".yml")


def packaged_configs() -> dict[str, Traversable]:
    """The configs that ship inside the package (``vispos/configs/*.yaml``), by short name.

    Returns:
        dict[str, Traversable]: short name (the file name without ``.yaml``, e.g.
        ``"detr_resnet50"``) -> the packaged file, sorted by name. Each value is a
        :class:`pathlib.Path` when vispos is installed as files (always, for pip installs).
    """
    folder = resources.files(__package__).joinpath(_PACKAGED)
    found = {}
    for entry in folder.iterdir():
        stem, suffix = os.path.splitext(entry.name)
        if suffix in _SUFFIXES and entry.is_file():
            found[stem] = entry
    return dict(sorted(found.items()))


def resolve_config(name: str | os.PathLike) -> Traversable:
    """The config file ``name`` means, from any working directory.

    In this order: an existing file at ``name`` (absolute, or relative to the working
    directory); else a packaged config (:func:`packaged_configs`) named by its short name
    (``"detr_resnet50"``), its file name (``"detr_resnet50.yaml"``) or its path in the
    repository (``"configs/detr_resnet50.yaml"``: the checkout's ``configs/`` is the packaged
    folder, so the same name works inside and outside the checkout). A file of yours always
    wins over a packaged config of the same name.

    Args:
        name (str | PathLike): a path or a packaged config's name.

    Returns:
        Traversable: the file (a :class:`pathlib.Path` for a file on disk and for a packaged
        config installed as files).

    Raises:
        TypeError: ``name`` is not a str or PathLike of str.
        IsADirectoryError: ``name`` is a directory.
        ValueError: ``name`` exists but is not a regular file (``/dev/zero``, a FIFO, a socket).
        FileNotFoundError: no such file and no such packaged config; the message names the
            nearest packaged ones ("did you mean", :mod:`vispos._suggest`) and lists them all
            (``vispos config list`` prints them with what each builds).
    """
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"a config must be named by a str or PathLike, got {type(name).__name__}")
    path = os.fspath(name)
    if not isinstance(path, str):
        raise TypeError(f"a config must be named by a str path, got {type(path).__name__} {_short(path)}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"config file {path!r} is a directory, not a YAML file")
    if os.path.isfile(path):
        return Path(path)
    if os.path.exists(path):  # a device, FIFO or socket: there, but not a file to read a config from
        raise ValueError(
            f"config file {path!r} exists but is not a regular file (a device, pipe or socket); "
            "a config must be a YAML file"
        )
    shipped = packaged_configs()
    parts = PurePath(path).parts
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == _PACKAGED):
        stem, suffix = os.path.splitext(parts[-1])
        if suffix in ("", *_SUFFIXES) and stem in shipped:
            return shipped[stem]
    near = did_you_mean(os.path.splitext(parts[-1])[0], shipped) if parts else ""
    raise FileNotFoundError(
        f"config file {path!r} does not exist (relative to {os.getcwd()!r}) and is not a config "
        f"vispos ships{f' ({near})' if near else ''}; it ships {', '.join(shipped)} (by short name, file name or "
        "configs/NAME.yaml; `vispos config list` says what each builds)"
    )


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a YAML config file into a dict.

    ``path`` is a file, or the name of a config that ships with vispos (``"detr_resnet50"``,
    ``"detr_resnet50.yaml"``, ``"configs/detr_resnet50.yaml"``), resolved from any working
    directory by :func:`resolve_config`.

    YAML anchors and aliases (and ``<<`` merge keys) are allowed, but the config they expand
    to is measured without expanding it: more than :data:`MAX_CONFIG_NODES` values, deeper than
    :data:`MAX_CONFIG_DEPTH` levels, or a config containing itself is refused at once.

    Args:
        path (str | PathLike): a YAML file of at most :data:`MAX_CONFIG_BYTES` bytes, or a
            packaged config's name.

    Returns:
        dict: the top-level mapping.

    Raises:
        TypeError: ``path`` is not a str or PathLike.
        FileNotFoundError: ``path`` is neither a file nor a packaged config (the message names
            the nearest packaged ones and lists them all).
        IsADirectoryError: ``path`` is a directory.
        ValueError: the file is larger than :data:`MAX_CONFIG_BYTES`, not UTF-8 text or not
            valid YAML; its top level is not a mapping; it expands too far (see above).

    References:
        YAML 1.1 (anchors, aliases, merge keys); PyYAML ``safe_load``; the "billion laughs"
        entity-expansion attack (CVE-2003-1564).
    """
    found = resolve_config(path)
    path = os.fspath(path)
    with resources.as_file(found) as file:
        size = os.path.getsize(file)
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"config file {path!r} has {size} bytes, more than the {MAX_CONFIG_BYTES} a config may have")
        with open(file, encoding="utf-8") as fh:
            try:
                data = yaml.safe_load(fh)
            except yaml.YAMLError as exc:
                first = _clip(" ".join(str(exc).split()))
                raise ValueError(f"config file {path!r} is not valid YAML: {first}") from None
            except UnicodeDecodeError as exc:
                raise ValueError(f"config file {path!r} is not UTF-8 text (YAML expected): {exc}") from None
            except RecursionError:
                raise ValueError(
                    f"config file {path!r} nests too deeply for the YAML parser (at most {MAX_CONFIG_DEPTH} levels)"
                ) from None
    if not isinstance(data, Mapping):
        raise ValueError(f"config file {path!r} must hold a mapping with a 'type' key, got {type(data).__name__}")
    _check_size(data, path)
    return dict(data)


def _check_size(data: Any, where: str) -> None:
    """Refuses a config that expands (YAML aliases, shared Python objects) to more than
    :data:`MAX_CONFIG_NODES` nodes, nests deeper than :data:`MAX_CONFIG_DEPTH`, or contains
    itself. Each distinct container is measured once, so the check costs the size of the file,
    not of its expansion."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Any, depth: int) -> int:
        if not isinstance(node, (Mapping, list, tuple)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise ValueError(f"{where}: the config contains itself (a YAML alias to one of its own ancestors)")
        if depth > MAX_CONFIG_DEPTH:
            raise ValueError(f"{where}: the config nests deeper than {MAX_CONFIG_DEPTH} levels")
        open_.add(key)
        children = [x for kv in node.items() for x in kv] if isinstance(node, Mapping) else node
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > MAX_CONFIG_NODES:
                raise ValueError(
                    f"{where}: the config expands to more than {MAX_CONFIG_NODES} values (YAML "
                    "aliases repeat what they refer to: a 'billion laughs' file?); refused"
                )
        open_.discard(key)
        sizes[key] = total
        return total

    size(data, 0)


#: built-in types whose modules import timm and torchvision: imported when a config names one
#: (so a config of an encoder, or ``vispos plot``, never loads a backbone library)
_LAZY_BUILTINS = {
    "TimmBackbone": "vispos.backbones",
    "TorchvisionBackbone": "vispos.backbones",
    "VolumeBackbone": "vispos.backbones",
    "Joiner": "vispos.backbones",
    "DetrEncoder": "vispos.transformer",
}


def _register_builtins() -> None:
    global _BUILTINS_DONE
    if _BUILTINS_DONE:
        return
    from . import encodings

    for name in encodings.__all__:
        obj = getattr(encodings, name)
        if isinstance(obj, type):
            _enter(obj.__name__, obj)
    _BUILTINS_DONE = True


def _lookup(kind: str) -> Callable[..., Any]:
    """The registered object of ``kind``, importing its module first for a lazy built-in."""
    if kind not in _REGISTRY and kind in _LAZY_BUILTINS:
        module = importlib.import_module(_LAZY_BUILTINS[kind])
        _REGISTRY.setdefault(kind, getattr(module, kind))
    return _REGISTRY[kind]


def _build(node: Any, where: str) -> Any:
    if isinstance(node, Mapping) and "type" in node:
        return _build_mapping(node, where)
    if isinstance(node, list):
        return [_build(v, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def _build_mapping(cfg: Mapping[str, Any], where: str) -> Any:
    kind = cfg["type"]
    allowed_types = [k for k in registered() if not k.startswith("_")]
    if not isinstance(kind, str) or kind not in allowed_types:
        near = did_you_mean(kind, allowed_types) if isinstance(kind, str) else ""
        raise ValueError(f"{where}: unknown type {_short(kind)}; registered types are {allowed_types}"
                         + (f"; {near}" if near else ""))
    bad_keys = [k for k in cfg if not isinstance(k, str)]
    if bad_keys:
        hint = (" (YAML reads unquoted yes/no/on/off/true/false as booleans and ~/null as None: "
                "quote such keys)" if any(k is None or isinstance(k, bool) for k in bad_keys) else "")
        raise TypeError(
            f"{where} ({kind}): keys must be strings (the constructor's keyword names), got "
            f"{', '.join(_short(k) for k in bad_keys[:10])}{hint}"
        )
    target = _lookup(kind)
    params = inspect.signature(target).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    renamed = getattr(target.__init__ if isinstance(target, type) else target, "__deprecated_kwargs__", {})
    kwargs = {k: v for k, v in cfg.items() if k != "type"}
    unknown = sorted(k for k in kwargs if k not in names and k not in renamed)  # old keys warn on build
    if unknown and not accepts_any:
        pairs = [(k, close_names(k, names, n=1)) for k in unknown]
        pairs = [f"{close[0]!r} for {k!r}" for k, close in pairs if close]
        near = f"; did you mean {', '.join(pairs)}?" if pairs else ""
        raise ValueError(f"{where} ({kind}): unknown keys {unknown}; allowed keys are {names}{near}")
    required = [
        n for n in names
        if params[n].default is inspect.Parameter.empty and n not in kwargs
        and not any(renamed.get(old) == n for old in kwargs)
    ]
    if required:
        raise ValueError(f"{where} ({kind}): missing required keys {required}; allowed keys are {names}")
    built = {k: _build(v, f"{where}.{k}") for k, v in kwargs.items()}
    for k, v in built.items():
        if "dtype" in k and isinstance(v, str):
            built[k] = _dtype(v, f"{where}.{k}")
    try:
        return target(**built)
    except TypeError as exc:
        raise TypeError(_located(exc, where, kind)) from exc
    except ValueError as exc:
        raise ValueError(_located(exc, where, kind)) from exc


def _located(exc: Exception, where: str, kind: str) -> str:
    """A constructor's error message, prefixed with where in the config it comes from and cut
    to a readable length (a constructor may print a long value in full). The error is re-raised
    as its category (``TypeError`` or ``ValueError``, subclasses included), the original chained."""
    return f"{where} ({kind}): {_clip(str(exc))}"


def _dtype(name: str, where: str):
    import torch

    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{where}: {_short(name)} is not a torch dtype (e.g. 'float16', 'bfloat16', 'float32')")
    return value


def build_from_config(path_or_dict: str | os.PathLike | Mapping[str, Any]) -> Any:
    """Builds the object a config describes (recursively).

    Args:
        path_or_dict (str | PathLike | Mapping): a YAML file path, the name of a config that
            ships with vispos (``"detr_resnet50"``, ``"detr_resnet50.yaml"`` or
            ``"configs/detr_resnet50.yaml"``, from any working directory: :func:`resolve_config`),
            or an already-loaded mapping with a ``type`` key. The mapping is not modified.

    Returns:
        The constructed object (e.g. a :class:`~vispos.backbones.Joiner`).

    Raises:
        FileNotFoundError: neither a file nor a packaged config (the message names the nearest
            and lists those that ship).
        IsADirectoryError: the path is a directory.
        TypeError: ``path_or_dict`` is neither a path nor a mapping.
        TypeError: a key that is not a string (the message names them).
        ValueError: invalid YAML; no ``type``; an unknown type (the message lists the registered
            ones, then the nearest); an unknown or missing key (the message lists the allowed ones,
            then the nearest to each unknown one); a config that
            expands (aliases included) to more than :data:`MAX_CONFIG_NODES` values, nests deeper
            than :data:`MAX_CONFIG_DEPTH` or contains itself. Values are cut short in messages.
    """
    _register_builtins()
    if isinstance(path_or_dict, (str, os.PathLike)):
        cfg: Mapping[str, Any] = load_config(path_or_dict)
        where = os.fspath(path_or_dict)
    elif isinstance(path_or_dict, Mapping):
        cfg, where = path_or_dict, "config"
    else:
        raise TypeError(f"path_or_dict must be a path or a mapping, got {type(path_or_dict).__name__}")
    _check_size(cfg, where)
    if "type" not in cfg:
        raise ValueError(f"{where}: a config needs a 'type' key; registered types are {registered()}")
    return _build_mapping(cfg, where)
