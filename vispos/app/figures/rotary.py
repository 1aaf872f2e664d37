"""Figure of rotary embeddings: the score ``q_m . k_n`` depends on the offset ``m - n`` only.

Returns a ``matplotlib.figure.Figure`` and never shows or writes it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..._checks import check_int
from ...encodings import RotaryEmbedding
from ._draw import new_figure

__all__ = ["plot_rotary_invariance"]


def plot_rotary_invariance(rotary: torch.nn.Module, length: int = 64, *, seed: int = 0):
    """Rotary embeddings: ``q_m . k_n`` depends on the offset ``m - n`` only.

    Draws one random query and one random key vector (``generator`` seeded with ``seed``),
    rotates them to every position ``0 .. length-1`` with ``rotary``, and shows the score matrix
    ``S[m, n] = rot(q, m) . rot(k, n)`` (constant along each diagonal) next to ``S[m, m + d]``
    against the offset ``d`` for several ``m`` (the curves coincide).

    Args:
        rotary (RotaryEmbedding): a :class:`~vispos.RotaryEmbedding` (1D).
        length (int): positions, >= 2.
        seed (int): seed of the random vectors.

    Returns:
        matplotlib.figure.Figure: 2 axes (matrix, offset curves) plus a colorbar.

    Raises:
        TypeError: ``rotary`` is not a :class:`~vispos.RotaryEmbedding`; a non-int ``length``.
        ValueError: ``length < 2``.

    References:
        Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding, 2021.
    """
    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a RotaryEmbedding, got {type(rotary).__name__}")
    length = check_int(length, "length", minimum=2)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rotary.dim, generator=gen).expand(length, rotary.dim)
    k = torch.randn(rotary.dim, generator=gen).expand(length, rotary.dim)
    with torch.no_grad():
        scores = (rotary(q.clone()) @ rotary(k.clone()).T).numpy()
    fig = new_figure(9.0, 3.8)
    ax0, ax1 = fig.subplots(1, 2)
    im = ax0.imshow(scores, cmap="RdBu_r", interpolation="nearest",
                    vmin=-np.abs(scores).max(), vmax=np.abs(scores).max())
    ax0.set_xlabel("key position n")
    ax0.set_ylabel("query position m")
    ax0.set_title("rot(q, m) . rot(k, n)", fontsize=9)
    fig.colorbar(im, ax=ax0, shrink=0.8)
    for m, style, width in zip(sorted({0, length // 4, length // 2}), ("-", "--", ":"), (3.0, 1.8, 1.2)):
        d = np.arange(-m, length - m)
        ax1.plot(d, scores[m, m + d], ls=style, lw=width, label=f"m = {m}")
    ax1.set_xlabel("offset d = n - m")
    ax1.set_ylabel("score")
    ax1.set_title("S[m, m + d]: one curve whatever m", fontsize=9)
    ax1.legend(fontsize=8)
    fig.suptitle(f"rotary (dim {rotary.dim}, theta {rotary.theta:g}): relative-offset invariance", fontsize=10)
    return fig
