"""Figures of an encoding's channels: heatmaps, sin/cos curves, the wavelength ladder.

:func:`encode_grid` evaluates any vispos encoder on one item's grid, channels-first, for the
plots here and in :mod:`~vispos.app.figures.similarity`. Each ``plot_*`` function returns a
``matplotlib.figure.Figure`` and never shows or writes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..._sincos import frequency_divisors
from ...encodings import (
    LearnableSinusoidalPositionalEncoding,
    PositionalEncoding1D,
    PositionalEncoding2D,
    PositionalEncoding3D,
    PositionalEncodingPermute1D,
    PositionalEncodingPermute2D,
    PositionalEncodingPermute3D,
    PositionEmbeddingLearned,
    PositionEmbeddingRandom,
    PositionEmbeddingSine,
    SinusoidalPositionalEncoding,
    SpeechainPositionalEncoding,
)
from ..._checks import check_bool, check_int
from ...encodings.sine import SineEmbeddingBase
from ...padding import check_mask
from ._draw import new_figure
from ._inputs import check_channels, check_pos, check_shape

__all__ = ["encode_grid", "channel_wavelengths", "plot_channels", "plot_sincos_curves", "plot_wavelengths"]

#: the ``positional-encodings``-compatible classes (each has ``num_axes``, ``channels_first``,
#: ``org_channels`` and ``channels_per_axis``)
_GRID_CLASSES = (
    PositionalEncoding1D,
    PositionalEncoding2D,
    PositionalEncoding3D,
    PositionalEncodingPermute1D,
    PositionalEncodingPermute2D,
    PositionalEncodingPermute3D,
)


def encode_grid(
    encoder: torch.nn.Module,
    shape: Sequence[int],
    mask: Tensor | None = None,
    spacing: Sequence[float] | None = None,
) -> Tensor:
    """Evaluates a vispos encoder on one item of spatial shape ``S`` and returns it channels-first.

    Dispatches on the encoder's family: mask-driven DETR-family modules
    (:class:`~vispos.PositionEmbeddingSine` and its subclasses,
    :class:`~vispos.PositionEmbeddingLearned`, :class:`~vispos.PositionEmbeddingRandom`) get a
    bool mask ``(1, *S)``; the
    ``positional-encodings`` grid classes get a zero tensor in their layout; the 1D sequence
    encoders (:class:`~vispos.SinusoidalPositionalEncoding`,
    :class:`~vispos.LearnableSinusoidalPositionalEncoding`,
    :class:`~vispos.SpeechainPositionalEncoding`) get a zero sequence, so the result is
    the added encoding itself (plus any LayerNorm bias).

    Args:
        encoder (nn.Module): one of the encoders named above.
        shape (sequence of int): ``S``, 1 to 3 positive sizes (1 for sequence encoders).
        mask (Tensor[*S], bool, optional): True marks padding; only for mask-driven encoders.
        spacing (sequence of float, optional): the cell size along each axis in mm (tensor axis
            order), for the DETR-family sine encoders' and the random Fourier features' physical
            positions (their ``spacing``).

    Returns:
        Tensor[C, *S]: float32 on the CPU, channels-first whatever the encoder's layout.

    Raises:
        TypeError: an encoder of another kind; ``shape`` not an int or a sequence of ints; a
            non-bool ``mask``; a ``mask`` or a ``spacing`` for an encoder that takes none.
        ValueError: a bad ``shape``, or one the encoder does not support; a ``mask`` whose shape
            is not ``S``.

    References:
        Carion et al., DETR (ECCV 2020); positional-encodings (tatp22); Vaswani et al. 2017.
    """
    shape = check_shape(shape)
    if mask is not None:
        check_mask(mask)
        if tuple(mask.shape) != shape:
            raise ValueError(f"mask must have shape {shape}, got {tuple(mask.shape)}")
    with torch.no_grad():
        if spacing is not None:
            if not isinstance(encoder, (SineEmbeddingBase, PositionEmbeddingRandom)):
                raise TypeError(f"{type(encoder).__name__} takes no spacing; pass spacing=None")
            m = torch.zeros(1, *shape, dtype=torch.bool) if mask is None else mask.cpu()[None]
            return encoder(m, spacing=torch.tensor([list(spacing)], dtype=torch.float32))[0].float().contiguous()
        if isinstance(encoder, (PositionEmbeddingSine, PositionEmbeddingLearned, PositionEmbeddingRandom)):
            m = torch.zeros(1, *shape, dtype=torch.bool) if mask is None else mask.cpu()[None]
            return encoder(m)[0].float().contiguous()
        if mask is not None:
            raise TypeError(f"{type(encoder).__name__} takes no mask; pass mask=None")
        if isinstance(encoder, _GRID_CLASSES):
            if len(shape) != encoder.num_axes:
                raise ValueError(
                    f"{type(encoder).__name__} encodes {encoder.num_axes} spatial axes, got shape {shape}"
                )
            if encoder.channels_first:
                return encoder(torch.zeros(1, encoder.org_channels, *shape))[0].float().contiguous()
            return encoder(torch.zeros(1, *shape, encoder.org_channels))[0].movedim(-1, 0).float().contiguous()
        if isinstance(
            encoder, (SinusoidalPositionalEncoding, LearnableSinusoidalPositionalEncoding, SpeechainPositionalEncoding)
        ):
            if len(shape) != 1:
                raise ValueError(f"{type(encoder).__name__} encodes sequences (1 axis), got shape {shape}")
            x = torch.zeros(1, shape[0], encoder.dim)
            if not encoder.batch_first:
                x = x.transpose(0, 1)
            was_training = encoder.training
            encoder.eval()  # no dropout on a figure; restored below
            try:
                out = encoder(x)
            finally:
                encoder.train(was_training)
            out = out if encoder.batch_first else out.transpose(0, 1)
            return out[0].T.float().contiguous()
    raise TypeError(
        f"encoder must be a vispos spatial or sequence encoder (PositionEmbeddingSine, "
        f"PositionEmbeddingLearned, PositionalEncoding*D, SinusoidalPositionalEncoding, ...), "
        f"got {type(encoder).__name__}"
    )


def channel_wavelengths(encoder: torch.nn.Module, length: int) -> Tensor | None:
    """The wavelength, in cells, of every channel of one axis block of a fixed sine encoder.

    A channel ``sin(p w_k)`` repeats every ``2 pi / w_k`` units of ``p``. Positions are cells
    (``1, 2, ...`` for DETR, ``0, 1, ...`` for the others), except with DETR's ``normalize``,
    where one cell is ``scale / length`` units, so the wavelength in cells is
    ``2 pi / w_k * length / scale`` (for an unpadded line of ``length`` cells).

    Args:
        encoder (nn.Module): an encoder whose channels are fixed sinusoids:
            :class:`~vispos.PositionEmbeddingSine` (``num_pos_feats`` channels per axis,
            interleaved), the ``positional-encodings`` classes (interleaved) or
            :class:`~vispos.SinusoidalPositionalEncoding` / :class:`~vispos.SpeechainPositionalEncoding`
            (their ``layout`` and ``ladder``).
        length (int): the line's length in cells (only used with ``normalize``), >= 1.

    Returns:
        Tensor[F] | None: float64, the wavelength of channels ``0 .. F-1`` of the first axis
            block (``F`` channels); ``None`` for an encoder without fixed frequencies (learned).

    Raises:
        TypeError: ``length`` is not an int.
        ValueError: ``length < 1``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5).
    """
    length = check_int(length, "length", minimum=1)
    if isinstance(encoder, PositionEmbeddingSine):
        feats, temp, layout, ladder = encoder.num_pos_feats, encoder.temperature, "interleaved", "standard"
    elif isinstance(encoder, _GRID_CLASSES):
        feats, temp, layout, ladder = encoder.channels_per_axis, 10000.0, "interleaved", "standard"
    elif isinstance(encoder, (SinusoidalPositionalEncoding, SpeechainPositionalEncoding)):
        feats, temp = encoder.dim, encoder.temperature
        layout, ladder = encoder.layout, encoder.ladder
    else:
        return None
    div = frequency_divisors(feats, float(temp), ladder=ladder, dtype=torch.float64)
    lam = 2 * math.pi * div
    if isinstance(encoder, PositionEmbeddingSine) and encoder.normalize:
        lam = lam * (length + encoder.eps) / encoder.scale
    k = torch.arange(feats)
    index = k // 2 if layout == "interleaved" else k % (feats // 2)
    if div.shape[0] == feats:  # the "continued" ladder: the cosines have their own divisors
        index = index + feats // 2 * (k % 2 if layout == "interleaved" else k // (feats // 2))
    return lam[index]


def plot_channels(
    pos: Tensor,
    channels: Sequence[int] | None = None,
    *,
    title: str | None = None,
    max_panels: int = 8,
):
    """Channel heatmaps of one item's encoding over a 1D or 2D grid.

    1D: one image, channel index down and position across (the classic "frequency plot": fast
    channels at the top of each block, slow ones below). 2D: one panel per chosen channel.

    Args:
        pos (Tensor[C, L] or Tensor[C, H, W]): one item's encoding, channels-first (see
            :func:`encode_grid`), any floating dtype.
        channels (sequence of int, optional): the channels to draw. Default: every channel in
            1D; in 2D ``max_panels`` channels evenly spread over ``0 .. C-1``.
        title (str, optional): the figure's title.
        max_panels (int): the default number of 2D panels (>= 1).

    Returns:
        matplotlib.figure.Figure: 1 heatmap axes plus a colorbar in 1D; one axes per channel plus
            a colorbar in 2D. Never shown; save it with ``fig.savefig(path)``.

    Raises:
        TypeError: ``pos`` is not a floating tensor; ``channels`` does not hold ints; a non-int
            ``max_panels``.
        ValueError: ``pos`` is not ``(C, L)`` / ``(C, H, W)``; an empty ``channels`` or one out
            of range; ``max_panels < 1``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (the sinusoid table figure).
    """
    pos = check_pos(pos, "pos", (1, 2))
    c = pos.shape[0]
    max_panels = check_int(max_panels, "max_panels", minimum=1)
    if pos.dim() == 2:
        chans = list(range(c)) if channels is None else check_channels(channels, c)
        fig = new_figure(7.0, 3.2 + 0.006 * len(chans))
        ax = fig.subplots()
        im = ax.imshow(pos[chans].numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1,
                       interpolation="nearest")
        ax.set_xlabel("position (cell)")
        ax.set_ylabel("channel" if channels is None else "channel (row of the selection)")
        fig.colorbar(im, ax=ax, label="value")
    else:
        if channels is None:
            chans = sorted(set(np.linspace(0, c - 1, min(c, max_panels)).round().astype(int).tolist()))
        else:
            chans = check_channels(channels, c)
        cols = min(4, len(chans))
        rows = -(-len(chans) // cols)
        fig = new_figure(2.4 * cols + 0.8, 2.3 * rows + 0.4)
        axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
        im = None
        for ax, ch in zip(axes, chans):
            im = ax.imshow(pos[ch].numpy(), cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
            ax.set_title(f"channel {ch}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in axes[len(chans):]:
            fig.delaxes(ax)
        fig.colorbar(im, ax=axes[: len(chans)].tolist(), shrink=0.8, label="value")
    fig.suptitle(title or f"encoding channels over a {'x'.join(map(str, pos.shape[1:]))} grid", fontsize=10)
    return fig


def plot_sincos_curves(
    pos: Tensor,
    channels: Sequence[int],
    *,
    wavelengths: Sequence[float] | Tensor | None = None,
    positions: Sequence[float] | Tensor | None = None,
    title: str | None = None,
):
    """Curves of chosen channels of a 1D encoding against position, wavelengths marked.

    One row per channel. With ``wavelengths`` each row marks one period, a bar from the first
    position to ``first + wavelength``, and names it in the row's legend; a channel whose
    wavelength exceeds the plotted range says so.

    Args:
        pos (Tensor[C, L]): a 1D encoding, channels-first (see :func:`encode_grid`).
        channels (sequence of int): the channels to draw (each in ``0 .. C-1``).
        wavelengths (sequence of float | Tensor[C], optional): each channel's wavelength in the
            units of ``positions`` (see :func:`channel_wavelengths`), indexed by channel.
        positions (sequence of float | Tensor[L], optional): the x value of each cell.
            Default ``0 .. L-1``.
        title (str, optional): the figure's title.

    Returns:
        matplotlib.figure.Figure: ``len(channels)`` axes sharing the x axis.

    Raises:
        TypeError: ``pos`` is not a floating tensor; ``channels`` does not hold ints.
        ValueError: ``pos`` is not ``(C, L)``; an empty ``channels`` or one out of range; ``wavelengths`` shorter
            than ``C`` or ``positions`` not of length ``L``.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5).
    """
    pos = check_pos(pos, "pos", (1,))
    c, length = pos.shape
    chans = check_channels(channels, c)
    x = np.arange(length, dtype=float) if positions is None else np.asarray(
        torch.as_tensor(positions, dtype=torch.float64).cpu(), dtype=float)
    if x.shape != (length,):
        raise ValueError(f"positions must have length {length} (one per cell), got shape {x.shape}")
    lam = None
    if wavelengths is not None:
        lam = np.asarray(torch.as_tensor(wavelengths, dtype=torch.float64).cpu(), dtype=float).ravel()
        if lam.shape[0] < c:
            raise ValueError(f"wavelengths must give one value per channel ({c}), got {lam.shape[0]}")
    fig = new_figure(7.5, 1.25 * len(chans) + 0.8)
    axes = fig.subplots(len(chans), 1, sharex=True, squeeze=False)[:, 0]
    span = x[-1] - x[0] if length > 1 else 1.0
    for ax, ch in zip(axes, chans):
        ax.plot(x, pos[ch].numpy(), color="tab:blue", lw=1.4, label=f"channel {ch}")
        ax.set_ylim(-1.25, 1.25)
        ax.set_yticks([-1, 0, 1])
        ax.axhline(0, color="0.8", lw=0.6, zorder=0)
        if lam is not None:
            wl = float(lam[ch])
            if wl <= span:
                ax.annotate("", xy=(x[0] + wl, -1.12), xytext=(x[0], -1.12),
                            arrowprops=dict(arrowstyle="<->", color="tab:red", lw=1.2))
                ax.axvline(x[0] + wl, color="tab:red", lw=0.8, ls=":")
                ax.plot([], [], color="tab:red", label=f"wavelength {wl:.3g}")
            else:
                ax.plot([], [], color="none", label=f"wavelength {wl:.3g} (> range)")
        ax.legend(loc="upper right", fontsize=7, framealpha=0.8)
    axes[-1].set_xlabel("position")
    fig.suptitle(title or "sin / cos channels against position", fontsize=10)
    return fig


def plot_wavelengths(
    num_feats: int = 128,
    temperatures: Sequence[float] = (20.0, 100.0, 10000.0),
    ladders: Sequence[str] = ("standard", "t2t"),
    *,
    frequency: bool = False,
):
    """Wavelength (or frequency) of each frequency index ``k`` for several temperatures and ladders.

    ``standard``: ``w_k = T^(-2k/F)`` (Vaswani et al., DETR); ``t2t``:
    ``w_j = exp(-ln(T) j / (F/2 - 1))`` (tensor2tensor, fairseq2); ``continued``: the standard
    ladder's ``F / 2`` frequencies for the sines, then ``w_k / T`` for the cosines, ``F`` points
    (speechain's ``posenc_type="sep"``). The wavelength is
    ``2 pi / w_k`` (position units: cells, or normalised units with DETR's ``normalize``). One
    axes per ladder, one line per temperature, log scale. Computed with
    :func:`vispos._sincos.frequency_divisors`, the table every encoder uses.

    Args:
        num_feats (int): ``F``, channels of one axis (positive, even; >= 4 for ``t2t``).
        temperatures (sequence of float): the temperatures ``T`` (each > 0).
        ladders (sequence of str): any of ``"standard"``, ``"t2t"``, ``"continued"``.
        frequency (bool): plot ``w_k`` (radians per unit) instead of the wavelength.

    Returns:
        matplotlib.figure.Figure: ``len(ladders)`` axes sharing the y axis, each with
            ``len(temperatures)`` lines of ``F / 2`` points (``F`` for ``"continued"``).

    Raises:
        TypeError: ``num_feats`` is not an int; a temperature is not a number; a ladder is not
            a str; a non-bool ``frequency``.
        ValueError: odd or non-positive ``num_feats``; an empty ``temperatures`` / ``ladders``;
            an unknown ladder; a non-positive temperature.

    References:
        Vaswani et al., Attention Is All You Need, NeurIPS 2017 (sec. 3.5); tensor2tensor
        ``get_timing_signal_1d``; Zhang et al., DINO, ICLR 2023 (temperature 20).
    """
    frequency = check_bool(frequency, "frequency")
    temperatures = list(temperatures)
    ladders = list(ladders)
    if not temperatures or not ladders:
        raise ValueError(f"temperatures and ladders must be non-empty, got {temperatures!r} and {ladders!r}")
    tables = {(ld, t): frequency_divisors(num_feats, t, ladder=ld, dtype=torch.float64)
              for ld in ladders for t in temperatures}
    fig = new_figure(4.2 * len(ladders) + 0.6, 3.6)
    axes = fig.subplots(1, len(ladders), sharey=True, squeeze=False)[0]
    for ax, ld in zip(axes, ladders):
        for t in temperatures:
            div = tables[ld, t].numpy()
            ys = 1.0 / div if frequency else 2 * math.pi * div
            ax.plot(np.arange(len(div)), ys, marker=".", ms=3, lw=1.2, label=f"T = {t:g}")
        ax.set_yscale("log")
        ax.set_xlabel(f"frequency index k (sines then cosines, {num_feats} channels)" if ld == "continued"
                      else f"frequency index k (channels 2k, 2k+1 of {num_feats})")
        ax.set_title(f"{ld} ladder", fontsize=10)
        ax.grid(True, which="both", color="0.9", lw=0.5)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("frequency w_k (rad / unit)" if frequency else "wavelength 2 pi / w_k (units)")
    fig.suptitle(f"{'frequency' if frequency else 'wavelength'} against channel, F = {num_feats}", fontsize=10)
    return fig
