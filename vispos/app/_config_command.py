"""``vispos config list`` and ``vispos config show NAME``: the configs that ship with vispos.

Reads the packaged YAML files only (nothing is built, torch is not imported). ``list`` prints one
line per config: the short name (what :func:`vispos.build_from_config` and ``--config`` accept,
from any working directory), the objects the config builds (types, with the backbone's model
name), and the first clause of the file's leading comment (up to its first colon). ``show``
prints one config as :func:`vispos.config.load_config` reads it (anchors and aliases expanded),
after the file's leading comment: a starting point to copy and edit.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from ..config import load_config, packaged_configs, resolve_config

__all__ = ["add_config_parser", "config_lines", "config_text", "execute"]

#: keys whose string value names the model a backbone builds (TimmBackbone, torchvision's)
_MODEL_KEYS = ("model_name", "name_or_model")


def add_config_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``config`` subcommand (``vispos config list``) to the ``vispos`` parser's subparsers."""
    p = sub.add_parser(
        "config", help="the configs that ship with vispos (vispos config list, vispos config show NAME)",
        description="Configs that ship inside the package. --config and vispos.build_from_config "
        "accept a file path, or from any directory a shipped config's short name "
        "(detr_resnet50), file name (detr_resnet50.yaml) or configs/NAME.yaml.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="one line per shipped config: name, what it builds, what it is",
                       description="One line per shipped config: its short name, what it builds, "
                       "and the first clause of its comment.")
    show = actions.add_parser("show", help="print one config's YAML (anchors and aliases expanded)",
                              description="Print a config as vispos reads it (anchors and aliases "
                              "expanded), after its file's leading comment: vispos config show "
                              "detr_resnet18 > mine.yaml, edit, then --config mine.yaml.")
    show.add_argument("name", help="a shipped config's short name (vispos config list), or a YAML file")
    return p


def builds(cfg: Any) -> str:
    """What a config builds, in one line: ``Joiner: TimmBackbone resnet50 + PositionEmbeddingSine``.

    The top-level ``type``, then the typed values it holds (recursively, in file order), each
    with the model a backbone names (``model_name`` / ``name_or_model``)."""

    def one(node: Mapping[str, Any]) -> str:
        text = str(node.get("type"))
        model = next((node[k] for k in _MODEL_KEYS if isinstance(node.get(k), str)), None)
        return f"{text} {model}" if model else text

    def children(node: Any) -> list[Mapping[str, Any]]:
        values = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else []
        out = []
        for v in values:
            if isinstance(v, Mapping) and "type" in v:
                out.append(v)
            elif isinstance(v, list):
                out.extend(children(v))
        return out

    def tree(node: Mapping[str, Any]) -> str:
        inner = children(node)
        if not inner:
            return one(node)
        parts = [tree(c) if children(c) else one(c) for c in inner]
        return f"{one(node)}: {' + '.join(parts)}"

    return tree(cfg) if isinstance(cfg, Mapping) and "type" in cfg else "(no 'type' key)"


def _leading_comment(text: str) -> list[str]:
    """The lines of a YAML file's leading comment, ``#`` included."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _about(text: str) -> str:
    """The first clause of a YAML file's leading comment (up to its first ': ')."""
    lines = [line.lstrip("#").strip() for line in _leading_comment(text)]
    return " ".join(lines).split(": ", 1)[0].rstrip(".:")


def config_lines() -> list[str]:
    """One line per shipped config: short name, what it builds (:func:`builds`), what it is.

    Raises:
        ValueError: a packaged file is not a valid config (a broken install).
    """
    rows = []
    for name, entry in packaged_configs().items():
        with resources.as_file(entry) as path:  # the packaged file, even where a file of that name is here
            cfg = load_config(path)
        rows.append((name, builds(cfg), _about(entry.read_text(encoding="utf-8"))))
    width = [max(len(r[i]) for r in rows) for i in range(2)] if rows else [0, 0]
    return [f"{n.ljust(width[0])}  {b.ljust(width[1])}  {a}".rstrip() for n, b, a in rows]


class _Dumper(yaml.SafeDumper):
    """YAML as the shipped files write it: block mappings, lists of plain values on one line."""


def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = all(not isinstance(v, (dict, list)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _list)


def config_text(name: str) -> str:
    """The YAML ``vispos config show NAME`` prints: a comment naming the file, the file's
    leading comment, then the config as :func:`~vispos.config.load_config` reads it (keys in
    file order, anchors and aliases expanded).

    Raises:
        FileNotFoundError: no such file and no such shipped config (the message lists those
            that ship).
        ValueError: the file is not a valid config.
    """
    entry = resolve_config(name)
    with resources.as_file(entry) as path:
        cfg = load_config(path)
        text = path.read_text(encoding="utf-8")
    body = yaml.dump(cfg, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return "\n".join([f"# {name}: {path}", *_leading_comment(text), body.rstrip("\n")]) + "\n"


def execute(args: argparse.Namespace) -> None:
    """Runs ``vispos config ACTION`` (the CLI owns the terminal: this prints)."""
    if args.action == "list":
        for line in config_lines():
            print(line)
    elif args.action == "show":
        print(config_text(args.name), end="")
