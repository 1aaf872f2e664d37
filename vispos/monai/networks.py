"""MONAI's ViT and UNETR on padded batches of volumes of any size.

A ``ViT`` / ``UNETR`` built for one ``img_size`` holds a position table for one patch grid and
refuses any other size (MONAI issues 3992 and 6264). :class:`AnySizeViT` and
:class:`AnySizeUNETR` are the same classes (same constructor, same ``state_dict`` keys, so MONAI
checkpoints load as they are) with a forward that takes a :class:`~vispos.NestedTensor` or a
tensor of any size:

* the position embedding is computed for each item's own patch grid: MONAI's sin-cos
  (:func:`~vispos.monai_sincos`'s numbers, positions counted from the item's first patch) or the
  model's learned table resampled to the item's grid with
  :func:`~vispos.resample_abs_pos_embed` (trilinear in 3D, bicubic in 2D);
* padded patches are masked out of attention (``SABlock``'s ``attn_mask``, which ``ViT.forward``
  does not pass);
* UNETR's convolutional decoder sees zeros around each item and normalises over its cells only
  (:mod:`vispos.monai._masked`).

So an item's output inside a padded batch equals its output run alone at its own size, on its
valid region, to float tolerance (tested). A patch holding any valid voxel is valid: sizes that
are not multiples of the patch size keep their last, partial patch (zero-filled), where MONAI's
convolution would drop it.

References:
    Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021 (ViT; interpolating position
    embeddings for another resolution); Hatamizadeh et al., UNETR, WACV 2022; MONAI
    ``networks/nets/vit.py``, ``unetr.py``, ``blocks/selfattention.py``.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from monai.networks.blocks.transformerblock import TransformerBlock
from monai.networks.nets import UNETR, ViT
from torch import Tensor, nn

from .._checks import check_bool, check_choice
from .._sincos import check_temperature, sincos_embed
from ..encodings.learned import _infer_grid, resample_abs_pos_embed
from ..encodings.presets import monai_sincos
from ..nested_tensor import NestedTensor, NestedTensorLike
from ..padding import check_mask
from ._masked import install_decoder_hooks, masked_decoder

__all__ = ["AnySizeViT", "AnySizeUNETR"]

_POS_EMBED = ("auto", "sincos", "resample")
_MODES = {2: "bicubic", 3: "trilinear"}


def _supports_attn_mask() -> bool:
    return "attn_mask" in inspect.signature(TransformerBlock.forward).parameters


def _patch_size(vit: ViT) -> tuple[int, ...]:
    pe = vit.patch_embedding
    if pe.proj_type == "conv":
        return tuple(int(k) for k in pe.patch_embeddings.kernel_size)
    lengths = pe.patch_embeddings[0].axes_lengths  # perceptron: Rearrange(..., p1=.., p2=..)
    return tuple(int(lengths[f"p{i + 1}"]) for i in range(len(lengths)))


def _token_valid(mask: Tensor, patch: tuple[int, ...]) -> Tensor:
    """``Tensor[B, *G]`` bool: True where a patch holds at least one valid voxel."""
    valid = ~mask
    shape = [mask.shape[0]]
    for s, p in zip(mask.shape[1:], patch):
        shape += [s // p, p]
    return valid.reshape(shape).any(dim=tuple(range(2, len(shape), 2)))


def _boxes(token_valid: Tensor) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each item's bounding box ``(start, size)`` on the patch grid (reads the mask on the host)."""
    n = token_valid.dim() - 1
    starts, stops = [], []
    for axis in range(n):
        other = [d for d in range(1, n + 1) if d != axis + 1]
        line = token_valid.any(dim=other) if other else token_valid  # (B, G_axis)
        idx = torch.arange(line.shape[1], device=line.device)
        starts.append(torch.where(line, idx, line.shape[1]).amin(1))
        stops.append(torch.where(line, idx + 1, 0).amax(1))
    start = torch.stack(starts, 1).tolist()
    stop = torch.stack(stops, 1).tolist()
    return [
        (tuple(a if a < b else 0 for a, b in zip(s0, s1)), tuple(max(b - a, 1) for a, b in zip(s0, s1)))
        for s0, s1 in zip(start, stop)
    ]


