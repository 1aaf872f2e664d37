"""Figure of a ViT's attention block by block: the mass on padding tokens and on the class and
register tokens, the entropy and the high-norm tokens, one line per run (e.g. stock against
padding-invariant).

The function returns a ``matplotlib.figure.Figure`` and never shows or writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._draw import new_figure

__all__ = ["plot_block_attention"]

#: panels: (key or keys summed, title)
_PANELS = (
    (("padding_mass",), "attention mass on padding tokens"),
    (("class_mass", "register_mass"), "attention mass on class + register tokens"),
    (("entropy",), "attention entropy (nats)"),
    (("outlier_fraction",), "high-norm patch tokens (share)"),
)


def plot_block_attention(runs: Mapping[str, Sequence[Mapping[str, float]]], title: str | None = None):
    """One panel per quantity, the block on the x axis, one line per run.

    Args:
        runs (mapping): ``{label: [row per block]}``, each row with ``block``, ``padding_mass``,
            ``class_mass``, ``register_mass``, ``entropy`` and ``outlier_fraction`` (the rows of
            :func:`vispos.app.train.attention.vit_block_diagnostics`).
        title (str, optional): the figure's title.

    Returns:
        matplotlib.figure.Figure: four panels in a row.

    Raises:
        ValueError: no run, or a run without rows.
    """
    if not runs:
        raise ValueError("runs must name at least one run, got none")
    fig = new_figure(4.0 * len(_PANELS), 3.2)
    axes = fig.subplots(1, len(_PANELS))
    for label, rows in runs.items():
        if not rows:
            raise ValueError(f"runs[{label!r}] has no block")
        blocks = [int(r["block"]) for r in rows]
        for ax, (keys, _) in zip(axes, _PANELS):
            ax.plot(blocks, [sum(float(r[k]) for k in keys) for r in rows], marker="o", label=label)
    for ax, (keys, name) in zip(axes, _PANELS):
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("block")
        ax.set_xticks(sorted({int(r["block"]) for rows in runs.values() for r in rows}))
        if keys != ("entropy",):
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
