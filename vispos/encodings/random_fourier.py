"""Random Fourier position features (SAM, SAM 2, MONAI): one Gaussian projection of N-D positions.

A position ``u`` (``n`` coordinates) becomes ``[sin(2 pi u G), cos(2 pi u G)]`` for a fixed random
matrix ``G`` of shape ``(n, K)``: ``2K`` channels, sines first. Unlike the sine family the
projection mixes the axes (every frequency is a direction), so the table is not a product of
per-axis tables and isotropic in the plane: the similarity of two cells depends on their
offset, not on the axes it runs along. The projection is
:func:`vispos.encodings._fourier.fourier_features`; positions of a padded batch come from
:func:`~vispos._positions.item_boxes`.

The angles are ``coords @ G`` as one ``torch.mm`` over ``(cells, n)`` coordinates, the
orientation SAM, transformers and MONAI use, written straight into the output's sine slots:
the same kernel, so the same bits. They are float32 under ``torch.autocast`` too (the product
runs with autocast off), with or without grad, compiled or exported.

References:
    Tancik et al., Fourier Features Let Networks Learn High Frequency Functions in Low
    Dimensional Domains, NeurIPS 2020; Kirillov et al., Segment Anything, ICCV 2023
    (``modeling/prompt_encoder.py``, ``PositionEmbeddingRandom``); Ravi et al., SAM 2, 2024;
    MONAI ``networks/blocks/pos_embed_utils.py`` (``build_fourier_position_embedding``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .. import _deprecation, _tracing
from .._checks import (
    MAX_SPATIAL, as_int, check_bool, check_choice, check_float_dtype, check_int, check_number, check_output_fits,
    check_sizes, describe,
)
from .._positions import item_boxes
from ..nested_tensor import float_mask_hint, parse_spatial_input
from ._fourier import check_finite_matrix, check_scale, fourier_features
from .sine import _check_spacing

__all__ = ["PositionEmbeddingRandom", "SamPositionalEmbedding", "fourier_features"]

_FRAMES = ("canvas", "item")
_ORDERS = ("xy", "ij")


class PositionEmbeddingRandom(nn.Module):
    """SAM's random Fourier position encoding, for 1 to 3 axes, mask-aware and in millimetres.

    A point is normalised to ``c`` in ``[0, 1]`` per axis, mapped to ``u = lo + c (hi - lo)``
    (``coord_range``; SAM: ``2c - 1``), and embedded as ``[sin(2 pi u G), cos(2 pi u G)]`` with the
    Gaussian matrix ``G = scale * randn(num_axes, num_pos_feats)`` (drawn as SAM draws it: the
    same seed gives SAM's matrix). The buffer keeps SAM's name, so SAM's ``state_dict`` (the
    prompt encoder's ``pe_layer``) loads as it is. A cell ``i`` of an axis of length ``L`` sits
    at ``c = (i + 0.5) / L`` (its centre, SAM) or, with ``align_corners``, ``c = i / (L - 1)``
    (MONAI's ``linspace(0, 1, L)``; 0 when ``L = 1``).

    Args:
        num_pos_feats (int): ``K``, the number of random frequencies; the output has ``2K``
            channels. Default 64 (SAM's default; SAM builds ``embed_dim // 2``).
        scale (float or sequence of num_axes floats, optional): standard deviation of ``G``;
            None means 1.0 (SAM). A sequence scales each axis' row (MONAI's anisotropic
            ``scales``). Must be > 0.
        num_axes (int, keyword-only): spatial axes, 1 to 3. Default 2.
        frame (str, keyword-only): where a padded batch's positions are measured from.
            ``"canvas"`` (default): the whole padded grid, as SAM (its pretrained weights expect
            a fixed 1024-pixel canvas; the mask is not read). ``"item"``: each item's own box
            (the bounding box of its valid cells for a mask with holes), from its own first
            valid cell, so an item in a batch gets what it gets alone (any padding side, e.g.
            MONAI's symmetric padding).
        coord_order (str, keyword-only): the order of the coordinates in ``G``'s rows and in
            points: ``"xy"`` (default, SAM): the last tensor axis first, ``(x, y[, z]) = (W, H[,
            D])``; ``"ij"``: tensor axis order (MONAI, SAM-Med3D).
        align_corners (bool, keyword-only): cell positions ``i / (L - 1)`` instead of centres.
            Default False.
        coord_range (tuple of 2 floats, keyword-only): ``(lo, hi)``, the interval ``[0, 1]`` is
            mapped to before the projection. Default ``(-1.0, 1.0)`` (SAM); MONAI uses
            ``(0.0, 1.0)``.
        extent (float, optional, keyword-only): one length for every axis (in mm with
            ``spacing``, else in cells) that maps to ``c = 1``, instead of each axis' own
            length: positions keep their physical proportions. Default None.
        generator (torch.Generator, optional, keyword-only): for the draw of ``G``.
        trainable (bool, optional, keyword-only): hold ``G`` as a trainable ``nn.Parameter``
            (transformers' ``SamModel`` trains its matrix) instead of a buffer (SAM, SAM 2). The
            state-dict key is the same either way. Default None: this class' own kind (a buffer
            here, a parameter for :class:`SamPositionalEmbedding`).

    Forms of :meth:`forward`:

    - ``forward(size)`` with ``size`` a sequence of ``num_axes`` ints (one int, a NumPy integer
      or a 0-d integer tensor: the same for every axis): SAM's dense grid, ``Tensor[2K,
      *size]``, float32 (a channels-first view of a channel-last table, as SAM's).
    - ``forward(x)`` with a padded batch: a :class:`~vispos.NestedTensor` ``(B, C, *S)`` (or
      DETR's), its :class:`~vispos.Padding`, a bool mask ``Tensor[B, *S]`` (True = padding) or a
      feature map ``Tensor[B, C, *S]`` (no padding): ``Tensor[B, 2K, *S]``, channels-first,
      channel-last in memory (``flatten(2).transpose(1, 2)`` is then a free view).

    :meth:`forward_with_coords` embeds points given in pixels (SAM's prompts).

    Physical units: ``forward(x, spacing=s)`` (``Tensor[B, n]``, mm per cell along each axis in
    the tensor's spatial axis order, per item) places cell ``i`` at ``(i - start + 0.5) * s``
    mm from its origin (``(i - start) * s`` with ``align_corners``) and, with ``extent=E``, at
    ``c = (i - start + 0.5) * s / E``: one length for every axis, so anisotropic voxels get
    isotropic frequencies in millimetres. Without ``extent`` positions are fractions of each
    axis' own extent and the spacing cancels (it is not used); a spacing of ones gives the
    cell numbers bit for bit in either case, as for :class:`~vispos.PositionEmbeddingSine`.

    Padding: padded cells get the embedding of their position continued past the item's box
    (``c < 0`` before it, ``c > 1`` after it), with ``frame="canvas"`` SAM's own values.
    They are finite and meant to be masked. An item without a valid cell is placed as one of
    length 1.

    Raises:
        TypeError: a non-int ``num_pos_feats`` / ``num_axes``; non-number ``scale`` / ``extent``
            / ``coord_range`` entries; ``frame`` / ``coord_order`` not a str; a non-bool
            ``align_corners`` / ``trainable``; an input of another type; a non-bool mask; a
            non-floating ``dtype`` (integer, bool or a string) or ``spacing``.
        ValueError: non-positive ``num_pos_feats`` / ``scale`` / ``extent``; a ``scale`` beyond
            float32 (or one whose draw overflows it), or a NumPy ``longdouble`` a Python float
            cannot hold; ``num_axes`` not 1 to 3; unknown ``frame`` / ``coord_order``;
            ``coord_range`` not two finite numbers ``lo < hi``; ``size`` of another length; an
            input with another number of spatial axes; ``spacing`` not ``(B, n)`` or not > 0.

    References:
        Tancik et al., Fourier Features Let Networks Learn High Frequency Functions in Low
        Dimensional Domains, NeurIPS 2020; Kirillov et al., Segment Anything, ICCV 2023
        (``PositionEmbeddingRandom``); MONAI ``build_fourier_position_embedding``.
    """

    _matrix_name = "positional_encoding_gaussian_matrix"
    _trainable = False  # SAM and SAM 2 buffer their matrix

    @_deprecation.renamed_kwargs(normalize="frame")
    def __init__(
        self,
        num_pos_feats: int = 64,
        scale: float | Sequence[float] | None = None,
        *,
        num_axes: int = 2,
        frame: str = "canvas",
        coord_order: str = "xy",
        align_corners: bool = False,
        coord_range: tuple[float, float] = (-1.0, 1.0),
        extent: float | None = None,
        generator: torch.Generator | None = None,
        trainable: bool | None = None,
    ) -> None:
        super().__init__()
        num_pos_feats = check_int(num_pos_feats, "num_pos_feats", minimum=1)
        num_axes = check_int(num_axes, "num_axes", minimum=1)
        if num_axes > MAX_SPATIAL:
            raise ValueError(f"num_axes must be 1 to {MAX_SPATIAL}, got {num_axes}")
        scale = check_scale(scale, num_axes)
        check_choice(frame, _FRAMES, "frame")
        check_choice(coord_order, _ORDERS, "coord_order")
        align_corners = check_bool(align_corners, "align_corners")
        if check_bool(trainable, "trainable", optional=True) is None:
            trainable = self._trainable
        if isinstance(coord_range, (str, bytes)) or not isinstance(coord_range, Sequence) or len(coord_range) != 2:
            raise (TypeError if not isinstance(coord_range, Sequence) else ValueError)(
                f"coord_range must be a pair (lo, hi), got {describe(coord_range)}"
            )
        lo, hi = (float(check_number(v, "coord_range")) for v in coord_range)
        if not lo < hi:
            raise ValueError(f"coord_range must have lo < hi, got {(lo, hi)}")
        if extent is not None:
            extent = float(check_number(extent, "extent", positive=True))
        self.num_pos_feats, self.scale, self.num_axes = num_pos_feats, scale, num_axes
        self.frame, self.coord_order, self.align_corners = frame, coord_order, align_corners
        self.coord_range, self.extent = (lo, hi), extent
        gaussian = torch.randn((num_axes, num_pos_feats), generator=generator)
        if isinstance(scale, tuple):
            gaussian = torch.tensor(scale, dtype=torch.float32).unsqueeze(1) * gaussian
        else:
            gaussian = scale * gaussian  # SAM: ``scale * torch.randn((2, num_pos_feats))``
        self._set_matrix(check_finite_matrix(gaussian, scale), trainable)

    # ------------------------------------------------------------------------------------ api
    @classmethod
    def from_module(cls, module: nn.Module, **kwargs) -> "PositionEmbeddingRandom":
        """A copy of a peer's module: its Gaussian matrix (``positional_encoding_gaussian_matrix``
        of segment_anything, ``positional_embedding`` of transformers' ``SamPositionalEmbedding``
        / ``Sam2PositionalEmbedding``, or a vispos one) and, when it has one, its ``scale``.

        The matrix keeps its kind: a peer's ``nn.Parameter`` (transformers' SAM) stays a
        parameter with the peer's ``requires_grad``, a buffer (segment_anything, SAM 2) stays a
        buffer, unless ``trainable`` is given.

        Args:
            module (nn.Module): the peer. kwargs: other constructor arguments.

        Returns:
            PositionEmbeddingRandom: of this class, with ``num_pos_feats`` and ``num_axes``
            from the matrix's shape ``(num_axes, num_pos_feats)``.

        Raises:
            TypeError: ``module`` holds no such matrix.
        """
        matrix = getattr(module, "positional_encoding_gaussian_matrix", getattr(module, "positional_embedding", None))
        if not isinstance(matrix, Tensor) or matrix.dim() != 2:
            raise TypeError(
                f"module must hold a Gaussian matrix (num_axes, num_pos_feats) as "
                f"positional_encoding_gaussian_matrix or positional_embedding, got {type(module).__name__}"
            )
        scale = getattr(module, "scale", None)
        kwargs.setdefault("scale", scale if isinstance(scale, (int, float)) and scale > 0 else None)
        kwargs.setdefault("generator", torch.Generator())  # the draw is replaced: leave the global RNG be
        kwargs.setdefault("trainable", isinstance(matrix, nn.Parameter))
        new = cls(matrix.shape[1], num_axes=matrix.shape[0], **kwargs)
        new._set_matrix(matrix.detach().clone(), new._matrix_name in new._parameters)
        if isinstance(matrix, nn.Parameter) and new._matrix_name in new._parameters:
            new._matrix.requires_grad_(matrix.requires_grad)
        return new

    @property
    def _matrix(self) -> Tensor:
        return getattr(self, self._matrix_name)

    def _set_matrix(self, value: Tensor, trainable: bool) -> None:
        """Holds ``value`` as the matrix: a parameter when ``trainable``, else a buffer."""
        name = self._matrix_name
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        if trainable:
            self.register_parameter(name, nn.Parameter(value))
        else:
            self.register_buffer(name, value)

    normalize = _deprecation.renamed_attribute("normalize", "frame")

    @_deprecation.renamed_kwargs(n_axes="num_axes")
    def out_channels(self, num_axes: int | None = None) -> int:
        """``2 * num_pos_feats`` (the Joiner's contract); ``num_axes`` must be the module's."""
        if num_axes is not None and num_axes != self.num_axes:
            raise ValueError(f"this embedding has num_axes={self.num_axes}, asked for {num_axes} axes")
        return 2 * self.num_pos_feats

    def forward(
        self,
        size: Sequence[int] | object,
        *extra: object,
        spacing: Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """The embedding of a grid (SAM's dense form) or of a padded batch (class docstring).

        Args:
            size (sequence of num_axes ints, one int, or a batch): ``(H, W)`` (``(D, H, W)``)
                for SAM's dense grid (one int, NumPy integer or 0-d integer tensor: every axis),
                or a NestedTensor / Padding / bool mask / feature map.
            spacing (Tensor[B, n], floating, optional, keyword-only): with a batch, mm per cell
                along each axis, per item (used with ``extent``; see the class docstring).
            dtype (torch.dtype, optional, keyword-only): output dtype, floating; float32 when
                not given (angles are float32 in any case, under ``torch.autocast`` too).

        Returns:
            Tensor[2K, *size] for a size; Tensor[B, 2K, *S] for a batch (empty inputs give an
            empty tensor of that shape).

        Raises:
            TypeError: a second positional argument (DETR's ``(x, mask)`` call; the message says
                what this call takes); and see the class docstring.
            ValueError: see the class docstring.
        """
        if extra:
            got = ", ".join(describe(v) for v in (size, *extra))
            raise TypeError(
                f"{type(self).__name__}.forward takes one input (SAM's signature): a size (H, W) for the "
                f"dense grid, or one batch (a NestedTensor, a Padding, a bool mask (B, *S) or a feature map "
                f"(B, C, *S)); got {1 + len(extra)} positional arguments ({got}). For a feature map and "
                "its mask pass NestedTensor(x, mask), or the mask alone; for points call "
                "forward_with_coords(coords, image_size)"
            )
        out_dtype = torch.float32 if dtype is None else check_float_dtype(dtype)
        device = self._matrix.device
        if as_int(size) is not None or isinstance(size, Sequence) and not isinstance(size, (str, bytes)):
            if spacing is not None:
                raise ValueError("spacing is per item: pass a batch (NestedTensor, Padding or mask), not a size")
            spatial = check_sizes(size, "size", n=self.num_axes)
            check_output_fits(type(self).__name__, (self.out_channels(), *spatial), out_dtype, device)
            table = self._embed(spatial, 1, None, None, device)[0]
            return table.to(out_dtype)
        padding, host = parse_spatial_input(size, self.num_axes)
        spatial, batch, device = padding.spatial, padding.batch, padding.device
        if len(spatial) != self.num_axes:
            raise ValueError(
                f"this embedding has num_axes={self.num_axes}: pass a NestedTensor (B, C, *S), a "
                f"Padding, a mask (B, *S) or a feature map (B, C, *S) with {self.num_axes} spatial "
                f"axes; got spatial shape {spatial}{float_mask_hint(size, self.num_axes)}"
            )
        if batch == 0 or 0 in spatial:
            return torch.zeros((batch, self.out_channels(), *spatial), dtype=out_dtype, device=device)
        if host:  # refused by size before anything is computed (the one allocation guard)
            check_output_fits(type(self).__name__, (batch, self.out_channels(), *spatial), out_dtype, device)
        spacing, _ = _check_spacing(spacing, batch, len(spatial), device)
        boxes = item_boxes(padding, host) if self.frame == "item" else None
        if self.extent is None:
            spacing = None  # fractions of each axis' own extent: the spacing cancels
        return self._embed(spatial, batch, boxes, spacing, device).to(out_dtype)

    def forward_with_coords(
        self, coords_input: Tensor, image_size: Sequence[float], *, dtype: torch.dtype | None = None
    ) -> Tensor:
        """Embeds points given in pixels (SAM's prompts; pass pixel centres, ``p + 0.5``).

        Coordinate ``p`` along an axis of ``image_size`` length ``L`` becomes ``c = p / L``
        (``p / (L - 1)`` with ``align_corners``), then as the grid. ``extent`` is not used here:
        pass ``image_size=(extent,) * num_axes`` for points in the same frame as an
        ``extent`` grid.

        Args:
            coords_input (Tensor[..., num_axes]): points in ``coord_order`` (SAM: ``(x, y)``),
                in pixels; any real dtype (integers are converted, not truncated as SAM does).
            image_size (sequence of num_axes numbers): the image's size in tensor axis order
                (SAM: ``(H, W)``).
            dtype (torch.dtype, optional, keyword-only): output dtype; float32 when not given.

        Returns:
            Tensor[..., 2K]: on ``coords_input``'s device. Not written into ``coords_input``.

        Raises:
            TypeError: ``coords_input`` not a real tensor; ``image_size`` entries not numbers; a
                non-floating ``dtype``.
            ValueError: ``coords_input`` without a last axis of ``num_axes`` coordinates;
                ``image_size`` of another length or with an entry that is not > 0.
        """
        coords = self._check_coords(coords_input)
        out_dtype = torch.float32 if dtype is None else check_float_dtype(dtype)
        if isinstance(image_size, (str, bytes)) or not isinstance(image_size, (Sequence, Tensor)):
            raise TypeError(f"image_size must be a sequence of {self.num_axes} numbers, got {image_size!r}")
        sizes = [float(check_number(v, "image_size", positive=True)) for v in list(image_size)]
        if len(sizes) != self.num_axes:
            raise ValueError(f"image_size must hold {self.num_axes} sizes (tensor axis order), got {tuple(sizes)}")
        if self.coord_order == "xy":
            sizes = sizes[::-1]
        if self.align_corners:
            sizes = [max(s - 1.0, 1.0) for s in sizes]
        work = torch.float64 if coords.dtype == torch.float64 else torch.float32  # SAM divides first
        divisor = torch.empty(len(sizes), dtype=work, device=coords.device)
        for axis, size in enumerate(sizes):  # scalar fills: no host copy, so no CUDA synchronisation
            divisor[axis].fill_(size)
        return self._project(coords.to(work) / divisor, out_dtype)

    def extra_repr(self) -> str:
        text = (
            f"num_pos_feats={self.num_pos_feats}, scale={self.scale}, num_axes={self.num_axes}, "
            f"frame={self.frame!r}, coord_order={self.coord_order!r}, "
            f"align_corners={self.align_corners}, coord_range={self.coord_range}"
        )
        text += f", extent={self.extent}" if self.extent is not None else ""
        trainable = self._matrix_name in self._parameters
        return text + (f", trainable={trainable}" if trainable != self._trainable else "")

    # -------------------------------------------------------------------------------- helpers
    def _check_coords(self, coords: object, name: str = "coords_input") -> Tensor:
        if not isinstance(coords, Tensor) or coords.is_complex() or coords.dtype == torch.bool:
            got = coords.dtype if isinstance(coords, Tensor) else type(coords).__name__
            raise TypeError(f"{name} must be a real tensor (..., {self.num_axes}), got {got}")
        if coords.dim() < 1 or coords.shape[-1] != self.num_axes:
            raise ValueError(
                f"{name} must have shape (..., {self.num_axes}) (num_axes={self.num_axes}), got {tuple(coords.shape)}"
            )
        return coords

    def _project(self, unit: Tensor, dtype: torch.dtype) -> Tensor:
        """Points ``(..., n)`` normalised to ``[0, 1]`` -> ``Tensor[..., 2K]`` in ``dtype``."""
        lo, hi = self.coord_range
        u = unit.to(torch.float32)
        if (lo, hi) != (0.0, 1.0):
            u = u * (hi - lo) + lo  # SAM's ``2 * coords - 1``, bit for bit
        matrix = self._matrix.to(torch.float32)
        flat = fourier_features(u.reshape(-1, self.num_axes), matrix)
        return flat.view(*u.shape[:-1], flat.shape[-1]).to(dtype)

    def _lines(
        self, spatial: tuple[int, ...], boxes: tuple[list[Tensor], Tensor] | None, spacing: Tensor | None,
        device: torch.device,
    ) -> list[Tensor]:
        """Per axis, the mapped coordinate ``u`` of every index: ``Tensor[B' , S_a]`` (``B' = 1``
        for a canvas without per-item spacing)."""
        lo, hi = self.coord_range
        tracing = _tracing.tracing()
        lines = []
        for a, size in enumerate(spatial):
            if boxes is None and tracing:  # sizes stay symbolic: no Python float of a size
                first = 0.0 if self.align_corners else 0.5
                p = (torch.arange(size, device=device, dtype=torch.float32) + first)[None]
                length = torch.full((1, 1), size, device=device, dtype=torch.float32)
            elif boxes is None:  # cell centres i + 0.5 straight from arange (exact, as SAM's cumsum - 0.5)
                first = 0.0 if self.align_corners else 0.5
                p = torch.arange(first, size + first, 1.0, device=device, dtype=torch.float32)[None]
                length = float(size)
            else:
                p, length = boxes[0][a], boxes[1][:, a : a + 1]
                p = p if self.align_corners else p + 0.5
            if self.extent is not None:
                c = (p if spacing is None else p * spacing[:, a : a + 1]) / self.extent
            elif boxes is None and not tracing:
                c = p / (max(length - 1.0, 1.0) if self.align_corners else length)
            else:
                c = p / ((length - 1.0) if self.align_corners else length).clamp(min=1.0)
            lines.append(c if (lo, hi) == (0.0, 1.0) else c * (hi - lo) + lo)
        return lines

    def _embed(
        self, spatial: tuple[int, ...], batch: int, boxes, spacing: Tensor | None, device: torch.device
    ) -> Tensor:
        """``Tensor[batch, 2K, *spatial]`` float32, channel-last in memory."""
        n, k2 = len(spatial), 2 * self.num_pos_feats
        lines = self._lines(spatial, boxes, spacing, device)
        rows = max(line.shape[0] for line in lines)  # 1: one table serves every item
        views = []
        for a, line in enumerate(lines):
            shape = [line.shape[0]] + [1] * n
            shape[1 + a] = spatial[a]
            views.append(line.reshape(shape).expand(rows, *spatial))
        if self.coord_order == "xy":
            views = views[::-1]
        coords = torch.stack(views, dim=-1).view(-1, n)
        matrix = self._matrix.to(device=device, dtype=torch.float32)
        if _tracing.tracing() or matrix.requires_grad and torch.is_grad_enabled():
            # no comparison of the (symbolic) batch size, no ``out=`` under autograd
            table = fourier_features(coords, matrix).view(rows, *spatial, k2).expand(batch, *spatial, k2)
            return table.contiguous().permute(0, n + 1, *range(1, n + 1))
        out = torch.empty((batch, *spatial, k2), dtype=torch.float32, device=device)
        head = out.narrow(0, 0, rows)
        fourier_features(coords, matrix, out=head.view(-1, k2))
        if rows < batch:  # a canvas: the first item's table, copied into the others
            rest = out.narrow(0, rows, batch - rows)
            rest.copy_(head.expand(rest.shape))
        return out.permute(0, n + 1, *range(1, n + 1))


class SamPositionalEmbedding(PositionEmbeddingRandom):
    """transformers' ``SamPositionalEmbedding`` / ``Sam2PositionalEmbedding``: points in, features out.

    The same embedding as :class:`PositionEmbeddingRandom` (and the same constructor), with
    transformers' buffer name (``positional_embedding``, so a transformers ``SamModel``'s
    ``shared_image_embedding`` state loads) and its call: ``forward(input_coords,
    input_shape=None)`` embeds coordinates normalised to ``[0, 1]`` or, with ``input_shape``,
    pixels divided by it. Swap it into a ``SamModel`` (``model.shared_image_embedding`` and
    ``model.prompt_encoder.shared_embedding``, :meth:`from_module` copies the matrix) and the
    model's outputs do not change. The output has the matrix's dtype, as transformers' does
    (angles in float32 whatever it is).

    The matrix is a trainable ``nn.Parameter``, as in transformers' ``SamPositionalEmbedding``,
    so fine-tuning updates it and optimizer state lines up with the original model's;
    :meth:`from_module` keeps the peer's kind (SAM 2's ``Sam2PositionalEmbedding`` buffers it)
    and ``trainable=False`` makes it a buffer.

    Args:
        num_pos_feats, scale, ...: as :class:`PositionEmbeddingRandom` (transformers builds
            ``num_pos_feats`` from its config: ``num_pos_feats`` for SAM, ``hidden_size // 2``
            for SAM 2).

    Raises:
        TypeError: as :class:`PositionEmbeddingRandom`; ``input_coords`` not a real tensor.
        ValueError: as :class:`PositionEmbeddingRandom`; ``input_coords`` without a last axis
            of ``num_axes`` coordinates; ``input_shape`` of another length.

    References:
        transformers ``models/sam/modeling_sam.py`` and ``models/sam2/modeling_sam2.py``;
        Kirillov et al., Segment Anything, ICCV 2023.
    """

    _matrix_name = "positional_embedding"
    _trainable = True  # transformers' SamModel trains it (SAM 2 buffers it: from_module keeps that)

    def forward(self, input_coords: Tensor, input_shape: Sequence[int] | None = None) -> Tensor:  # type: ignore[override]
        """Embeds ``input_coords`` (``Tensor[..., num_axes]``, ``coord_order``): in ``[0, 1]``,
        or in pixels of an image of ``input_shape`` (tensor axis order, ``(H, W)``).

        Returns:
            Tensor[..., 2 * num_pos_feats] in the matrix's dtype.

        Raises:
            TypeError, ValueError: see the class docstring.
        """
        dtype = self._matrix.dtype if self._matrix.dtype.is_floating_point else torch.float32
        if input_shape is not None:
            return self.forward_with_coords(input_coords, input_shape, dtype=dtype)
        coords = self._check_coords(input_coords, "input_coords")
        return self._project(coords, dtype)

    @property
    def positional_encoding_gaussian_matrix(self) -> Tensor:
        """Tensor[num_axes, num_pos_feats]: segment_anything's name of the same matrix."""
        return self.positional_embedding
