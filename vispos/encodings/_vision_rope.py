"""The surface shared by the vision RoPE modules: argument checks, augmentation, the padded scope.

:class:`~vispos.DinoV3RotaryEmbedding` and :class:`~vispos.MixedRotaryEmbedding` differ in their
coordinates and frequencies (their own modules); how they read a grid or a mask, check ``x``,
augment in training, serve a padded batch inside ``with rope.padded(mask):`` and stack the tables
of several grids is one piece of code, here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .._checks import check_int, check_sizes
from . import _rope_grid as grid

__all__ = ["VisionRope"]


class VisionRope(nn.Module):
    """Base of the vision RoPE modules (not public): subclasses set ``num_axes`` and ``dim``."""

    num_axes: int
    dim: int

    def _init_buffers(self) -> None:  # subclasses fill their non-persistent buffers
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """Refills the non-persistent buffers (timm's name; learned parameters keep their values)."""
        self._init_buffers()

    def init_non_persistent_buffers(self) -> None:
        """Refills the non-persistent buffers, e.g. after materializing a meta-device module."""
        self._init_buffers()

    def _init_augs(self, shift: Any, jitter: Any, rescale: Any) -> None:
        self.shift_coords, self.jitter_coords, self.rescale_coords = grid.check_coord_augs(shift, jitter, rescale)
        self.aug_active = any(v is not None for v in (self.shift_coords, self.jitter_coords, self.rescale_coords))

    def _augment(self, lines: Tensor) -> Tensor:
        """``lines`` augmented by one draw in training mode (when configured), else as they are."""
        if not (self.training and self.aug_active):
            return lines
        draws = grid.draw_coord_augs(
            self.num_axes, self.shift_coords, self.jitter_coords, self.rescale_coords, lines.device
        )
        return grid.augment_lines(lines, draws)

    def _augs_repr(self) -> str:
        items = (("shift_coords", self.shift_coords), ("jitter_coords", self.jitter_coords),
                 ("rescale_coords", self.rescale_coords))
        return "".join(f", {k}={v}" for k, v in items if v is not None)

    def _check_shape(self, shape: Any, name: str = "shape") -> list[int]:
        return list(check_sizes(shape, name, ranks=(self.num_axes,)))

    def _read(self, shape: Any, mask: Any) -> grid.ItemBoxes:
        """The padded grid of ``mask``, checked against ``shape`` when one is given too."""
        boxes = grid.read_padding(mask, self.num_axes)
        if shape is not None and self._check_shape(shape) != list(boxes.spatial):
            raise ValueError(f"shape {list(shape)} disagrees with mask's grid {list(boxes.spatial)}")
        return boxes

    def _check_input(self, x: Any) -> Tensor:
        """``x`` of ``forward``: a floating ``Tensor[B, dim, *S]`` with ``num_axes`` spatial axes."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating Tensor (B, dim, *S), got {getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() != 2 + self.num_axes or x.shape[1] != self.dim:
            raise ValueError(
                f"x must have shape (B, dim={self.dim}, *S) with {self.num_axes} spatial axes, got {tuple(x.shape)}"
            )
        return x

    def padded(self, mask: Any):
        """A ``with`` block in which the module serves a padded batch to code that only passes a
        grid: every ``get_embed(shape)`` / ``get_embed()`` call inside it (timm's Eva calls it
        with the patch grid) returns the per-item tables of ``mask`` instead, shaped as timm's
        attention broadcasts them (see ``get_embed``). Nested blocks: the innermost wins. Safe
        under threads and asyncio tasks (a context variable, not module state).

        Example (a padded batch through an unmodified timm Eva; docs/encoders/rotary.md)::

            tokens = vispos.interpolate_mask(pixel_mask, grid)  # (B, h, w), True = padding
            with model.rope.padded(tokens):
                feats = model.forward_features(images, attn_mask=vispos.attn_mask_from_padding(
                    tokens, model.num_prefix_tokens))

        Args:
            mask (Tensor[B, *S] bool, Padding or NestedTensor): True marks padding, at the
                token grid.

        Returns:
            a context manager.

        Raises:
            TypeError / ValueError: as ``get_embed`` for ``mask`` (checked on entry).
        """
        grid.read_padding(mask, self.num_axes)
        return grid.padded_scope(self, mask)

    def _scoped(self) -> Any:
        """The mask of the innermost :meth:`padded` block around this call, or None."""
        return grid.scoped_padding(self)

    @staticmethod
    def _stack(embeds: list[Tensor], seq_len: int | None) -> Tensor | list[Tensor]:
        """Tables ``[..., N_i, C]`` as they are (no ``seq_len``), or zero-padded to ``seq_len``
        tokens and stacked: ``Tensor[len, ..., seq_len, C]`` (timm's ``_pad_rope_embeds``)."""
        if seq_len is None:
            return embeds
        seq_len = check_int(seq_len, "seq_len", minimum=0)
        longest = max(e.shape[-2] for e in embeds)
        if seq_len < longest:
            raise ValueError(f"seq_len must be at least the largest grid's token count {longest}, got {seq_len}")
        first = embeds[0]
        out = first.new_zeros((len(embeds), *first.shape[:-2], seq_len, first.shape[-1]))
        for i, e in enumerate(embeds):
            out[i, ..., : e.shape[-2], :] = e
        return out
