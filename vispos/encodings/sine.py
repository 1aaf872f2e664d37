"""DETR's sine position embedding, for 1, 2 or 3 spatial axes, mask-aware.

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

from .._cache import (
    DEFAULT_MAX_BYTES,
    CacheOwner,
    DerivedBuffers,
    TensorCache,
    check_max_bytes,
    expand_batch,
)
from .._checks import MAX_SPATIAL, check_bool, check_float_dtype, check_int, check_number
from .. import _sincos
from .._sincos import (
    _embed_axis,
    check_num_feats,
    check_out,
    check_temperature,
    frequency_divisors,
    sincos_embed,
    sincos_embed_indexed,
    sincos_embed_lines,
)
from .._tracing import tracing
from ..nested_tensor import NestedTensor, NestedTensorLike, parse_spatial_input
from ..padding import (
    check_mask,
    is_rectangular,
    matches_rectangle,
    rectangular_sizes,
    rectangular_valid,
)

# ``is_rectangular`` and ``rectangular_sizes`` live in :mod:`vispos.padding`; re-exported here
# under their old home for callers that import them from this module.
__all__ = ["PositionEmbeddingSine", "cumulative_positions", "is_rectangular", "rectangular_sizes"]

_KIND = {1: "sequences", 2: "images", 3: "volumes"}
_GATHER_MIN = 1 << 16  # elements of an axis block from which the masked path may gather

SineInput = Union[NestedTensor, NestedTensorLike, Tensor]
check_output_dtype = check_float_dtype  # old name, kept for callers


def cumulative_positions(
    mask: Tensor,
    *,
    normalize: bool = False,
    scale: float = 2 * math.pi,
    offset: float = 0.0,
    eps: float = 1e-6,
) -> list[Tensor]:
    """DETR's positions: a cumulative count of valid cells along every spatial axis.

    Along axis ``i`` the position of a cell is the number of valid cells up to and including it
    in its line (the first valid cell is 1; padding repeats the last count, or 0 before any valid
    cell). With ``normalize`` it becomes ``(p + offset) / (p_last + eps) * scale`` where
    ``p_last`` is the count at the line's end; otherwise ``p + offset``.

    Args:
        mask (Tensor[B, *S], bool): True marks padding.
        normalize, scale, offset, eps: as in :class:`PositionEmbeddingSine`.

    Returns:
        list of Tensor[B, *S], float32: one per spatial axis, in tensor axis order.

    Raises:
        TypeError: ``mask`` is not a bool tensor (with a hint on how to convert).

    References:
        DETR ``PositionEmbeddingSine.forward``; Deformable DETR for ``offset=-0.5``.
    """
    check_mask(mask)
    not_mask = ~mask
    out = []
    for axis in range(1, mask.dim()):
        count = not_mask.cumsum(axis, dtype=torch.float32)
        last = count.narrow(axis, count.shape[axis] - 1, 1)
        out.append(_detr_position(count, last, normalize, scale, offset, eps))
    return out


def _detr_position(
    count: Tensor,
    last: Tensor,
    normalize: bool,
    scale: float,
    offset: float,
    eps: float,
    denominator: Tensor | None = None,
) -> Tensor:
    """DETR's position from a 1-based valid count and the line's final count (float32 ops).

    Every path (masked, rectangular fast path, unmasked grid) goes through this one function so
    that all give bit-identical float32 values. ``denominator``, when given, is ``last + eps``
    already rounded to float32 (on the host, see :func:`_float32_lengths`).
    """
    if offset:  # counts are >= 0, so ``count + 0.0`` would be ``count`` bit for bit: skipped
        count = count + offset
    if not normalize:
        return count
    return count / (last + eps if denominator is None else denominator) * scale


def _float32_lengths(sizes, eps: float) -> list:
    """``[sizes, sizes + eps]`` with the sum rounded as torch rounds ``float32 + eps`` (both
    operands in float32, one IEEE addition), so that a host-side denominator is bit for bit the
    device's ``last + eps``."""
    eps32 = np.float32(eps)
    return [
        [list(map(float, item)) for item in sizes],
        [[float(np.float32(v) + eps32) for v in item] for item in sizes],
    ]


