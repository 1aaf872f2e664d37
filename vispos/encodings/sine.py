"""DETR's sine position embedding, for 1, 2 or 3 spatial axes, mask-aware.

A thin module over three steps, each with one home: the input is read into a
:class:`~vispos.Padding` (:func:`~vispos.nested_tensor.parse_spatial_input`), the padding becomes
DETR's positions (:mod:`vispos._positions`: line tables for boxes, cumulative counts for any
mask) and the positions become sines (:mod:`vispos._sincos`, :mod:`vispos._sincos_lines`). The
modules here branch on :attr:`Padding.kind` only, and the cache sits at one point
(:meth:`SineEmbeddingBase.forward`).

References:
    Carion et al., End-to-End Object Detection with Transformers, ECCV 2020
    (``models/position_encoding.py``, ``PositionEmbeddingSine``);
    Zhu et al., Deformable DETR, ICLR 2021 (``offset=-0.5``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Union

import numpy as np
import torch
from torch import Tensor, nn

from .. import _deprecation, _tracing
from .._cache import DEFAULT_MAX_BYTES, TensorCache, check_max_bytes
from .._cache_owner import CacheOwner, expand_batch
from .._derived import DerivedBuffers
from .._checks import check_bool, check_float_dtype, check_int, check_number, check_output_fits, describe
from .._positions import PositionRule, cumulative_positions, detr_positions, distinct_positions, grid_positions
from .._positions import line_table
from .._sincos import (
    _embed_axis,
    check_num_feats,
    check_out,
    check_temperature,
    frequency_divisors,
    sincos_embed,
)
from .._sincos_lines import sincos_embed_indexed, sincos_embed_lines
from ..nested_tensor import NestedTensor, NestedTensorLike, float_mask_hint, parse_spatial_input
from ..padding import Padding, is_rectangular, rectangular_sizes
from ._call import check_spacing as _check_spacing  # also random_fourier's
from ._call import read_masks, warn_suspect_input
from . import _sine_op

# ``cumulative_positions`` lives in :mod:`vispos._positions`, ``is_rectangular`` and
# ``rectangular_sizes`` in :mod:`vispos.padding`; re-exported here, their earlier home.
__all__ = ["PositionEmbeddingSine", "cumulative_positions", "is_rectangular", "rectangular_sizes"]

_KIND = {1: "sequences", 2: "images", 3: "volumes"}
_GATHER_MIN = 1 << 16  # elements of an axis block from which the masked path may gather

SineInput = Union[NestedTensor, NestedTensorLike, Tensor]
check_output_dtype = check_float_dtype  # old name, kept for callers


class SineEmbeddingBase(CacheOwner, DerivedBuffers, _deprecation.RenamedAttributes, nn.Module):
    """What every DETR-style sine embedding shares: the constructor's validation, the reading
    of the input into a :class:`~vispos.Padding`, the output dtype and ``out`` checks, empty
    inputs and the cache (one point, in :meth:`forward`). A subclass says how positions become
    channels (:meth:`_embed`; or the whole step from a padding, :meth:`_embed_padding`,
    branching on ``padding.kind``), how many it gives (:meth:`out_channels`) and, optionally,
    how many axes it takes (``num_axes``, None = 1 to 3).

    Args:
        num_pos_feats, temperature, normalize, scale, offset, eps, cache_size, cache_bytes,
            zero_copy, extent: see :class:`PositionEmbeddingSine`.

    Raises:
        TypeError: a non-int ``num_pos_feats`` / ``cache_size``; a non-bool ``normalize``;
            non-number ``scale`` / ``offset`` / ``eps`` / ``extent``; a non-int
            ``cache_bytes``; a non-bool ``zero_copy``.
        ValueError: odd or non-positive ``num_pos_feats``; ``scale`` or ``extent`` without
            ``normalize``; non-positive ``temperature``, ``scale`` or ``extent``; negative
            ``eps``, or ``eps == 0`` with ``normalize``; negative ``cache_size`` or
            ``cache_bytes``.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
    """

    num_axes: int | None = None
    _renamed = {"n_spatial": "num_axes"}

    def __init__(
        self,
        num_pos_feats: int = 64,
        temperature: float = 10000,
        normalize: bool = False,
        scale: float | None = None,
        offset: float = 0.0,
        eps: float = 1e-6,
        cache_size: int = 8,
        cache_bytes: int | None = DEFAULT_MAX_BYTES,
        *,
        zero_copy: bool = False,
        extent: float | None = None,
    ) -> None:
        super().__init__()
        num_pos_feats = check_num_feats(num_pos_feats)
        temperature = check_temperature(temperature)
        normalize = check_bool(normalize, "normalize")
        if scale is not None and not normalize:
            raise ValueError(f"normalize should be True if scale is passed (got scale={describe(scale)}, normalize=False)")
        if scale is None:
            scale = 2 * math.pi
        scale = check_number(scale, "scale", positive=True)
        offset = check_number(offset, "offset")
        eps = check_number(eps, "eps", nonnegative=True)
        if normalize and eps == 0:
            raise ValueError(
                "eps must be > 0 with normalize=True: a fully padded line is normalised by its "
                "valid count 0 + eps, so eps=0 would give NaN (DETR uses 1e-6)"
            )
        if extent is not None:
            extent = check_number(extent, "extent", positive=True)
            if not normalize:
                raise ValueError(f"extent needs normalize=True (got extent={extent}, normalize=False)")
            extent = float(extent)
        cache_size = check_int(cache_size, "cache_size", minimum=0)
        zero_copy = check_bool(zero_copy, "zero_copy")
        self._cache = TensorCache(cache_size, check_max_bytes(cache_bytes, "cache_bytes"))
        self.zero_copy = zero_copy
        self._num_pos_feats = num_pos_feats
        self._temperature = temperature
        self.normalize = normalize
        self.scale = float(scale)
        self.offset = float(offset)
        self.eps = float(eps)
        self.extent = extent
        self.register_buffer("dim_t", self._divisor_table(None), persistent=False)

    # ------------------------------------------------------------------------------------ api
    def out_channels(self, num_axes: int) -> int:  # pragma: no cover - abstract
        """Channels of the output for an input with ``num_axes`` spatial axes."""
        raise NotImplementedError

    def forward(
        self,
        x: SineInput,
        mask: Tensor | None = None,
        *,
        pixel_mask: Tensor | None = None,
        dtype: torch.dtype | None = None,
        spacing: Tensor | Sequence[float] | None = None,
        out: Tensor | None = None,
    ) -> Tensor:
        """Embeds the positions of ``x``'s cells; see the class docstring for shapes.

        Args:
            x (NestedTensor | NestedTensorLike | Tensor[B, *S] bool | Tensor[B, C, *S] float):
                what to embed (a bare floating tensor is a 2D or 3D feature map; see
                :func:`~vispos.nested_tensor.parse_spatial_input`).
            mask (Tensor[B, *S] bool, optional): DETR's mask of a feature map ``x``, True =
                padding: ``pos(features, mask)`` as DETR-family code writes it (the same as
                ``pos(NestedTensor(features, mask))``). Only a bool tensor is taken here.
            pixel_mask (Tensor[B, *S], optional, keyword-only): transformers' mask of a feature
                map ``x``, 1 = valid, 0 = padding, any dtype (other values refused on the CPU;
                on an accelerator nonzero is valid). Not together with ``mask``.
            dtype (torch.dtype, optional, keyword-only): output dtype (floating); float32 when
                not given. Angles are computed in float32 and rounded once to ``dtype``. (As
                the second positional argument it still works, with a ``DeprecationWarning``.)
            spacing (Tensor[B, n] | Tensor[n] | sequence of n floats, optional, keyword-only):
                each item's cell size along each spatial axis, in millimetres, in the tensor's
                spatial axis order (the order of MONAI's arrays and affines;
                ``vispos.monai.meta_spacing`` reads it from a ``MetaTensor`` batch); one row of
                ``n`` (a list, tuple, array or 1-d tensor) is every item's. Cells are placed at
                their physical coordinates, ``(p + offset) * s``, see the class docstring. Ones
                give the cell numbers bit for bit. Read on the host for the cache key when it
                is on the CPU. With ``normalize=True`` it needs ``extent`` (else it would cancel).
            out (Tensor[B, out_channels(n), *S], optional, keyword-only): a preallocated
                buffer of the output's shape, dtype (``dtype`` or float32) and device, written
                in place and returned (the cache is bypassed). With a ``NestedTensor`` or a
                feature map on CUDA this makes :class:`PositionEmbeddingSine`'s call capturable
                by a CUDA graph: no allocation, no host synchronisation.

        Returns:
            Tensor[B, out_channels(n), *S] in ``dtype`` (``out`` when given). An empty batch or
            a zero-size spatial axis gives an empty tensor of that shape.

        Raises:
            TypeError: ``x`` of another type; an integer mask; a 3-dim floating tensor (a float
                mask or a 1D feature map: ambiguous); a ``mask`` that is not a bool tensor;
                ``mask`` and ``pixel_mask`` together, or either with an ``x`` that carries its
                own mask; a non-floating ``dtype``; ``out`` not a tensor; ``spacing`` not a
                floating tensor or a sequence of numbers.
            ValueError: ``x`` of the wrong rank; a mask not of shape ``(B, *S)``; ``out`` of
                another shape, dtype or device, requiring grad, or an expanded (stride-0) view;
                ``spacing`` not of shape ``(B, n)`` or ``(n,)``, or (on the CPU) not finite and
                > 0; a CPU ``pixel_mask`` not of 0 and 1; ``spacing`` with ``normalize=True`` and no ``extent``.

        Warns:
            UserWarning: a bare ``(B, H, W, c)`` map with ``c`` in 1, 3, 4 (a channels-last
                image?); an item with no valid cell (read on the host only).
        """
        x, dtype = read_masks(type(self).__name__, x, mask, pixel_mask, dtype)
        padding, host = parse_spatial_input(x, self.num_axes)
        spatial, batch, device = padding.spatial, padding.batch, padding.device
        out_dtype = torch.float32 if dtype is None else check_float_dtype(dtype)
        if self.num_axes is not None and len(spatial) != self.num_axes:
            raise ValueError(
                f"{type(self).__name__} embeds {_KIND[self.num_axes]} ({self.num_axes} spatial axes): a "
                f"NestedTensor (B, C, *S), a mask (B, *S) or a feature map (B, C, *S); got spatial "
                f"shape {spatial}{float_mask_hint(x, self.num_axes)}"
            )
        if spacing is not None and self.normalize and self.extent is None:
            raise ValueError(
                f"spacing has no effect with normalize=True and no extent: each line is divided by its "
                f"own length in mm, so the millimetres cancel. Pass extent= (one length in mm for every "
                f"axis, e.g. the largest field of view) to {type(self).__name__}(normalize=True, extent=...), "
                "or drop spacing for DETR's per-line fractions"
            )
        channels = self.out_channels(len(spatial))
        if out is None and host:  # refused by size before anything is computed (the one allocation guard)
            check_output_fits(type(self).__name__, (batch, channels, *spatial), out_dtype, device)
        if out is not None:
            check_out(out, (batch, channels, *spatial), out_dtype, device)
        if batch == 0 or 0 in spatial:  # nothing to embed: a well-defined empty result
            if out is not None:
                return out
            return torch.zeros((batch, channels, *spatial), dtype=out_dtype, device=device)
        warn_suspect_input(x, padding, host)
        spacing, spacing_key = _check_spacing(spacing, batch, len(spatial), device)
        unpadded = padding.kind == "none" and spacing is None
        if unpadded:  # one table (1, C, *S) serves every item
            padding = Padding._make("none", 1, spatial, device)
        if out is not None:
            if unpadded:
                return out.copy_(self._embed_padding(padding, out_dtype, host).expand(out.shape))
            return self._embed_padding(padding, out_dtype, host, out, spacing)

        def build() -> Tensor:
            return self._embed_padding(padding, out_dtype, host, spacing=spacing)

        if not host or (padding.kind == "arbitrary" and not _tracing.host_side(device)) or (
            spacing is not None and spacing_key is None
        ):
            # traced, captured, or a device mask (comparing it would synchronise): no cache
            table = build()
            return expand_batch(table, batch, shared=False, zero_copy=self.zero_copy) if unpadded else table
        key, content = padding._host_key()
        key += (device, out_dtype) + self._params() + (spacing_key,)
        if unpadded:
            table, shared = self._cache.lookup(key, build, traced=False)  # host facts: not traced
            return expand_batch(table, batch, shared=shared, zero_copy=self.zero_copy)
        return self._cache.get(key, build, content=content, copy=not self.zero_copy, traced=False)

    @property
    def cache_size(self) -> int:
        """int: entries kept; assigning evicts at once (0 empties and disables the cache)."""
        return self._cache.maxsize

    @cache_size.setter
    def cache_size(self, value: int) -> None:
        value = check_int(value, "cache_size", minimum=0)
        self._cache.maxsize = value

    def extra_repr(self) -> str:
        text = (
            f"num_pos_feats={self.num_pos_feats}, temperature={self.temperature}, "
            f"normalize={self.normalize}, scale={self.scale}, offset={self.offset}, eps={self.eps}, "
            f"cache_size={self.cache_size}"
        )
        if self.cache_bytes != DEFAULT_MAX_BYTES:
            text += f", cache_bytes={self.cache_bytes}"
        if self.extent is not None:
            text += f", extent={self.extent}"
        return text + (", zero_copy=True" if self.zero_copy else "")

    # -------------------------------------------------------------------------------- helpers
    def _embed_padding(
        self,
        padding: Padding,
        dtype: torch.dtype,
        host: bool,
        out: Tensor | None = None,
        spacing: Tensor | None = None,
    ) -> Tensor:
        """``Tensor[padding.batch, C, *S]`` in ``dtype`` (into ``out`` when given): the
        embedding of ``padding``'s cells (``host``: host facts may be used; ``spacing``:
        ``Tensor[B, n]`` float32 on the padding's device, or None for cells). Generic form:
        DETR's positions as one tensor per axis (:func:`~vispos._positions.detr_positions`), then
        :meth:`_embed`; :class:`PositionEmbeddingSine` replaces it with its line-table path."""
        positions = detr_positions(padding, host, self._rule(), spacing)
        result = self._embed(positions, (padding.batch, *padding.spatial), dtype, padding.device)
        return result if out is None else out.copy_(result)

    def _embed(
        self, positions: list[Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> Tensor:  # pragma: no cover - abstract
        """Channels-first embedding ``Tensor[shape[0], C, *shape[1:]]`` of per-axis positions
        (float32, broadcastable to ``shape``)."""
        raise NotImplementedError

    @property
    def num_pos_feats(self) -> int:
        """int: channels per spatial axis; assigning checks it, rebuilds ``dim_t`` and empties
        the cache."""
        return self._num_pos_feats

    @num_pos_feats.setter
    def num_pos_feats(self, value: int) -> None:
        self._num_pos_feats = check_num_feats(value)
        self._refresh_derived()

    @property
    def temperature(self) -> float:
        """float: ``T`` of the frequency ladder; assigning checks it, rebuilds ``dim_t`` and
        empties the cache."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_temperature(value)
        self._refresh_derived()

    def _params(self) -> tuple:
        return (self.num_pos_feats, self.temperature, self.normalize, self.scale, self.offset, self.eps, self.extent)

    def _rule(self) -> PositionRule:
        return PositionRule(self.normalize, self.scale, self.offset, self.eps, self.extent)

    def _divisor_table(self, device: torch.device | None) -> Tensor:
        """The one home of the divisors ``Tensor[num_pos_feats]``, float32 on ``device``: each
        ``temperature^(2k / num_pos_feats)`` twice (sin, cos)."""
        return frequency_divisors(self.num_pos_feats, self.temperature, device=device, repeat=2)

    def _refresh_derived(self) -> None:
        """Rebuilds ``dim_t`` (float32, on its device) and empties the cache; see DerivedBuffers."""
        self._cache.clear()
        if not self.dim_t.is_meta:
            self.dim_t = self._divisor_table(self.dim_t.device)

    def _divisors(self, device: torch.device) -> Tensor:
        """``dim_t`` when it is float32 on ``device``, else the table built there (a module cast
        with ``.half()`` keeps float32 divisors: :class:`DerivedBuffers` rebuilds them)."""
        dim_t = self.dim_t
        if dim_t.device != device or dim_t.dtype != torch.float32 or dim_t.is_meta:
            dim_t = self._divisor_table(device)
        return dim_t


