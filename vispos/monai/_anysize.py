"""The ViT encoder pass on padded batches: per-grid positions and padded patches masked out of attention.

Shared by :class:`~vispos.monai.AnySizeViT` and :class:`~vispos.monai.AnySizeUNETR`: the options
and their checks against the model, the reading of the input (a ``NestedTensor`` or a tensor,
padded at the end to whole patches; items of a rectangular padding that start off the patch grid
moved to the origin, so they are cut into the patches they get alone), the patch-grid mask (a patch holding any valid voxel is
valid), each item's position embedding on its own patch grid, and MONAI's ``ViT.forward`` with
``attn_mask`` passed to every block.

References:
    Dosovitskiy et al., An Image is Worth 16x16 Words, ICLR 2021; MONAI ``networks/nets/vit.py``,
    ``blocks/selfattention.py`` (``attn_mask``: ``(B, N)``, 0 = masked key), ``blocks/pos_embed_utils.py``.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from monai.data import MetaTensor
from monai.networks.blocks.transformerblock import TransformerBlock
from monai.networks.nets import ViT
from torch import Tensor, nn

from .._checks import as_int, check_bool, check_choice, describe, is_int
from .._sincos import check_temperature, sincos_embed
from .. import _tracing
from .._tracing import tracing
from ..encodings.learned import _infer_grid, resample_abs_pos_embed
from ..encodings.presets import monai_sincos
from ..invariance import has_hooks
from ..nested_tensor import NestedTensor, NestedTensorLike
from ..padding import Padding, check_mask

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


def _token_boxes(token_valid: Tensor) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each item's ``(start, size)`` on the patch grid: the bounding box of its valid patches
    (:class:`~vispos.Padding` reads it from the mask, one host synchronisation)."""
    padding = Padding.from_mask(~token_valid, classify=False)
    return [(start, tuple(max(v, 1) for v in size)) for start, size in zip(padding.starts, padding.sizes)]


def _no_torchscript(name: str, how: str) -> TypeError:
    """The error for TorchScript: the forward reads NestedTensors and builds each item's position
    embedding in Python (types, per-item loops, hooks) that TorchScript cannot compile or trace."""
    monai = "ViT" if name == "AnySizeViT" else "UNETR"
    return TypeError(
        f"{name} does not support TorchScript ({how}): its forward takes NestedTensors and builds each "
        f"item's position embedding in Python. Use torch.export.export (plain tensors and padded batches: "
        f"pass (tensors, mask) and build the NestedTensor inside), or load its state_dict into MONAI's "
        f"{monai} (the same keys) and script that, at the img_size it was built for"
    )


def _plain(t: Tensor) -> Tensor:
    """``t`` as a plain ``Tensor`` (a ``MetaTensor``'s data, its metadata left behind); a plain
    tensor is returned as it is. ``as_subclass`` is never called on one: under ``torch.export``
    it turns the traced (fake) input into a new tensor the tracer does not know, which it then
    records as a constant and refuses ("a fake tensor in the exported program constant's list")."""
    if type(t) is Tensor or (tracing() and not isinstance(t, MetaTensor)):  # a tracer's own tensors stay
        return t
    return t.as_subclass(Tensor)


class _Input(NamedTuple):
    """What a forward was given: ``images`` ``Tensor[B, C, *S']`` padded at the end to whole
    patches (plain tensor, zeros on every padded voxel), ``mask`` ``Tensor[B, *S']`` (True = padding; None: none), ``spatial``
    the input's own ``S``, ``boxes`` each item's ``(start, stop)`` when the input's
    :class:`~vispos.Padding` knows them on the host (or None),
    ``meta`` the input ``MetaTensor`` (or None), ``shifts`` each item's box start when some
    start is not a multiple of the patch size (the items were then moved to the canvas origin:
    ``images``, ``mask`` and ``boxes`` hold them there; or None)."""

    images: Tensor
    mask: Tensor | None
    spatial: tuple[int, ...]
    boxes: Any
    meta: Any
    shifts: Any = None