def _host_tensor(values: list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small tensor from host values, on ``device`` without a host synchronisation.

    On CUDA the values go through pinned memory and a non-blocking copy (a blocking copy from
    pageable memory would synchronise the stream).
    """
    if device.type == "cuda":
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, device=device)


def _shortest_window(values: Sequence) -> tuple[int, int]:
    """The shortest range ``[start, stop)`` of ``values`` that holds each distinct value."""
    need = len(set(values))
    seen: dict = {}
    best = (0, len(values))
    start = 0
    for stop, v in enumerate(values, 1):
        seen[v] = seen.get(v, 0) + 1
        while seen[values[start]] > 1:
            seen[values[start]] -= 1
            start += 1
        if len(seen) == need and stop - start < best[1] - best[0]:
            best = (start, stop)
    return best


def _capturing(device: torch.device) -> bool:
    """True while a CUDA graph is being captured on ``device``: host values must not be copied
    in then (a replay would read the pinned staging buffer again, long after it was reused), so
    sizes are read from the mask on the device instead."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _grid_positions(
    spatial: tuple[int, ...],
    device: torch.device,
    *,
    normalize: bool,
    scale: float,
    offset: float,
    eps: float,
) -> list[Tensor]:
    """The unmasked case of :func:`cumulative_positions` as broadcastable 1-D tables.

    Axis ``i`` gets ``arange(1, S_i + 1)`` shaped ``(1, .., S_i, .., 1)`` (rank ``1 + n``).
    """
    n = len(spatial)
    out = []
    for i, size in enumerate(spatial):
        count = torch.arange(1, size + 1, device=device, dtype=torch.float32)
        pos = _detr_position(count, count[-1:], normalize, scale, offset, eps)
        view = [1] * (n + 1)
        view[i + 1] = size
        out.append(pos.view(view))
    return out