class _AnySize:
    """What the two classes share: settings, input reading, the ViT encoder pass."""

    patch_size: tuple[int, ...]
    grid_size: tuple[int, ...] | None

    def _vit(self) -> ViT:  # pragma: no cover - abstract
        raise NotImplementedError

    def _configure(
        self,
        grid_size: Sequence[int] | None,
        pos_embed: str = "auto",
        resample_mode: str | None = None,
        antialias: bool = True,
        temperature: float = 10000.0,
    ) -> None:
        """Checks the options against the model and stores them (plain attributes: the
        ``state_dict`` stays MONAI's)."""
        name = type(self).__name__
        vit = self._vit()
        if not _supports_attn_mask():  # pragma: no cover - depends on the installed MONAI
            raise ImportError(f"{name} needs MONAI >= 1.5 (attention masks in SABlock): pip install -U monai")
        check_choice(pos_embed, _POS_EMBED, "pos_embed")
        check_bool(antialias, "antialias")
        check_temperature(temperature)
        pe = vit.patch_embedding
        patch = _patch_size(vit)
        n = len(patch)
        hidden = pe.position_embeddings.shape[-1]
        for i, blk in enumerate(vit.blocks):
            attn = blk.attn
            if attn.causal or attn.rel_positional_embedding is not None:
                raise ValueError(
                    f"{name}: blocks[{i}] uses causal attention or a relative position table of a "
                    "fixed input size; neither runs on other sizes"
                )
        if pos_embed == "auto":
            pos_embed = {"sincos": "sincos", "none": "none"}.get(pe.pos_embed_type, "resample")
        if grid_size is None:
            grid_size = _infer_grid(int(pe.n_patches), n)
        if grid_size is not None:
            grid_size = tuple(int(g) for g in grid_size)
            if math.prod(grid_size) != pe.position_embeddings.shape[1]:
                raise ValueError(
                    f"{name}: a patch grid of {grid_size} holds {math.prod(grid_size)} patches but the "
                    f"model's position table has {pe.position_embeddings.shape[1]}"
                )
        if pos_embed == "resample" and grid_size is None:
            raise ValueError(
                f"{name}: the model's patch grid ({int(pe.n_patches)} patches) is not a cube; pass "
                "img_size, the size the model was built for"
            )
        if pos_embed == "sincos":
            if hidden % (2 * n):
                raise ValueError(f"{name}: pos_embed='sincos' needs hidden_size divisible by {2 * n}, got {hidden}")
            if pe.pos_embed_type == "sincos" and grid_size is not None:
                ref = monai_sincos(grid_size, hidden, n, temperature, device=pe.position_embeddings.device)
                if not torch.equal(pe.position_embeddings.detach().to(ref.dtype), ref):
                    raise ValueError(
                        f"{name}: the model's sin-cos table is not MONAI's build_sincos_position_embedding "
                        f"at temperature={temperature}; pass the temperature it was built with"
                    )
        if resample_mode is None:
            resample_mode = _MODES[n]
        self.patch_size = patch
        self.grid_size = grid_size
        self.pos_embed = pos_embed
        self.resample_mode = resample_mode
        self.antialias = antialias
        self.temperature = float(temperature)

    # ------------------------------------------------------------------------------- input
    def _read(self, x: Any) -> tuple[Tensor, Tensor | None, tuple[int, ...], Any]:
        """``(images padded to whole patches, voxel mask or None, the input's spatial size, sizes)``."""
        name = type(self).__name__
        n = len(self.patch_size)
        sizes = None
        if isinstance(x, NestedTensor):
            tensors, mask = x.decompose()
            if x.rectangular and x._image_sizes is not None:
                sizes = x._image_sizes
        elif not isinstance(x, Tensor) and isinstance(x, NestedTensorLike):
            tensors, mask = x.decompose()
        elif isinstance(x, Tensor):
            tensors, mask = x, None
        else:
            raise TypeError(f"{name} takes a NestedTensor or a Tensor (B, C, *S), got {type(x).__name__}")
        if not isinstance(tensors, Tensor) or tensors.dim() != n + 2:
            got = tuple(tensors.shape) if isinstance(tensors, Tensor) else type(tensors).__name__
            raise ValueError(f"{name} takes (B, C, *S) with {n} spatial axes, got {got}")
        tensors = tensors.as_subclass(Tensor)  # a MetaTensor's metadata stays with the caller's batch
        spatial = tuple(tensors.shape[2:])
        if mask is not None:
            check_mask(mask)
            if tuple(mask.shape) != (tensors.shape[0], *spatial):
                raise ValueError(f"mask must have shape {(tensors.shape[0], *spatial)}, got {tuple(mask.shape)}")
            mask = mask.as_subclass(Tensor).to(tensors.device)
        extra = [(-s) % p for s, p in zip(spatial, self.patch_size)]
        if any(extra):
            pad = [w for e in reversed(extra) for w in (0, e)]
            tensors = F.pad(tensors, pad)
            grown = torch.ones((tensors.shape[0], *tensors.shape[2:]), dtype=torch.bool, device=tensors.device)
            grown[(slice(None), *(slice(0, s) for s in spatial))] = False if mask is None else mask
            mask = grown
        return tensors, mask, spatial, sizes

    def token_mask(self, x: Any) -> Tensor:
        """The padding mask of ``x``'s patch grid: ``Tensor[B, *G]`` bool, True = padding.

        A patch is valid when it holds at least one valid voxel; ``G = ceil(S / patch_size)``.
        Tokens are ``G`` flattened row-major (after the class token, when the ViT has one).

        Raises:
            TypeError, ValueError: as ``forward``.
        """
        tensors, mask, _, _ = self._read(x)
        if mask is None:
            grid = [s // p for s, p in zip(tensors.shape[2:], self.patch_size)]
            return torch.zeros((tensors.shape[0], *grid), dtype=torch.bool, device=tensors.device)
        return ~_token_valid(mask, self.patch_size)

    # ----------------------------------------------------------------------------- encoder
    def _positions(self, token_valid: Tensor | None, grid: tuple[int, ...], batch: int, sizes: Any) -> Tensor | None:
        """``Tensor[B or 1, N, hidden]``: each item's embedding, on its own patch grid."""
        pe = self._vit().patch_embedding
        table = pe.position_embeddings
        hidden = table.shape[-1]
        n = len(grid)
        if self.pos_embed == "none":
            return None
        if self.pos_embed == "sincos":
            positions = []
            for axis, g in enumerate(grid):
                view = [1] * (n + 1)
                view[1 + axis] = g
                pos = torch.arange(g, device=table.device, dtype=torch.float32)
                if token_valid is not None:  # counted from the item's first patch along the axis
                    other = [d for d in range(1, n + 1) if d != axis + 1]
                    line = token_valid.any(dim=other) if other else token_valid
                    start = torch.where(line.any(1), line.to(torch.int8).argmax(1), 0)
                    view[0] = batch
                    pos = pos - start.unsqueeze(1).to(torch.float32)
                positions.append(pos.reshape(view))
            order = (1, 0, 2)[:n]  # MONAI's blocks: w, h[, d] of a grid (h, w[, d])
            out = sincos_embed(
                [positions[a] for a in order], hidden // n, shape=(batch if token_valid is not None else 1, *grid),
                temperature=self.temperature, layout="split", reciprocal=True, channel_dim=-1,
            )
            return out.reshape(out.shape[0], -1, hidden).to(table.dtype)
        # resample the learned (or Fourier) table to each item's own grid
        if token_valid is None:
            return self._resampled(grid).reshape(1, -1, hidden)
        if sizes is not None:  # rectangular NestedTensor: boxes from the host sizes, no sync
            boxes = [((0,) * n, tuple(-(-s // p) for s, p in zip(size, self.patch_size))) for size in sizes]
        else:
            boxes = _boxes(token_valid)
        out = table.new_zeros((batch, *grid, hidden))
        for b, (start, size) in enumerate(boxes):
            region = tuple(slice(a, a + s) for a, s in zip(start, size))
            out[(b, *region)] = self._resampled(size)
        return out.reshape(batch, -1, hidden)

    def _resampled(self, size: tuple[int, ...]) -> Tensor:
        table = self._vit().patch_embedding.position_embeddings
        new = resample_abs_pos_embed(
            table, new_size=size, old_size=self.grid_size, num_prefix_tokens=0,
            mode=self.resample_mode, antialias=self.antialias,
        )
        return new.reshape(*size, table.shape[-1])

    def _encode(self, images: Tensor, mask: Tensor | None, sizes: Any) -> tuple[Tensor, list[Tensor], Tensor | None]:
        """ViT's forward with per-grid positions and padded patches masked out of attention."""
        vit = self._vit()
        pe = vit.patch_embedding
        batch = images.shape[0]
        grid = tuple(s // p for s, p in zip(images.shape[2:], self.patch_size))
        token_valid = None if mask is None else _token_valid(mask, self.patch_size)
        x = pe.patch_embeddings(images)
        if pe.proj_type == "conv":
            x = x.flatten(2).transpose(-1, -2)
        pos = self._positions(token_valid, grid, batch, sizes)
        if pos is not None:
            x = x + pos
        x = pe.dropout(x)
        attend = None
        if token_valid is not None:
            attend = token_valid.reshape(batch, -1)
            attend = attend | ~attend.any(1, keepdim=True)  # an all-padding item attends to all: no NaN
        if hasattr(vit, "cls_token"):
            x = torch.cat((vit.cls_token.expand(batch, -1, -1), x), dim=1)
            if attend is not None:
                attend = torch.cat((attend.new_ones(batch, 1), attend), dim=1)
        hidden_states_out = []
        for blk in vit.blocks:
            attn_mask = attend
            if attend is not None and blk.attn.use_flash_attention:  # SDPA: (B, heads, L, S) broadcast
                attn_mask = attend[:, None, None, :]
            x = blk(x, attn_mask=attn_mask)
            hidden_states_out.append(x)
        return vit.norm(x), hidden_states_out, token_valid


def _grid_of(img_size: Any, patch: tuple[int, ...]) -> tuple[int, ...] | None:
    if img_size is None:
        return None
    sizes = (img_size,) * len(patch) if isinstance(img_size, int) else tuple(img_size)
    if len(sizes) != len(patch) or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
        raise ValueError(f"img_size must be {len(patch)} positive ints, got {img_size!r}")
    return tuple(s // p for s, p in zip(sizes, patch))


def _adopt(cls: type, model: nn.Module) -> Any:
    """A ``cls`` instance sharing ``model``'s submodules, parameters and buffers (no copy)."""
    obj = cls.__new__(cls)
    obj.__dict__.update({k: copy.copy(v) if isinstance(v, (dict, set)) else v for k, v in model.__dict__.items()})
    return obj


_OPTIONS_DOC = """
    Args (beyond MONAI's, keyword-only):
        pos_embed (str): ``"auto"`` (default): MONAI's sin-cos recomputed for each grid when the
            model was built with ``pos_embed_type="sincos"``, none for ``"none"``, else the
            learned (or Fourier) table resampled; ``"sincos"`` or ``"resample"`` to force one.
        resample_mode (str, optional): ``F.interpolate`` mode for resampling; ``"trilinear"``
            (3D) or ``"bicubic"`` (2D) by default.
        antialias (bool): when down-sampling with ``bilinear`` / ``bicubic``. Default True (timm).
        temperature (float): of the sin-cos table (MONAI's ``pos_embed_kwargs``). Default 10000.
"""


class AnySizeViT(_AnySize, ViT):
    """MONAI's ``ViT`` for padded batches of any size: same arguments, weights and outputs.

    Build it as MONAI's ``ViT`` (``img_size`` is the size the position table was made for) or
    convert a built one with :meth:`from_monai`. Its ``state_dict`` is MONAI's: a MONAI
    checkpoint loads into it, and its checkpoints load into MONAI's ``ViT``.
    """ + _OPTIONS_DOC + """
    Shape:
        - input: a :class:`~vispos.NestedTensor` ``(B, C, *S)`` (mask True = padding, e.g. from
          :class:`~vispos.monai.NestedPadCollate`) or a tensor ``(B, C, *S)`` of any size.
        - output: ``(x, hidden_states_out)`` as MONAI's ``ViT``: ``x`` ``Tensor[B, (1 +) N, hidden]``
          over the padded patch grid ``G = ceil(S / patch_size)`` (``N = prod(G)``; see
          :meth:`token_mask`), or ``Tensor[B, num_classes]`` with ``classification=True`` (the
          class token attends to valid patches only).

    Raises:
        ValueError: bad options; causal or relative-position attention blocks; a sin-cos table
            that is not MONAI's at ``temperature``; a learned table whose grid cannot be known
            (pass ``img_size``). At ``forward``: a mask of another shape.
        TypeError: an input that is neither a NestedTensor nor a tensor; a non-bool mask.
        ImportError: MONAI older than 1.5.

    References:
        Dosovitskiy et al., ICLR 2021; MONAI ``networks/nets/vit.py``.
    """

    def __init__(
        self,
        *args: Any,
        pos_embed: str = "auto",
        resample_mode: str | None = None,
        antialias: bool = True,
        temperature: float = 10000.0,
        **kwargs: Any,
    ) -> None:
        ViT.__init__(self, *args, **kwargs)
        img_size = inspect.signature(ViT.__init__).bind(self, *args, **kwargs).arguments["img_size"]
        self._configure(_grid_of(img_size, _patch_size(self)), pos_embed, resample_mode, antialias, temperature)

    @classmethod
    def from_monai(cls, vit: ViT, img_size: Sequence[int] | int | None = None, **options: Any) -> "AnySizeViT":
        """Converts a built MONAI ``ViT`` (sharing its weights: nothing is copied).

        Args:
            vit (monai.networks.nets.ViT): the model, with its checkpoint already loaded.
            img_size (int or sequence of int, optional): the size it was built for; needed for
                a learned table unless its patch grid is a cube.
            **options: ``pos_embed``, ``resample_mode``, ``antialias``, ``temperature``.

        Returns:
            AnySizeViT: shares ``vit``'s modules; ``vit`` itself is unchanged.

        Raises:
            TypeError: ``vit`` is not a MONAI ``ViT``. ValueError: as the class.
        """
        if not isinstance(vit, ViT):
            raise TypeError(f"vit must be a monai.networks.nets.ViT, got {type(vit).__name__}")
        obj = _adopt(cls, vit)
        obj._configure(_grid_of(img_size, _patch_size(vit)), **_options(options))
        return obj

    def _vit(self) -> ViT:
        return self

    def forward(self, x: Any) -> tuple[Tensor, list[Tensor]]:
        images, mask, _, sizes = self._read(x)
        out, hidden_states_out, _ = self._encode(images, mask, sizes)
        if hasattr(self, "classification_head"):
            out = self.classification_head(out[:, 0])
        return out, hidden_states_out


class AnySizeUNETR(_AnySize, UNETR):
    """MONAI's ``UNETR`` for padded batches of any size: same arguments, weights and outputs.

    The ViT encoder runs as :class:`AnySizeViT`; the convolutional decoder sees zeros around each
    item and normalises over its own cells (instance, group or batch norm), so every item's
    segmentation on its valid region is what it gets alone. Sizes are padded internally to a
    multiple of UNETR's patch size 16 and the output is cropped back. Build it as MONAI's
    ``UNETR`` or convert a built one with :meth:`from_monai`; the ``state_dict`` is MONAI's.
    """ + _OPTIONS_DOC + """
    Shape:
        - input: a :class:`~vispos.NestedTensor` ``(B, C, *S)`` or a tensor ``(B, C, *S)``.
        - output: ``Tensor[B, out_channels, *S]`` (logits; on padding they are meaningless: mask
          them with the input's mask).

    Raises:
        ValueError: as :class:`AnySizeViT`; a decoder layer a mask cannot follow (pooling, layer
            norm over space, SyncBatchNorm, instance norm tracking running statistics).
        TypeError: as :class:`AnySizeViT`. ImportError: MONAI older than 1.5.

    References:
        Hatamizadeh et al., UNETR: Transformers for 3D Medical Image Segmentation, WACV 2022;
        MONAI ``networks/nets/unetr.py``.
    """

    def __init__(
        self,
        *args: Any,
        pos_embed: str = "auto",
        resample_mode: str | None = None,
        antialias: bool = True,
        temperature: float = 10000.0,
        **kwargs: Any,
    ) -> None:
        UNETR.__init__(self, *args, **kwargs)
        self._configure(
            tuple(self.feat_size), pos_embed=pos_embed, resample_mode=resample_mode, antialias=antialias,
            temperature=temperature,
        )

    @classmethod
    def from_monai(cls, unetr: UNETR, **options: Any) -> "AnySizeUNETR":
        """Converts a built MONAI ``UNETR`` (sharing its weights: nothing is copied).

        Args:
            unetr (monai.networks.nets.UNETR): the model, with its checkpoint already loaded.
            **options: ``pos_embed``, ``resample_mode``, ``antialias``, ``temperature``.

        Returns:
            AnySizeUNETR: shares ``unetr``'s modules; ``unetr`` runs as before (the decoder hooks
            act only inside this class's forward).

        Raises:
            TypeError: ``unetr`` is not a MONAI ``UNETR``. ValueError: as the class.
        """
        if not isinstance(unetr, UNETR):
            raise TypeError(f"unetr must be a monai.networks.nets.UNETR, got {type(unetr).__name__}")
        obj = _adopt(cls, unetr)
        obj._configure(tuple(obj.feat_size), **_options(options))
        return obj

    def _vit(self) -> ViT:
        return self.vit

    def _configure(self, grid_size: Sequence[int] | None, **options: Any) -> None:
        _AnySize._configure(self, grid_size, **options)
        decoder = [m for name, m in self.named_children() if name != "vit"]
        install_decoder_hooks(decoder, type(self).__name__)

    def forward(self, x_in: Any) -> Tensor:
        images, mask, spatial, sizes = self._read(x_in)
        x, hidden_states_out, token_valid = self._encode(images, mask, sizes)
        grid = tuple(s // p for s, p in zip(images.shape[2:], self.patch_size))

        def proj(t: Tensor) -> Tensor:  # UNETR.proj_feat on this batch's grid
            return t.reshape(t.shape[0], *grid, t.shape[-1]).movedim(-1, 1).contiguous()

        with nullcontext() if token_valid is None else masked_decoder(token_valid):
            enc1 = self.encoder1(images)
            enc2 = self.encoder2(proj(hidden_states_out[3]))
            enc3 = self.encoder3(proj(hidden_states_out[6]))
            enc4 = self.encoder4(proj(hidden_states_out[9]))
            dec3 = self.decoder5(proj(x), enc4)
            dec2 = self.decoder4(dec3, enc3)
            dec1 = self.decoder3(dec2, enc2)
            out = self.out(self.decoder2(dec1, enc1))
        return out[(slice(None), slice(None), *(slice(0, s) for s in spatial))]


def _options(options: dict) -> dict:
    allowed = ("pos_embed", "resample_mode", "antialias", "temperature")
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise TypeError(f"unexpected options {unknown}; expected some of {allowed}")
    return options