def _roll_items(t: Tensor, shifts: Any, first: int) -> Tensor:
    """``t`` with item ``b`` rolled by ``shifts[b]`` along the axes from ``first`` on, as a
    per-item ``torch.roll``, for the whole batch in one gather: each axis's source index
    ``(i - shift) mod S`` is built on the host per item and sent in one transfer (differentiable,
    nothing read on the device, no loop over items)."""
    n = len(shifts[0])
    batch, sizes = t.shape[0], t.shape[first : first + n]
    if t.numel() == 0:  # nothing to move (and no index modulo a zero size)
        return t.clone()
    moved = torch.as_tensor(shifts, dtype=torch.int64).view(batch, n).numpy()
    tables = [(np.arange(size)[None, :] - moved[:, axis : axis + 1]) % size for axis, size in enumerate(sizes)]
    index = [torch.arange(batch, device=t.device).view(batch, *(1,) * n)]
    for axis, table in enumerate(_tracing.host_arrays(tables, t.device)):
        index.append(table.view(batch, *(size if j == axis else 1 for j, size in enumerate(sizes))))
    rolled = t.movedim(tuple(range(first, first + n)), tuple(range(1, n + 1)))  # (B, *S, ...)
    return rolled[tuple(index)].movedim(tuple(range(1, n + 1)), tuple(range(first, first + n)))


def _check_on_grid(mask: Tensor, patch: tuple[int, ...], name: str) -> None:
    """Refuses a mask without known boxes whose items start off the patch grid: such an item is
    cut into other patches than alone, and only a box can be moved to the origin (one read of
    the mask on the host)."""
    valid = ~mask
    n = len(patch)
    for axis, p in enumerate(patch):
        if p == 1:
            continue
        other = [d for d in range(1, n + 1) if d != axis + 1]
        line = valid.any(dim=other) if other else valid  # (B, S_axis)
        first = line.to(torch.int8).argmax(1)
        if bool((line.any(1) & (first % p != 0)).any()):
            raise ValueError(
                f"{name}: an item of the mask (shape {tuple(mask.shape)}, no box known) starts at a voxel "
                f"that is not a multiple of the patch size {patch} along spatial axis {axis}, so it would be "
                "cut into other patches than alone. Pass a NestedTensor with rectangular padding "
                "(Padding.from_sizes(sizes, spatial, starts=...) or Padding.from_mask(mask, classify=True)): "
                "its items are then moved to the origin and back, exactly; or pad at the end"
            )


