"""The loaders' arguments: the sample names and normalisations they accept, a list of paths
(never one string) and the shrunk size; torch-free, so the ``vispos`` command's parser reads them."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..._suggest import did_you_mean

#: scikit-image sample photos used by ``vispos demo``
SAMPLE_IMAGES = ("astronaut", "coffee", "chelsea", "rocket")

#: every scikit-image sample that loads as one 2D image from the package itself (no download, no
#: optional dependency): the names ``--samples`` takes (a test loads each one)
SAMPLE_NAMES = (
    "astronaut", "binary_blobs", "brick", "camera", "cat", "cell", "checkerboard", "chelsea", "clock", "coffee",
    "coins", "colorwheel", "grass", "gravel", "horse", "hubble_deep_field", "immunohistochemistry", "logo",
    "microaneurysms", "moon", "page", "retina", "rocket", "shepp_logan_phantom", "text",
)

#: intensity normalisations :func:`~vispos.app.data.normalize_intensity` knows (None: leave
#: intensities as read)
VOLUME_NORMALIZATIONS = ("zscore", "minmax", "percentile", None)


def unknown_sample(name: object) -> str | None:
    """Why ``name`` is not one of :data:`SAMPLE_NAMES` (with the nearest names), or None."""
    if name in SAMPLE_NAMES:
        return None
    hint = did_you_mean(name, SAMPLE_NAMES) if isinstance(name, str) else ""
    return (f"unknown scikit-image sample {name!r}; " + (f"{hint} " if hint else "")
            + f"(the samples: {', '.join(SAMPLE_NAMES)})")


def check_paths(paths: object) -> None:
    """``paths`` must be a list/tuple of paths (a single str would be read letter by letter)."""
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise TypeError(f"paths must be a list or tuple of file paths, got {type(paths).__name__} {paths!r:.80}")


def shrunk_size(size: Sequence[int], max_size: int | None) -> tuple[int, ...]:
    """The spatial size after shrinking so the longest axis is at most ``max_size`` (never
    enlarged): each axis ``max(1, round(s * max_size / longest))``. The one formula of
    ``load_image(max_size=)``, ``load_volume(max_size=)`` and the CLI's batch bounds."""
    size = tuple(int(s) for s in size)
    if max_size is None or not size or max(size) <= max_size:
        return size
    ratio = max_size / max(size)
    return tuple(max(1, round(s * ratio)) for s in size)