class SineEmbeddingBase(CacheOwner, DerivedBuffers, nn.Module):
    """What every DETR-style sine embedding over :mod:`vispos._sincos` shares: the constructor's
    validation, the reading of the input (:func:`~vispos.nested_tensor.parse_spatial_input`),
    the output dtype check, empty inputs, the cache and the three paths (unmasked grid,
    rectangular fast path, any mask). A subclass says how positions become channels
    (:meth:`_embed`, :meth:`out_channels`) and, optionally, how many axes it takes
    (``n_spatial``, None = 1 to 3).

    Args:
        num_pos_feats, temperature, normalize, scale, offset, eps, cache_size, cache_bytes,
            zero_copy: see :class:`PositionEmbeddingSine`.

    Raises:
        TypeError: a non-int ``num_pos_feats`` / ``cache_size``; a non-bool ``normalize``;
            non-number ``scale`` / ``offset`` / ``eps``; a non-int ``cache_bytes``; a non-bool
            ``zero_copy``.
        ValueError: odd or non-positive ``num_pos_feats``; ``scale`` without ``normalize``;
            non-positive ``temperature`` or ``scale``; negative ``eps``, or ``eps == 0`` with
            ``normalize``; negative ``cache_size`` or ``cache_bytes``.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020.
    """

    n_spatial: int | None = None

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
    ) -> None:
        super().__init__()
        check_num_feats(num_pos_feats)
        check_temperature(temperature)
        check_bool(normalize, "normalize")
        if scale is not None and not normalize:
            raise ValueError(f"normalize should be True if scale is passed (got scale={scale}, normalize=False)")
        if scale is None:
            scale = 2 * math.pi
        check_number(scale, "scale", positive=True)
        check_number(offset, "offset")
        check_number(eps, "eps", nonnegative=True)
        if normalize and eps == 0:
            raise ValueError(
                "eps must be > 0 with normalize=True: a fully padded line is normalised by its "
                "valid count 0 + eps, so eps=0 would give NaN (DETR uses 1e-6)"
            )
        check_int(cache_size, "cache_size", minimum=0)
        check_bool(zero_copy, "zero_copy")
        self._cache = TensorCache(cache_size, check_max_bytes(cache_bytes, "cache_bytes"))
        self.zero_copy = zero_copy
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        self.scale = float(scale)
        self.offset = float(offset)
        self.eps = float(eps)
        self.register_buffer(
            "dim_t", frequency_divisors(num_pos_feats, temperature, repeat=2), persistent=False
        )
        self._dim_t_params = (num_pos_feats, temperature)

    # ------------------------------------------------------------------------------------ api
    def out_channels(self, n_axes: int) -> int:  # pragma: no cover - abstract
        """Channels of the output for an input with ``n_axes`` spatial axes."""
        raise NotImplementedError

    def forward(
        self, x: SineInput, dtype: torch.dtype | None = None, *, out: Tensor | None = None
    ) -> Tensor:
        """Embeds the positions of ``x``'s cells; see the class docstring for shapes.

        Args:
            x (NestedTensor | NestedTensorLike | Tensor[B, *S] bool | Tensor[B, C, *S] float):
                what to embed.
            dtype (torch.dtype, optional): output dtype (floating); float32 when not given.
                Angles are computed in float32 and rounded once to ``dtype``.
            out (Tensor[B, out_channels(n), *S], optional, keyword-only): a preallocated
                buffer of the output's shape, dtype (``dtype`` or float32) and device, written
                in place and returned (the cache is bypassed). With a ``NestedTensor`` or a
                feature map on CUDA this makes :class:`PositionEmbeddingSine`'s call capturable
                by a CUDA graph: no allocation, no host synchronisation.

        Returns:
            Tensor[B, out_channels(n), *S] in ``dtype`` (``out`` when given). An empty batch or
            a zero-size spatial axis gives an empty tensor of that shape.

        Raises:
            TypeError: ``x`` of another type; an integer mask; a non-floating ``dtype``; ``out``
                not a tensor.
            ValueError: ``x`` of the wrong rank; ``out`` of another shape, dtype or device, or
                requiring grad.
        """
        inp = parse_spatial_input(x)
        mask, spatial, batch, device = inp.mask, inp.spatial, inp.batch, inp.device
        out_dtype = torch.float32 if dtype is None else check_float_dtype(dtype)
        if self.n_spatial is not None and len(spatial) != self.n_spatial:
            raise ValueError(
                f"{type(self).__name__} embeds {_KIND[self.n_spatial]} ({self.n_spatial} spatial axes): a "
                f"NestedTensor (B, C, *S), a mask (B, *S) or a feature map (B, C, *S); got spatial "
                f"shape {spatial}"
            )
        channels = self.out_channels(len(spatial))
        if out is not None:
            check_out(out, (batch, channels, *spatial), out_dtype, torch.device(device))
        if batch == 0 or 0 in spatial:  # nothing to embed: a well-defined empty result
            if out is not None:
                return out
            return torch.zeros((batch, channels, *spatial), dtype=out_dtype, device=device)
        traced = tracing()
        if mask is None:
            if out is not None:
                return out.copy_(self._grid(spatial, device, out_dtype, traced).expand(out.shape))
            key = ("grid", spatial, device, out_dtype) + self._params()
            table, shared = self._cache.lookup(
                key, lambda: self._grid(spatial, device, out_dtype, traced)
            )
            return expand_batch(table, batch, shared=shared, zero_copy=self.zero_copy)
        if inp.rectangular and traced:
            # compilers and exporters: sizes read from the mask on the device, so the graph does
            # not depend on (and is not re-specialised for) the batch's host-side image_sizes
            return self._rectangular(mask, out_dtype, traced=True, out=out)
        if inp.rectangular:
            sizes_key = inp.host_sizes
            if out is not None:
                return self._rectangular(mask, out_dtype, sizes_key, traced=False, out=out)
            key = ("rect", tuple(mask.shape), sizes_key, device, out_dtype) + self._params()
            return self._cached(
                key, None, lambda: self._rectangular(mask, out_dtype, sizes_key, traced=False)
            )
        if _sincos.host_side(mask.device) and not traced:
            # on the host the check is one pass over the mask, and no synchronisation
            if out is not None:
                return self._masked(mask, out_dtype, check=True, traced=False, out=out)
            key = ("mask", tuple(mask.shape), device, out_dtype) + self._params()
            return self._cached(
                key, mask, lambda: self._masked(mask, out_dtype, check=True, traced=False)
            )
        return self._masked(mask, out_dtype, check=False, traced=traced, out=out)

    @property
    def cache_size(self) -> int:
        """int: entries kept; assigning evicts at once (0 empties and disables the cache)."""
        return self._cache.maxsize

    @cache_size.setter
    def cache_size(self, value: int) -> None:
        check_int(value, "cache_size", minimum=0)
        self._cache.maxsize = value

    def extra_repr(self) -> str:
        text = (
            f"num_pos_feats={self.num_pos_feats}, temperature={self.temperature}, "
            f"normalize={self.normalize}, scale={self.scale}, offset={self.offset}, eps={self.eps}, "
            f"cache_size={self.cache_size}"
        )
        if self.cache_bytes != DEFAULT_MAX_BYTES:
            text += f", cache_bytes={self.cache_bytes}"
        return text + (", zero_copy=True" if self.zero_copy else "")

    # -------------------------------------------------------------------------------- helpers
    def _params(self) -> tuple:
        return (self.num_pos_feats, self.temperature, self.normalize, self.scale, self.offset, self.eps)

    def _position(self, count: Tensor, last: Tensor) -> Tensor:
        return _detr_position(count, last, self.normalize, self.scale, self.offset, self.eps)

    def _refresh_derived(self) -> None:
        """Rebuilds ``dim_t`` (float32, on its device) and empties the cache; see DerivedBuffers."""
        self._cache.clear()
        if not self.dim_t.is_meta:
            self.dim_t = frequency_divisors(self.num_pos_feats, self.temperature, device=self.dim_t.device, repeat=2)
        self._dim_t_params = (self.num_pos_feats, self.temperature)

    def _divisors(self, device: torch.device) -> list[Tensor]:
        dim_t = self.dim_t
        stale = getattr(self, "_dim_t_params", None) != (self.num_pos_feats, self.temperature)
        if stale or dim_t.device != device or dim_t.dtype != torch.float32 or dim_t.is_meta:
            # another device, a cast module, or num_pos_feats / temperature changed after
            # construction: never use a table that does not match the parameters
            dim_t = frequency_divisors(self.num_pos_feats, self.temperature, device=device, repeat=2)
        return [dim_t] * MAX_SPATIAL

    def _embed(self, positions: list[Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:  # pragma: no cover - abstract
        """Channels-first embedding ``Tensor[shape[0], C, *shape[1:]]`` of per-axis positions
        (float32, broadcastable to ``shape``)."""
        raise NotImplementedError

    @staticmethod
    def _written(result: Tensor, out: Tensor | None) -> Tensor:
        return result if out is None else out.copy_(result)

    def _grid(
        self, spatial: tuple[int, ...], device: torch.device, dtype: torch.dtype, traced: bool = True
    ) -> Tensor:
        """``Tensor[1, C, *S]``: no padding (broadcast positions, sizes stay symbolic)."""
        positions = _grid_positions(
            spatial, device, normalize=self.normalize, scale=self.scale, offset=self.offset, eps=self.eps
        )
        return self._embed(positions, (1, *spatial), dtype, device)

    def _rectangular(
        self,
        mask: Tensor,
        dtype: torch.dtype,
        host_sizes: tuple | None = None,
        sizes: Tensor | None = None,
        out: Tensor | None = None,
        traced: bool | None = None,
    ) -> Tensor:
        """Rectangular padding: each axis' positions from the per-item sizes (no cumulative
        sum), equal bit for bit to :func:`cumulative_positions` of the mask, then :meth:`_embed`.
        :class:`PositionEmbeddingSine` replaces this with the separable line-table path."""
        spatial = tuple(mask.shape[1:])
        batch, n = mask.shape[0], len(spatial)
        if sizes is None:
            sizes = rectangular_sizes(mask)
        valid = rectangular_valid(sizes, spatial)
        zero = torch.zeros((), device=mask.device, dtype=torch.float32)
        positions = []
        for i, size in enumerate(spatial):
            count = torch.arange(1, size + 1, device=mask.device, dtype=torch.float32)
            last = sizes[:, i : i + 1].to(torch.float32)
            view = [batch] + [1] * n
            view[1 + i] = size
            line = self._position(torch.minimum(count, last), last).view(view)
            inside = None
            for j in range(n):
                if j != i:
                    v = [batch] + [1] * n
                    v[1 + j] = spatial[j]
                    c = valid[j].view(v)
                    inside = c if inside is None else inside & c
            positions.append(line if inside is None else torch.where(inside, line, self._position(zero, zero)))
        return self._written(self._embed(positions, tuple(mask.shape), dtype, mask.device), out)

    def _masked(
        self,
        mask: Tensor,
        dtype: torch.dtype,
        check: bool,
        traced: bool | None = None,
        out: Tensor | None = None,
    ) -> Tensor:
        """Any mask: the rectangular path when ``check`` finds the padding rectangular, else
        DETR's cumulative counts (:func:`cumulative_positions`) and :meth:`_embed`."""
        if check:
            sizes = rectangular_sizes(mask)
            if matches_rectangle(mask, sizes):
                host = tuple(map(tuple, sizes.tolist()))
                return self._rectangular(mask, dtype, host, sizes, out=out, traced=traced)
        positions = cumulative_positions(
            mask, normalize=self.normalize, scale=self.scale, offset=self.offset, eps=self.eps
        )
        return self._written(self._embed(positions, tuple(mask.shape), dtype, mask.device), out)

    def _cached(self, key: tuple, mask: Tensor | None, compute) -> Tensor:
        return self._cache.get(key, compute, content=mask, copy=not self.zero_copy)


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
        cache_size (int): results kept per module (LRU), keyed on shape, device, dtype,
            parameters, the ``NestedTensor``'s sizes and (CPU masks) the mask's content. 0
            disables the cache. Default 8. Setting ``module.cache_size`` later takes effect.
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
          padding); or a floating feature map ``Tensor[B, C, *S]`` meaning "no padding". ``S`` has
          1 to 3 axes.
        - output: ``Tensor[B, n * num_pos_feats, *S]``, channels-first, ``n = len(S)``; float32
          unless ``forward(..., dtype=...)`` says otherwise (angles are computed in float32 in
          any case and cast once). A new, contiguous tensor owned by the caller, unless
          ``zero_copy=True`` (then an unmasked feature map gives a broadcast view over the batch).

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
            an input of another type; a non-floating output ``dtype``.
        ValueError: odd or non-positive ``num_pos_feats``; ``scale`` without ``normalize``;
            non-positive ``temperature`` or ``scale``; negative ``eps``, or ``eps == 0`` with
            ``normalize``; an input of the wrong rank.

    References:
        Carion et al., End-to-End Object Detection with Transformers, ECCV 2020; Zhu et al.,
        Deformable DETR, ICLR 2021; Zhang et al., DINO, ICLR 2023 (temperature 20).
    """

    def out_channels(self, n_axes: int) -> int:
        """``n_axes * num_pos_feats``: one block per spatial axis."""
        return n_axes * self.num_pos_feats

    def _embed(self, positions: list[Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        return sincos_embed(
            positions, self.num_pos_feats, shape=shape, dtype=dtype, divisors=self._divisors(device)
        )

    def _grid(
        self, spatial: tuple[int, ...], device: torch.device, dtype: torch.dtype, traced: bool = True
    ) -> Tensor:
        """``Tensor[1, n * F, *S]``: no padding. Eager: one item of full size through the line
        table; traced: broadcast ``arange`` positions (sizes stay symbolic, nothing is baked)."""
        if not traced and not _capturing(device):
            return self._lines(spatial, device, dtype, (spatial,), None, None, False)
        return super()._grid(spatial, device, dtype, traced)

    def _rectangular(
        self,
        mask: Tensor,
        dtype: torch.dtype,
        host_sizes: tuple | None = None,
        sizes: Tensor | None = None,
        out: Tensor | None = None,
        traced: bool | None = None,
    ) -> Tensor:
        """Fast path: rectangular padding is separable, see :func:`sincos_embed_lines`.

        Every axis' lines come from one table ``[B, n, max S + 1]`` built from the sizes
        (column 0 the padding-only line: count 0 over a valid length 0, DETR's value there).
        """
        if traced is None:
            traced = tracing()
        if _capturing(mask.device):  # a replay sees other sizes: nothing from the host
            host_sizes = None
        if sizes is None and (host_sizes is None or traced):
            sizes = rectangular_sizes(mask)
        return self._lines(tuple(mask.shape[1:]), mask.device, dtype, host_sizes, sizes, out, traced)

    def _lines(
        self,
        spatial: tuple[int, ...],
        device: torch.device,
        dtype: torch.dtype,
        host_sizes: tuple | None,
        sizes: Tensor | None,
        out: Tensor | None,
        traced: bool,
    ) -> Tensor:
        """The line table of every axis from the sizes (``sizes`` on the device, else
        ``host_sizes``), embedded by :func:`sincos_embed_lines`."""
        rows = window = None
        if sizes is None:
            items = host_sizes
            if len(spatial) == 1:  # 1-D: items of one length share their line (the whole row)
                start, stop = _shortest_window(host_sizes)
                if stop - start < len(host_sizes):
                    first: dict = {}
                    for k in range(start, stop):
                        first.setdefault(host_sizes[k], k - start)
                    outside = [first[s] for k, s in enumerate(host_sizes) if not start <= k < stop]
                    rows = _host_tensor(outside, torch.int64, device)
                    items, window = host_sizes[start:stop], (start, stop)
            denominator = None
            if self.normalize and not self.offset:  # ``length + eps`` from the host: one op less
                both = _host_tensor(_float32_lengths(items, self.eps), torch.float32, device)
                sizes_f, denominator = both[0], both[1].unsqueeze(-1)
            else:
                sizes_f = _host_tensor(items, torch.float32, device)
        else:
            sizes_f, denominator = sizes.to(torch.float32), None
        count = torch.arange(max(spatial) + 1, device=device, dtype=torch.float32)
        last = sizes_f.unsqueeze(-1)  # [B, n, 1]
        capped = torch.minimum(count, last)  # DETR's count: 1-based, stopped at the last valid cell
        if self.normalize and self.offset:
            # the padding-only column (count 0) has a valid length of 0; with offset 0 its
            # position is 0 over any length, so the item's own length gives the same bits
            lines = self._position(capped, last * count.clamp(max=1))
        else:
            lines = _detr_position(
                capped, last, self.normalize, self.scale, self.offset, self.eps, denominator
            )
        valid = None
        if host_sizes is None or traced or not _sincos.host_side(device):
            valid = count[1:] <= last  # [B, n, max S]: cell c lies within the item
        return sincos_embed_lines(
            lines, spatial, self._divisors(device)[0], valid=valid, host_sizes=host_sizes,
            window=window, rows=rows, dtype=dtype, out=out, traced=traced,
        )

    def _masked(
        self,
        mask: Tensor,
        dtype: torch.dtype,
        check: bool,
        traced: bool | None = None,
        out: Tensor | None = None,
    ) -> Tensor:
        """Any mask: the rectangular fast path when ``check`` finds the padding rectangular,
        else DETR's cumulative counts, cell by cell (see :func:`cumulative_positions`)."""
        if traced is None:
            traced = tracing()
        if check:
            sizes = rectangular_sizes(mask)
            if matches_rectangle(mask, sizes):
                host = tuple(map(tuple, sizes.tolist()))
                return self._rectangular(mask, dtype, host, traced=traced, out=out)
        spatial = tuple(mask.shape[1:])
        f = self.num_pos_feats
        device = mask.device
        shape = (mask.shape[0], len(spatial) * f, *spatial)
        if out is None:
            out = torch.empty(shape, dtype=dtype, device=device)
        div = self._divisors(device)[0]
        valid = ~mask
        # a gather from a table of the distinct positions beats sin/cos per cell on CPU once
        # the block is large (and the table small, checked below); small maps take fewer ops
        gather = not traced and _sincos.host_side(device) and out[:, :f].numel() >= _GATHER_MIN
        for i, size in enumerate(spatial):
            axis = i + 1
            if gather and self._gathered(valid, axis, size, div, out, i * f, dtype):
                continue
            count = valid.cumsum(axis, dtype=torch.float32)
            pos = self._position(count, count.narrow(axis, size - 1, 1))
            _embed_axis(out, 1, i * f, f, "interleaved", pos, div, traced=traced)
        return out

    def _gathered(
        self, valid: Tensor, axis: int, size: int, div: Tensor, out: Tensor, start: int, dtype
    ) -> bool:
        """Writes one axis block by gathering from the distinct (count, valid length) pairs;
        False (nothing written) when there are too many of them to pay off."""
        count = valid.cumsum(axis)  # int64, 1-based
        cells = count.numel()
        if self.normalize:  # the position depends on the count and on the line's valid length
            last = count.narrow(axis, size - 1, 1)
            lengths, inverse = torch.unique(last, return_inverse=True)
            if 4 * lengths.numel() * (size + 1) > cells:
                return False
            index = inverse * (size + 1) + count
            counts = torch.arange(size + 1, device=valid.device, dtype=torch.float32)
            values = self._position(counts, lengths.to(torch.float32).unsqueeze(1))
        else:
            if 4 * (size + 1) > cells:
                return False
            index = count
            values = self._position(torch.arange(size + 1, device=valid.device, dtype=torch.float32), None)
        sincos_embed_indexed(values, index, div, out, start, traced=False)
        return True
