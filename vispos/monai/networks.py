"""MONAI's ViT and UNETR on padded batches of volumes of any size.

A ``ViT`` / ``UNETR`` built for one ``img_size`` holds a position table for one patch grid and
refuses any other size (Project-MONAI/MONAI#3992, #6264). :class:`AnySizeViT` and
:class:`AnySizeUNETR` are the same classes (same constructor, same ``state_dict`` keys, so MONAI
checkpoints load as they are) with a forward that takes a :class:`~vispos.NestedTensor` or a
tensor of any size:

* the position embedding is computed for each item's own patch grid: MONAI's sin-cos
  (:func:`~vispos.monai_sincos`'s numbers, positions counted from the item's first patch) or the
  model's learned table resampled to the item's grid with
  :func:`~vispos.resample_abs_pos_embed` (trilinear in 3D, bicubic in 2D);
* padded patches are masked out of attention (``SABlock``'s ``attn_mask``, which ``ViT.forward``
  does not pass);
* UNETR's convolutional decoder runs through vispos' padding-invariance rule book
  (:mod:`vispos.monai._decoder`): zeros around each item before every (transposed) convolution,
  norms over its cells only, each map's padding from the token grid's valid cells.

So an item's output inside a padded batch equals its output run alone at its own size, on its
valid region, to float tolerance (tested). Items of a rectangular padding that start off the patch
grid (MONAI's symmetric padding) are moved to the origin first and their outputs moved back. A patch holding any valid voxel is valid: sizes that
are not multiples of the patch size keep their last, partial patch (zero-filled), where MONAI's
convolution would drop it.

``torch.export.export`` takes both, on plain tensors and on padded batches (``(tensors, mask)``,
the ``NestedTensor`` built inside the exported module); TorchScript does not (a ``TypeError``
naming the alternatives): see docs/monai.md, "Export and TorchScript".

References:
    Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021 (ViT; interpolating position
    embeddings for another resolution); Hatamizadeh et al., UNETR, WACV 2022; MONAI
    ``networks/nets/vit.py``, ``unetr.py``, ``blocks/selfattention.py``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

from monai.data import MetaTensor
from monai.networks.nets import UNETR, ViT
from torch import Tensor

from ._anysize import _adopt, _AnySize, _grid_of, _options, _patch_size, _roll_items
from ._decoder import InvariantDecoder, decoder_padding

__all__ = ["AnySizeViT", "AnySizeUNETR"]

_DECODER_GRAPH = "_vispos_decoder_graph"

_EXPORT_DOC = """
    Export:
        ``torch.export.export`` works on plain tensors and on padded batches (export a module
        taking ``(tensors, mask)`` that builds the ``NestedTensor``); the learned table is then
        resampled to each item from tensors alone. A sin-cos table exports with dynamic batch
        and sizes; a learned one for the example's shapes. TorchScript is not supported:
        ``torch.jit.script`` and ``torch.jit.trace`` raise ``TypeError`` (MONAI's own class,
        loaded with this ``state_dict``, scripts at its built size).