class PositionEmbeddingSine(SineEmbeddingBase):
    """DETR's sinusoidal position embedding for 1, 2 or 3 spatial axes, mask-aware.

    Each spatial axis gets ``num_pos_feats`` channels: positions are counted along the axis over
    valid cells (see :func:`cumulative_positions`), optionally normalised to ``[0, scale]``, and
    embedded with interleaved ``sin, cos`` at frequencies ``w_k = temperature^(-2k /
    num_pos_feats)``. The axis blocks are concatenated in tensor axis order (``D, H, W``; in 2D
    this is DETR's ``pos_y`` then ``pos_x``). In 2D it equals DETR's ``PositionEmbeddingSine``
    and transformers' ``DetrSinePositionEmbedding``; ``offset=-0.5`` gives Deformable-DETR /
    detrex / mmdet; ``temperature=20`` gives DINO's.

    Args:
        num_pos_feats (int): channels per spatial axis (positive, even). Default 64.
        temperature (float): ``T`` of the frequency ladder. Default 10000.
        normalize (bool): map positions to ``[0, scale]`` using each line's valid length.
        scale (float, optional): the normalised range; ``2 * pi`` when ``normalize`` and not
            given. Only valid with ``normalize=True``.
        offset (float): added to the 1-based count before normalising (Deformable-DETR: -0.5).
        eps (float): added to the denominator when normalising (DETR: 1e-6).
        extent (float, optional, keyword-only): with ``normalize``, the length mapped to
            ``scale``, one for every axis and item (in mm with ``spacing``, else in cells),
            instead of each line's own valid length: normalised positions then keep the
            physical proportions. Default None (DETR).
        cache_size (int): results kept per module (LRU), keyed on shape, device, dtype,
            parameters and the input's :class:`~vispos.Padding`: its boxes when rectangular
            (a batch, or a CPU mask found rectangular), the mask's content for other CPU
            masks (masks on an accelerator are not cached: comparing them would synchronise).
            0 disables the cache. Default 8. Setting ``module.cache_size`` later takes effect.
        cache_bytes (int, optional): byte budget of the cache (entries plus the mask copies
            they are keyed on); an entry larger than it is not stored. Default 8 MiB
            (``vispos._cache.DEFAULT_MAX_BYTES``); None: no byte bound.
        zero_copy (bool, keyword-only): opt in to shared results. False (default): every call
            returns a tensor of its own (a hit is copied out of the cache), so writing into one
            result, by any route, changes no other. True: a hit returns the cached tensor
            itself, and an unmasked map a broadcast view of one cached table; results of equal
            inputs then share storage and must be treated as read-only (an in-place write is
            detected and the entry rebuilt; a write through ``.data``, ``.numpy()`` or DLPack
            is not, and reaches every later result).

    Shape:
        - input: a :class:`NestedTensor` ``(B, C, *S)`` (or DETR's own ``NestedTensor``: any
          object with ``.tensors``, ``.mask`` and ``.decompose()``); a bool mask ``Tensor[B, *S]`` (True =
          padding); or a floating feature map ``Tensor[B, C, H, W]`` / ``Tensor[B, C, D, H, W]``
          meaning "no padding". ``S`` has 1 to 3 axes; a 1D feature map ``(B, C, L)`` goes in as
          ``NestedTensor(x, None)`` (bare, it could not be told from a float mask ``(B, H, W)``).
        - output: ``Tensor[B, n * num_pos_feats, *S]``, channels-first, ``n = len(S)``; float32
          unless ``forward(..., dtype=...)`` says otherwise (angles are computed in float32 in
          any case and cast once). A new, contiguous tensor owned by the caller, unless
          ``zero_copy=True`` (then an unmasked feature map gives a broadcast view over the batch).

    Physical units: with ``forward(x, spacing=s)`` (``Tensor[B, n]``, mm per cell along each
    axis, per item) a cell's count ``p`` along axis ``i`` becomes the length ``(p + offset) *
    s[b, i]``: its physical coordinate from the near edge of the item's first valid cell (the
    cell's far edge; its centre with ``offset=-0.5``). Two cells 5 mm apart are then as far
    apart along any axis, whatever the voxel size. With ``normalize`` a spacing needs
    ``extent``: the length is divided by one length ``E`` for all axes, ``(p + offset) * s / E *
    scale``, which keeps distances in millimetres. Without ``extent`` each line would be divided
    by its own valid length ``p_last * s[b, i]`` and the spacing would cancel (DETR's normalised
    positions are fractions of each line, with no unit): that call raises ``ValueError``. A spacing of ones gives the voxel numbers bit for bit on every path.

    Padding: cells in the padding get DETR's values (the count stops at the last valid cell).
    A line with no valid cell has count 0; with ``normalize`` and ``offset != 0`` that is
    ``offset / eps * scale`` (about -3e6 for Deformable-DETR), a finite but huge angle whose
    sin/cos depend on float32 rounding. Those cells are reproduced bit for bit from the peers
    and are meant to be masked, as DETR-family attention does.

    Well-defined results for degenerate inputs (tested in ``tests/test_bad_input.py``):

    - a fully padded item (every cell True) gets a finite embedding: counts are 0 everywhere,
      so without ``normalize`` every cell is ``sin 0, cos 0 = 0, 1``; with ``normalize`` it is
      the embedding of ``offset / eps * scale`` (0 for DETR's ``offset=0``). ``eps`` must be
      > 0 with ``normalize``, so no 0 / 0 can occur.
    - NaN or inf in a feature map or in ``NestedTensor.tensors`` does not reach the embedding:
      it depends only on the shape and the mask.
    - an empty batch or a zero-size spatial axis gives an empty tensor of the output shape.

    Raises:
        TypeError: a non-int ``num_pos_feats``; a non-bool mask (with a hint on how to convert);
            a 3-dim floating tensor (ambiguous, with a hint); an input of another type; a
            non-floating output ``dtype``.
        ValueError: odd or non-positive ``num_pos_feats``; ``scale`` without ``normalize``;
            non-positive ``temperature`` or ``scale``; negative ``eps``, or ``eps == 0`` with
            ``normalize``; an input of the wrong rank; an ``out`` buffer of another shape,
            dtype or device, or an expanded (stride-0) one; ``spacing`` with ``normalize`` and
            no ``extent``.

    Warns:
        UserWarning: a bare ``(B, H, W, c)`` map with ``c`` in 1, 3, 4 (a channels-last image?);
            an item with no valid cell (see ``forward``).

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020; Zhu et al.,
        Deformable DETR, ICLR 2021; Zhang et al., DINO, ICLR 2023 (temperature 20).
    """

    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def out_channels(self, num_axes: int) -> int:
        """``num_axes * num_pos_feats``: one block per spatial axis."""
        return num_axes * self.num_pos_feats

    def _embed_padding(
        self,
        padding: Padding,
        dtype: torch.dtype,
        host: bool,
        out: Tensor | None = None,
        spacing: Tensor | None = None,
    ) -> Tensor:
        """On CUDA one Triton kernel (:mod:`vispos.encodings._sine_op`). Elsewhere boxes and no
        padding: the separable line-table path (:func:`sincos_embed_lines`); any mask: DETR's
        cumulative counts, cell by cell (:meth:`_counts`)."""
        kind, spatial, device = padding.kind, padding.spatial, padding.device
        div = self._divisors(device)
        if _sine_op.takes_kernel(div):
            return _sine_op.embed(padding, self._rule(), div, dtype, host, out, spacing)
        if kind == "arbitrary" or (kind == "rectangular" and not host and not padding.at_origin):
            return self._counts(padding.mask, dtype, host, out, spacing)
        if kind == "none" and not host and spacing is None:  # sizes stay symbolic: broadcast arange
            positions = grid_positions(spatial, device, self._rule())
            table = sincos_embed(
                positions, self.num_pos_feats, shape=(1, *spatial), dtype=dtype, divisors=[div] * len(spatial)
            )
            return table if out is None else out.copy_(table)
        lines = line_table(padding, host, self._rule(), share_rows=True, spacing=spacing)
        return sincos_embed_lines(
            lines.lines, spatial, div, valid=lines.valid, host_spans=lines.spans,
            window=lines.window, rows=lines.rows, dtype=dtype, out=out,
        )

    def _counts(
        self, mask: Tensor, dtype: torch.dtype, host: bool, out: Tensor | None, spacing: Tensor | None = None
    ) -> Tensor:
        """Any mask: DETR's cumulative counts along every axis, embedded block by block (on CPU
        large blocks gather from their few distinct positions, :func:`distinct_positions`, when
        the positions are cells: a per-item spacing makes them the items' own)."""
        spatial, device, f = tuple(mask.shape[1:]), mask.device, self.num_pos_feats
        if out is None:
            out = torch.empty((mask.shape[0], len(spatial) * f, *spatial), dtype=dtype, device=device)
        div, rule = self._divisors(device), self._rule()
        # on CPU a gather from the distinct positions' table beats sin/cos per cell on large blocks
        gather = host and _tracing.host_side(device) and out[:, :f].numel() >= _GATHER_MIN and spacing is None
        host_valid = np.logical_not(mask.detach().numpy()) if gather else None
        valid = None
        for i, size in enumerate(spatial):
            found = distinct_positions(host_valid, i + 1, rule) if gather else None
            if found is not None:
                sincos_embed_indexed(found[0], found[1], div, out, i * f)
                continue
            if valid is None:
                valid = ~mask
            count = valid.cumsum(i + 1, dtype=torch.float32)
            s = None if spacing is None else spacing[:, i].reshape(-1, *([1] * len(spatial)))
            pos = rule(count, count.narrow(i + 1, size - 1, 1), spacing=s)
            _embed_axis(out, 1, i * f, f, "interleaved", pos, div)
        return out
