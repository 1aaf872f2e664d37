"""Argument check shared by the image and volume loaders: a list of paths, never one string."""

from __future__ import annotations

import os
from collections.abc import Sequence


def check_paths(paths: object) -> None:
    """``paths`` must be a list/tuple of paths (a single str would be read letter by letter)."""
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError(f"paths must be a list or tuple of file paths, got {type(paths).__name__} {paths!r:.80}")