"""

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
    __doc__ = """MONAI's ``ViT`` for padded batches of any size: same arguments, weights and outputs.

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
          class token attends to valid patches only). Item ``b``'s tokens (and every block's in
          ``hidden_states_out``) lie on the patch cells from ``start // patch_size``,
          ``ceil(size / patch_size)`` of them, for its box ``[start, start + size)``
          (:meth:`token_mask` marks them): when some item of a rectangular padding starts off the
          patch grid, every item is moved to the origin, cut into the patches it gets alone, and
          its tokens moved back by whole patches.

    Raises:
        ValueError: bad options; causal or relative-position attention blocks; a sin-cos table
            that is not MONAI's at ``temperature``; a learned table whose grid cannot be known
            (pass ``img_size``). At ``forward``: a mask of another shape; a mask without known
            boxes (``Padding.kind == "arbitrary"``) whose items start off the patch grid (build
            the padding with ``Padding.from_mask(mask, classify=True)`` or ``from_sizes``).
        TypeError: an input that is neither a NestedTensor nor a tensor; a non-bool mask;
            ``torch.jit.script`` / ``torch.jit.trace`` (TorchScript is not supported).
        ImportError: MONAI older than 1.5.
    """ + _EXPORT_DOC + """
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
        inp = self._read(x)
        out, hidden_states_out, _ = self._encode(inp.images, inp.mask, inp.boxes)
        if inp.shifts is not None:  # items moved to the origin: their tokens back by whole patches
            grid = tuple(s // p for s, p in zip(inp.images.shape[2:], self.patch_size))
            out = self._place_tokens(out, inp.shifts, grid)
            hidden_states_out = [self._place_tokens(h, inp.shifts, grid) for h in hidden_states_out]
        if hasattr(self, "classification_head"):
            out = self.classification_head(out[:, 0])
        return out, hidden_states_out


class AnySizeUNETR(_AnySize, UNETR):
    __doc__ = """MONAI's ``UNETR`` for padded batches of any size: same arguments, weights and outputs.

    The ViT encoder runs as :class:`AnySizeViT`; the convolutional decoder runs through vispos'
    padding-invariance rule book: it sees zeros around each item and normalises over its own cells
    (instance, group or batch norm), so every item's
    segmentation on its valid region is what it gets alone. Sizes are padded internally to a
    multiple of UNETR's patch size 16 and the output is cropped back. Build it as MONAI's
    ``UNETR`` or convert a built one with :meth:`from_monai`; the ``state_dict`` is MONAI's.
    """ + _OPTIONS_DOC + """
    Shape:
        - input: a :class:`~vispos.NestedTensor` ``(B, C, *S)`` or a tensor ``(B, C, *S)``.
        - output: ``Tensor[B, out_channels, *S]`` (logits; on padding they are meaningless: mask
          them with the input's mask). Each item's logits lie on its own voxels, also when its
          box starts off the patch grid (MONAI's symmetric padding): the items are then moved to
          the origin for the network and their logits moved back.

    Raises:
        ValueError: as :class:`AnySizeViT` (an arbitrary mask off the patch grid included); a decoder layer that vispos' padding-invariance rule
            book cannot run exactly (layer norm over space, instance norm tracking running
            statistics, up-sampling with ``align_corners=True``, a layer without a rule) or that
            torch.fx cannot trace, named.
        TypeError: as :class:`AnySizeViT` (TorchScript included).
        ImportError: MONAI older than 1.5.
    """ + _EXPORT_DOC + """
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
            AnySizeUNETR: shares ``unetr``'s modules; ``unetr`` runs as before (the decoder's
            rewritten graph belongs to this object alone).

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
        self._decoder()  # a decoder layer the rule book cannot make exact is refused here

    def _decoder(self) -> InvariantDecoder:
        """The decoder's rewritten graph, kept out of the submodules (so out of ``state_dict``);
        traced again when a decoder layer was replaced, or after a copy or a pickle."""
        cached = self.__dict__.get(_DECODER_GRAPH)
        if cached is not None and not cached.fits(self):
            cached = cached.rebound(self)
            self.__dict__[_DECODER_GRAPH] = cached
        if cached is None:
            cached = self.__dict__[_DECODER_GRAPH] = InvariantDecoder(self, self.patch_size, type(self).__name__)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the decoder's graph (a pickle traces it again)."""
        state = dict(self.__dict__)
        state.pop(_DECODER_GRAPH, None)
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> "AnySizeUNETR":
        """A deep copy whose decoder graph calls the copy's layers (``torch.export`` copies the
        model, and cannot trace the decoder again inside its own tracing)."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__({key: copy.deepcopy(value, memo) for key, value in self.__dict__.items()})
        return copied

    def forward(self, x_in: Any) -> Tensor:
        inp = self._read(x_in)
        images = inp.images
        x, hidden_states_out, token_valid = self._encode(images, inp.mask, inp.boxes)
        grid = tuple(s // p for s, p in zip(images.shape[2:], self.patch_size))

        def proj(t: Tensor) -> Tensor:  # UNETR.proj_feat on this batch's grid
            return t.reshape(t.shape[0], *grid, t.shape[-1]).movedim(-1, 1).contiguous()

        padding = None if token_valid is None else decoder_padding(
            token_valid, inp.boxes, self.patch_size, tuple(images.shape[2:]))
        tokens = [proj(hidden_states_out[3]), proj(hidden_states_out[6]), proj(hidden_states_out[9]), proj(x)]
        out = self._decoder()(self.training, images, tokens, padding)
        if inp.shifts is not None:  # items moved to the origin: each one's logits back at its own voxels
            out = _roll_items(out, inp.shifts, 2)
        out = out[(slice(None), slice(None), *(slice(0, s) for s in inp.spatial))]
        if inp.meta is not None:  # as MONAI's nets: a MetaTensor in, a MetaTensor out (affine, records)
            out = MetaTensor(out).copy_meta_from(inp.meta)
        return out
