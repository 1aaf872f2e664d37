"""PNG files of the figures, each written all or nothing through :mod:`vispos.app._io`.

The only place a figure becomes a file: :func:`save_figure` for any ``Figure`` of
:mod:`vispos.app.figures`, and the two writers of the ``vispos demo`` / ``vispos run`` figure
(:func:`plot_position_similarity`, :func:`plot_volume_similarity`), kept under their original
names (``vispos.viz``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from torch import Tensor

from .. import _deprecation
from ..nested_tensor import NestedTensor
from ._io import write_files
from .figures import plot_level_similarity, plot_volume_level_similarity

__all__ = ["png_writer", "save_figure", "plot_position_similarity", "plot_volume_similarity"]


def png_writer(fig, dpi: int) -> Callable[[str], None]:
    """A writer for :func:`vispos.app._io.write_files`: ``writer(tmp_path)`` saves ``fig`` there
    as a PNG of ``dpi`` dots per inch (use it to write a figure together with other files)."""
    return lambda tmp: fig.savefig(tmp, dpi=dpi, format="png")


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 100, replace: bool = True) -> str:
    """Writes ``fig`` to ``path`` as a PNG, all or nothing.

    The PNG is drawn into a hidden temporary file beside ``path`` and renamed over it, so a
    failure or a signal leaves either the old file or none, never a partial one.

    Args:
        fig (matplotlib.figure.Figure): e.g. from :mod:`vispos.app.figures`.
        path (str | PathLike): the PNG to write; its folder must exist.
        dpi (int): resolution.
        replace (bool): replace an existing file (the default); False: refuse it, even one
            that appears while the PNG is drawn.

    Returns:
        str: ``path``.

    Raises:
        FileExistsError: ``replace`` is False and ``path`` exists.
        OSError: the folder is missing or not writable.
    """
    write_files([(path, png_writer(fig, dpi))], replace=replace)
    return os.fspath(path)


@_deprecation.renamed_kwargs(normalized="imagenet_normalized")
def plot_position_similarity(
    batch: NestedTensor,
    levels: Sequence[NestedTensor],
    pos: Sequence[Tensor],
    path: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    strides: Sequence[int] | None = None,
    n_queries: int = 3,
    imagenet_normalized: bool = True,
    dpi: int = 90,
) -> str:
    """Writes :func:`~vispos.app.figures.plot_level_similarity`'s figure to one PNG.

    Each image with its padding hatched grey, then for every level the cosine similarity of the
    position embedding at ``n_queries`` query cells to every other cell.

    Args:
        batch (NestedTensor[B, 3, H, W]): the input batch.
        levels (sequence of NestedTensor): the backbone levels (for their masks).
        pos (sequence of Tensor[B, C, H_l, W_l]): the position embedding of each level.
        path (str | PathLike): the PNG to write (written to a temporary file, then renamed).
        names (sequence of str, optional): a title per image.
        strides (sequence of int, optional): a label per level.
        n_queries (int): query cells per level and image.
        imagenet_normalized (bool): ``batch`` is ImageNet-normalised (undo it for display).
        dpi (int): resolution of the PNG.

    Returns:
        str: ``path``.

    Raises:
        TypeError: ``batch`` is not a :class:`~vispos.NestedTensor`.
        ValueError: ``levels`` and ``pos`` differ in length; a 3D batch (not drawable here).
        OSError: ``path`` cannot be written.

    References:
        Carion et al., DETR (ECCV 2020), figure of position-embedding similarities.
    """
    fig = plot_level_similarity(batch, levels, pos, names=names, strides=strides, n_queries=n_queries,
                                imagenet_normalized=imagenet_normalized)
    return save_figure(fig, path, dpi=dpi)


def plot_volume_similarity(
    batch: NestedTensor,
    levels: Sequence[NestedTensor],
    pos: Sequence[Tensor],
    path: str | os.PathLike,
    *,
    names: Sequence[str] | None = None,
    strides: Sequence[object] | None = None,
    dpi: int = 80,
) -> str:
    """Writes :func:`~vispos.app.figures.plot_volume_level_similarity`'s figure to one PNG.

    Orthogonal slices of each volume with its padding hatched grey, then for every level the cosine
    similarity of the 3D position embedding at the centre of the valid region to every cell.

    Args:
        batch (NestedTensor[B, C, D, H, W]): the input volumes (channel 0 is drawn).
        levels (sequence of NestedTensor[B, C_l, D_l, H_l, W_l]): the levels (for their masks).
        pos (sequence of Tensor[B, C_pos, D_l, H_l, W_l]): each level's position embedding.
        path (str | PathLike): the PNG (written to a temporary file, then renamed).
        names (sequence of str, optional): a title per volume.
        strides (sequence, optional): a label per level (int or per-axis tuple).
        dpi (int): resolution.

    Returns:
        str: ``path``.

    Raises:
        TypeError: ``batch`` is not a :class:`~vispos.NestedTensor`.
        ValueError: ``levels`` and ``pos`` differ in length; the batch is not 3D.
        OSError: ``path`` cannot be written.

    References:
        Carion et al., DETR (ECCV 2020), position-embedding similarity figure, here in 3D.
    """
    fig = plot_volume_level_similarity(batch, levels, pos, names=names, strides=strides)
    return save_figure(fig, path, dpi=dpi)
