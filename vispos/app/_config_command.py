"""``vispos config list``: the configs that ship with vispos, one line each, with what each builds.

Reads the packaged YAML files only (nothing is built, torch is not imported). Each line gives the
short name (what :func:`vispos.build_from_config` and ``--config`` accept, from any working
directory), the objects the config builds (types, with the backbone's model name), and the
first clause of the file's leading comment (up to its first colon).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..config import load_config, packaged_configs

__all__ = ["add_config_parser", "config_lines", "execute"]

#: keys whose string value names the model a backbone builds (TimmBackbone, torchvision's)
_MODEL_KEYS = ("model_name", "name_or_model")


def add_config_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``config`` subcommand (``vispos config list``) to the ``vispos`` parser's subparsers."""
    p = sub.add_parser(
        "config", help="the configs that ship with vispos (vispos config list)",
        description="Configs that ship inside the package. --config and vispos.build_from_config "
        "accept a file path, or from any directory a shipped config's short name "
        "(detr_resnet50), file name (detr_resnet50.yaml) or configs/NAME.yaml.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="one line per shipped config: name, what it builds, what it is",
                       description="One line per shipped config: its short name, what it builds, "
                       "and the first clause of its comment.")
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


def _about(text: str) -> str:
    """The first clause of a YAML file's leading comment (up to its first ': ')."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
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


def execute(args: argparse.Namespace) -> None:
    """Runs ``vispos config ACTION`` (the CLI owns the terminal: this prints)."""
    if args.action == "list":
        for line in config_lines():
            print(line)
