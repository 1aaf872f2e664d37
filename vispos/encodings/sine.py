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
from .._cache import DerivedBuffers, TensorCache, tracing
from ..nested_tensor import NestedTensor, _check_mask, parse_spatial_input

__all__ = ["PositionEmbeddingSine", "cumulative_positions", "is_rectangular", "rectangular_sizes"]

_MAX_SPATIAL = 3
_GATHER_MIN = 1 << 16  # elements of an axis block from which the masked path may gather

SineInput = Union[NestedTensor, Tensor]


def check_output_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    """Validates an output dtype: a floating ``torch.dtype``. Returns it.

    Raises:
        TypeError: not a ``torch.dtype`` (e.g. the string ``"float16"``), or not floating (an
            integer output would hold truncated sines).
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{name} must be a floating torch.dtype such as torch.float16, got {dtype!r} "
            f"({type(dtype).__name__})"
        )
    if not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch.dtype (sin/cos values), got {dtype}")
    return dtype


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
    _check_mask(mask)
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


def rectangular_sizes(mask: Tensor) -> Tensor:
    """Per-item valid sizes of an origin-anchored rectangular padding mask, on its device.

    Reads the line through the origin along every axis (no host synchronisation).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        Tensor[B, n], int64: valid cells along each axis (0 for a fully padded item). Only
        meaningful for rectangular masks (see :func:`is_rectangular`); the caller validates.

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list`` (items at the origin).
    """
    valid = ~mask
    sizes = []
    for axis in range(1, mask.dim()):
        line = valid
        for other in range(mask.dim() - 1, 0, -1):
            if other != axis:
                line = line.select(other, 0)
        sizes.append(line.sum(1))
    return torch.stack(sizes, 1)


def _rectangular_valid(sizes: Tensor, spatial: tuple[int, ...]) -> list[Tensor]:
    """Per axis, ``(c < size)`` as a bool ``(B, S_i)`` table."""
    return [
        torch.arange(s, device=sizes.device) < sizes[:, i : i + 1] for i, s in enumerate(spatial)
    ]


def is_rectangular(mask: Tensor) -> bool:
    """True when ``mask`` is origin-anchored rectangular padding (reads the mask on the host).

    Args:
        mask (Tensor[B, *S], bool): True marks padding.

    Returns:
        bool: the mask equals "item ``b`` valid on ``[0, size_b)`` along every axis".

    Raises:
        TypeError: ``mask`` is not a bool tensor.

    References:
        The padding of DETR's ``nested_tensor_from_tensor_list``; the fast path it enables is
        :func:`vispos._sincos.sincos_embed_lines`.
    """
    _check_mask(mask)
    return _matches_rectangle(mask, rectangular_sizes(mask))


def _matches_rectangle(mask: Tensor, sizes: Tensor) -> bool:
    spatial = tuple(mask.shape[1:])
    along = _rectangular_valid(sizes, spatial)
    n = len(spatial)
    valid = None
    for i, a in enumerate(along):
        view = [a.shape[0]] + [1] * n
        view[1 + i] = spatial[i]
        a = a.view(view)
        valid = a if valid is None else valid & a
    return bool(torch.equal(~mask, valid.expand_as(mask)))


class PositionEmbeddingSine(DerivedBuffers, nn.Module):
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

    Shape:
        - input: a :class:`NestedTensor` ``(B, C, *S)``; a bool mask ``Tensor[B, *S]`` (True =
          padding); or a floating feature map ``Tensor[B, C, *S]`` meaning "no padding". ``S`` has
          1 to 3 axes.
        - output: ``Tensor[B, n * num_pos_feats, *S]``, channels-first, ``n = len(S)``; float32
          unless ``forward(..., dtype=...)`` says otherwise (angles are computed in float32 in
          any case and cast once). For an unmasked feature map the result is a broadcast
          (expanded, read-only) view over the batch; call ``.contiguous()`` for a writable copy.

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

    def __init__(
        self,
        num_pos_feats: int = 64,
        temperature: float = 10000,
        normalize: bool = False,
        scale: float | None = None,
        offset: float = 0.0,
        eps: float = 1e-6,
        cache_size: int = 8,
    ) -> None:
        super().__init__()
        check_num_feats(num_pos_feats)
        check_temperature(temperature)
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {normalize!r}")
        if scale is not None and not normalize:
            raise ValueError(f"normalize should be True if scale is passed (got scale={scale}, normalize=False)")
        if scale is None:
            scale = 2 * math.pi
        for name, value in (("scale", scale), ("offset", offset), ("eps", eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"{name} must be a finite number, got {value!r}")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if normalize and eps == 0:
            raise ValueError(
                "eps must be > 0 with normalize=True: a fully padded line is normalised by its "
                "valid count 0 + eps, so eps=0 would give NaN (DETR uses 1e-6)"
            )
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got {cache_size!r}")
        self.cache_size = cache_size
        self._cache = TensorCache(cache_size)
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
    def forward(
        self, x: SineInput, dtype: torch.dtype | None = None, *, out: Tensor | None = None
    ) -> Tensor:
        """Embeds the positions of ``x``'s cells; see the class docstring for shapes.

        Args:
            x (NestedTensor | Tensor[B, *S] bool | Tensor[B, C, *S] float): what to embed.
            dtype (torch.dtype, optional): output dtype (floating); float32 when not given.
                Angles are computed in float32 and rounded once to ``dtype``.
            out (Tensor[B, n * num_pos_feats, *S], optional, keyword-only): a preallocated
                buffer of the output's shape, dtype (``dtype`` or float32) and device, written
                in place and returned (the cache is bypassed). With a ``NestedTensor`` or a
                feature map on CUDA this makes the call capturable by a CUDA graph: no
                allocation, no host synchronisation.

        Returns:
            Tensor[B, n * num_pos_feats, *S] in ``dtype`` (``out`` when given). An empty batch
            or a zero-size spatial axis gives an empty tensor of that shape.

        Raises:
            TypeError: ``x`` of another type; an integer mask; a non-floating ``dtype``; ``out``
                not a tensor.
            ValueError: ``x`` of the wrong rank; ``out`` of another shape, dtype or device, or
                requiring grad.
        """
        mask, spatial, batch, device = parse_spatial_input(x)
        out_dtype = torch.float32 if dtype is None else check_output_dtype(dtype)
        if out is not None:
            shape = (batch, len(spatial) * self.num_pos_feats, *spatial)
            check_out(out, shape, out_dtype, torch.device(device))
        if batch == 0 or 0 in spatial:  # nothing to embed: a well-defined empty result
            channels = len(spatial) * self.num_pos_feats
            if out is not None:
                return out
            return torch.zeros((batch, channels, *spatial), dtype=out_dtype, device=device)
        traced = tracing()
        if mask is None:
            if out is not None:
                return out.copy_(self._grid(spatial, device, out_dtype, traced).expand(out.shape))
            key = ("grid", spatial, device, out_dtype) + self._params()
            table = self._cached(key, None, lambda: self._grid(spatial, device, out_dtype, traced))
            return table.expand(batch, *table.shape[1:])
        rectangular = isinstance(x, NestedTensor) and x.rectangular
        if rectangular and traced:
            # compilers and exporters: sizes read from the mask on the device, so the graph does
            # not depend on (and is not re-specialised for) the batch's host-side image_sizes
            return self._rectangular(mask, out_dtype, traced=True, out=out)
        if rectangular:
            sizes_key = tuple(x.image_sizes)
            if out is not None:
                return self._rectangular(mask, out_dtype, sizes_key, traced=False, out=out)
            key = ("rect", tuple(mask.shape), sizes_key, device, out_dtype) + self._params()
            return self._cached(
                key, None, lambda: self._rectangular(mask, out_dtype, sizes_key, traced=False)
            )
        key = ("mask", tuple(mask.shape), device, out_dtype) + self._params()
        if _sincos.host_side(mask.device) and not traced:
            # on the host the check is one pass over the mask, and no synchronisation
            if out is not None:
                return self._masked(mask, out_dtype, check=True, traced=False, out=out)
            return self._cached(
                key, mask, lambda: self._masked(mask, out_dtype, check=True, traced=False)
            )
        return self._masked(mask, out_dtype, check=False, traced=traced, out=out)

    def clear_cache(self) -> None:
        """Drops every cached embedding."""
        self._cache.clear()

    def extra_repr(self) -> str:
        return (
            f"num_pos_feats={self.num_pos_feats}, temperature={self.temperature}, "
            f"normalize={self.normalize}, scale={self.scale}, offset={self.offset}, eps={self.eps}, "
            f"cache_size={self.cache_size}"
        )

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
        return [dim_t] * _MAX_SPATIAL

    def _grid(
        self, spatial: tuple[int, ...], device: torch.device, dtype: torch.dtype, traced: bool = True
    ) -> Tensor:
        """``Tensor[1, n * F, *S]``: no padding. Eager: one item of full size through the line
        table; traced: broadcast ``arange`` positions (sizes stay symbolic, nothing is baked)."""
        if not traced and not _capturing(device):
            return self._lines(spatial, device, dtype, (spatial,), None, None, False)
        positions = _grid_positions(
            spatial, device, normalize=self.normalize, scale=self.scale, offset=self.offset, eps=self.eps
        )
        return sincos_embed(
            positions, self.num_pos_feats, shape=(1, *spatial), dtype=dtype,
            divisors=self._divisors(device),
        )

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
            if _matches_rectangle(mask, sizes):
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

    def _cached(self, key: tuple, mask: Tensor | None, compute) -> Tensor:
        return self._cache.get(key, compute, content=mask)