class _AnySize:
    """What the two classes share: settings, input reading, the ViT encoder pass."""

    patch_size: tuple[int, ...]
    grid_size: tuple[int, ...] | None

    def _vit(self) -> ViT:  # pragma: no cover - abstract
        raise NotImplementedError

    def __prepare_scriptable__(self) -> Any:
        """``torch.jit.script`` calls this first: these classes do not script (see :func:`_no_torchscript`)."""
        raise _no_torchscript(type(self).__name__, "torch.jit.script")

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
        pos_embed = check_choice(pos_embed, _POS_EMBED, "pos_embed")
        antialias = check_bool(antialias, "antialias")
        temperature = check_temperature(temperature)
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
    def _read(self, x: Any) -> _Input:
        """The input, read once (see :class:`_Input`)."""
        name = type(self).__name__
        if torch.jit.is_tracing():
            raise _no_torchscript(name, "torch.jit.trace")
        n = len(self.patch_size)
        boxes = None
        if isinstance(x, NestedTensor):
            tensors, mask = x.decompose()
            if x.padding.kind == "rectangular":  # host facts: the positions need no mask read
                boxes = tuple(zip(x.padding.starts, x.padding.stops))
        elif not isinstance(x, Tensor) and isinstance(x, NestedTensorLike):
            tensors, mask = x.decompose()
        elif isinstance(x, Tensor):
            tensors, mask = x, None
        else:
            raise TypeError(f"{name} takes a NestedTensor or a Tensor (B, C, *S), got {type(x).__name__}")
        if not isinstance(tensors, Tensor) or tensors.dim() != n + 2:
            got = tuple(tensors.shape) if isinstance(tensors, Tensor) else type(tensors).__name__
            raise ValueError(f"{name} takes (B, C, *S) with {n} spatial axes, got {got}")
        meta = tensors if isinstance(tensors, MetaTensor) else None
        tensors = _plain(tensors)  # computed on plain tensors; metadata re-attached at the end
        spatial = tuple(tensors.shape[2:])
        shifts = None
        if mask is not None:
            check_mask(mask)
            if tuple(mask.shape) != (tensors.shape[0], *spatial):
                raise ValueError(f"mask must have shape {(tensors.shape[0], *spatial)}, got {tuple(mask.shape)}")
            mask = _plain(mask).to(tensors.device)
            # zeros in the padding, what an item alone gets in its last, partial patch (a padded
            # batch may hold any value there)
            tensors = tensors.masked_fill(mask.unsqueeze(1), 0)
            if boxes is not None and any(a % p for start, _ in boxes for a, p in zip(start, self.patch_size)):
                # an item off the patch grid: moved to the origin, cut into the patches it gets alone
                shifts = [start for start, _ in boxes]
                back = [tuple(-a for a in start) for start in shifts]
                tensors = _roll_items(tensors, back, 2)
                mask = _roll_items(mask, back, 1)
                boxes = tuple((tuple(0 for _ in start), tuple(e - a for a, e in zip(start, stop)))
                              for start, stop in boxes)
            elif boxes is None and not tracing():
                _check_on_grid(mask, self.patch_size, name)
        extra = [(-s) % p for s, p in zip(spatial, self.patch_size)]
        if any(extra):
            pad = [w for e in reversed(extra) for w in (0, e)]
            tensors = F.pad(tensors, pad)
            grown = torch.ones((tensors.shape[0], *tensors.shape[2:]), dtype=torch.bool, device=tensors.device)
            grown[(slice(None), *(slice(0, s) for s in spatial))] = False if mask is None else mask
            mask = grown
        return _Input(tensors, mask, spatial, boxes, meta, shifts)

    def token_mask(self, x: Any) -> Tensor:
        """The padding mask of ``x``'s patch grid: ``Tensor[B, *G]`` bool, True = padding.

        A patch is valid when it holds at least one valid voxel; ``G = ceil(S / patch_size)``.
        Tokens are ``G`` flattened row-major (after the class token, when the ViT has one).

        Raises:
            TypeError, ValueError: as ``forward``.
        """
        inp = self._read(x)
        tensors, mask = inp.images, inp.mask
        if mask is None:
            grid = [s // p for s, p in zip(tensors.shape[2:], self.patch_size)]
            return torch.zeros((tensors.shape[0], *grid), dtype=torch.bool, device=tensors.device)
        return self._place(~_token_valid(mask, self.patch_size), inp.shifts, 1)

    def _place(self, t: Tensor, shifts: Any, first: int) -> Tensor:
        """A patch-grid map of items moved to the origin (``shifts`` not None) moved back by whole
        patches: item ``b``'s cells start at ``shifts[b] // patch_size`` (axes from ``first``)."""
        if shifts is None:
            return t
        return _roll_items(t, [tuple(a // p for a, p in zip(start, self.patch_size)) for start in shifts], first)

    def _place_tokens(self, t: Tensor, shifts: Any, grid: tuple[int, ...]) -> Tensor:
        """Tokens ``Tensor[B, (1 +) N, hidden]`` moved back as :meth:`_place` (prefix tokens kept)."""
        if shifts is None:
            return t
        prefix = t.shape[1] - math.prod(grid)
        cells = self._place(t[:, prefix:].reshape(t.shape[0], *grid, t.shape[-1]), shifts, 1)
        return torch.cat((t[:, :prefix], cells.reshape(t.shape[0], -1, t.shape[-1])), dim=1)

    # ----------------------------------------------------------------------------- encoder
    def _positions(self, token_valid: Tensor | None, grid: tuple[int, ...], batch: int, boxes: Any) -> Tensor | None:
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
        if tracing():  # export, compile: no host read of the boxes, every item's table in tensors
            return self._resampled_items(token_valid, grid)
        if boxes is not None:  # the voxel boxes, known on the host: the patches that touch them
            patch = self.patch_size
            boxes = [
                (tuple(a // p for a, p in zip(start, patch)),
                 tuple(max(-(-e // p) - a // p, 1) for a, e, p in zip(start, stop, patch)))
                for start, stop in boxes
            ]
        else:
            boxes = _token_boxes(token_valid)
        out = table.new_zeros((batch, *grid, hidden))
        for b, (start, size) in enumerate(boxes):
            region = tuple(slice(a, a + s) for a, s in zip(start, size))
            out[(b, *region)] = self._resampled(size)
        return out.reshape(batch, -1, hidden)

    def _resampling_weights(self, axis: int, cells: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``Tensor[cells, cells, old]``: entry ``[s - 1, p, i]`` is the weight of the table's
        cell ``i`` along ``axis`` in output cell ``p`` when that axis is resized to ``s`` cells
        (rows ``p >= s`` are zero). ``F.interpolate``'s own weights, read off by resizing the
        identity along the axis (the other axes kept at 2 cells, which every mode maps to
        themselves; at 1 cell torch's antialiased modes give other weights): every mode
        :func:`~vispos.resample_abs_pos_embed` takes is separable, so a resized table is these
        weights applied along each axis in turn."""
        old = self.grid_size[axis]
        n = len(self.grid_size)
        shape = [old, 1] + [1] * n
        shape[2 + axis] = old
        expand = [old, 1] + [2] * n
        expand[2 + axis] = old
        basis = torch.eye(old, dtype=dtype, device=device).reshape(shape).expand(expand)
        first = tuple(slice(None) if d == axis else 0 for d in range(n))
        antialias = self.antialias and self.resample_mode in ("bilinear", "bicubic")
        rows = []
        for s in range(1, cells + 1):
            size = [2] * n
            size[axis] = s
            w = F.interpolate(basis, size=size, mode=self.resample_mode, antialias=antialias)
            w = w[(slice(None), 0, *first)].T  # (s, old)
            rows.append(F.pad(w, (0, 0, 0, cells - s)))
        return torch.stack(rows)

    def _resampled_items(self, token_valid: Tensor, grid: tuple[int, ...]) -> Tensor:
        """``Tensor[B, N, hidden]``: the table resampled to each item's box of valid patches and
        placed on it (zeros elsewhere), as the host path does, from tensors alone (no host read,
        no size that depends on the data: ``torch.export`` and ``torch.compile`` trace it)."""
        table = self._vit().patch_embedding.position_embeddings
        hidden = table.shape[-1]
        compute = torch.float64 if table.dtype == torch.float64 else torch.float32
        n, batch, device = len(grid), token_valid.shape[0], token_valid.device
        weights = []
        for axis, cells in enumerate(grid):
            other = [d for d in range(1, n + 1) if d != axis + 1]
            line = token_valid.any(dim=other)  # (B, cells): the item's extent along the axis
            found = line.any(1)
            first = line.to(torch.int8).argmax(1)
            last = cells - 1 - line.flip(1).to(torch.int8).argmax(1)
            start = torch.where(found, first, 0)
            size = torch.where(found, last - first + 1, 1)
            w = self._resampling_weights(axis, cells, compute, device)[size - 1]  # (B, cells, old)
            index = torch.arange(cells, device=device) - start[:, None]  # output cell -> item cell
            inside = (index >= 0) & (index < size[:, None])
            w = w.gather(1, index.clamp(0, cells - 1)[..., None].expand(-1, -1, w.shape[-1]))
            weights.append(w * inside[..., None].to(compute))
        grid_table = table[0].to(compute).reshape(*self.grid_size, hidden)
        equation = "bpi,bqj,ijc->bpqc" if n == 2 else "bpi,bqj,brk,ijkc->bpqrc"
        out = torch.einsum(equation, *weights, grid_table)
        return out.reshape(batch, -1, hidden).to(table.dtype)

    def _resampled(self, size: tuple[int, ...]) -> Tensor:
        table = self._vit().patch_embedding.position_embeddings
        new = resample_abs_pos_embed(
            table, new_size=size, old_size=self.grid_size, num_prefix_tokens=0,
            interpolation=self.resample_mode, antialias=self.antialias,
        )
        return new.reshape(*size, table.shape[-1])

    def _encode(self, images: Tensor, mask: Tensor | None, boxes: Any) -> tuple[Tensor, list[Tensor], Tensor | None]:
        """ViT's forward with per-grid positions and padded patches masked out of attention."""
        vit = self._vit()
        pe = vit.patch_embedding
        if has_hooks(pe):  # its code runs here, with each grid's positions: the module is not called
            raise ValueError(
                f"{type(self).__name__} runs the code of patch_embedding ({type(pe).__name__}) itself, with "
                "each item's positions on its own patch grid, and does not call the module, so the hooks "
                "registered on it would not run; remove them, or hook patch_embedding.patch_embeddings or a block"
            )
        batch = images.shape[0]
        grid = tuple(s // p for s, p in zip(images.shape[2:], self.patch_size))
        token_valid = None if mask is None else _token_valid(mask, self.patch_size)
        x = pe.patch_embeddings(images)
        if pe.proj_type == "conv":
            x = x.flatten(2).transpose(-1, -2)
        pos = self._positions(token_valid, grid, batch, boxes)
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
    sizes = (img_size,) * len(patch) if is_int(img_size) else tuple(img_size)
    sizes = tuple(as_int(s) for s in sizes)
    if len(sizes) != len(patch) or any(s is None or s <= 0 for s in sizes):
        raise ValueError(f"img_size must be {len(patch)} positive ints, got {describe(img_size)}")
    return tuple(s // p for s, p in zip(sizes, patch))


def _adopt(cls: type, model: nn.Module) -> Any:
    """A ``cls`` instance sharing ``model``'s submodules, parameters and buffers (no copy)."""
    obj = cls.__new__(cls)
    obj.__dict__.update({k: copy.copy(v) if isinstance(v, (dict, set)) else v for k, v in model.__dict__.items()})
    return obj



def _options(options: dict) -> dict:
    allowed = ("pos_embed", "resample_mode", "antialias", "temperature")
    unknown = [k for k in options if k not in allowed]
    if unknown:
        raise TypeError(f"unexpected options {unknown}; expected some of {allowed}")
    return options
