"""UNETR's convolutional decoder on padded batches, run by vispos' padding-invariance rule book.

The decoder (``encoder1`` .. ``encoder4``, ``decoder5`` .. ``decoder2``, ``out``) is traced with
vispos' tracer into a graph of five inputs, the image batch and four maps of ViT tokens on the
patch grid (the skip connections), and rewritten by
:func:`vispos.invariance.make_graph_invariant` as every backbone is: convolutions
and transposed convolutions read zeros outside each item, instance / group / batch norms take
their statistics over its cells only, and each map's padding comes from the token grid's valid
cells by convolution arithmetic (the token maps are one patch-sized window of the image batch;
each transposed convolution multiplies a box by its stride). A layer the rule book cannot make
exact is refused by name when the model is built.

The graph calls the UNETR's own layers (the same module objects) and is kept out of its
submodules, so ``state_dict`` keys and ``repr`` stay MONAI's; it is traced again when a decoder
layer was replaced since, and left out of copies and pickles (rebuilt on the next forward).

References:
    Hatamizadeh et al., UNETR, WACV 2022; MONAI ``networks/nets/unetr.py``; torch.fx
    (``GraphModule``); Dumoulin and Visin, A guide to convolution arithmetic for deep learning, 2016.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .._tracing import tracing
from ..invariance import (
    ModeGraphModule, UntraceableLayer, Window, make_graph_invariant, refuse_unrun_hooks, trace_features,
)
from ..padding import Padding

__all__ = ["DECODER", "InvariantDecoder", "decoder_padding"]

#: UNETR's decoder, in the order of its forward
DECODER = ("encoder1", "encoder2", "encoder3", "encoder4", "decoder5", "decoder4", "decoder3", "decoder2", "out")


class _Decoder(nn.Module):
    """UNETR's decoder as a module of its own (its layers keep UNETR's names): the image batch and
    the token maps of blocks 3, 6, 9 and the last, each ``Tensor[B, hidden, *G]``, in; logits out."""

    def __init__(self, unetr: nn.Module) -> None:
        super().__init__()
        for name in DECODER:
            self.add_module(name, getattr(unetr, name))

    def forward(self, images: Tensor, hidden3: Tensor, hidden6: Tensor, hidden9: Tensor, last: Tensor) -> Tensor:
        enc1 = self.encoder1(images)
        enc2 = self.encoder2(hidden3)
        enc3 = self.encoder3(hidden6)
        enc4 = self.encoder4(hidden9)
        dec3 = self.decoder5(last, enc4)
        dec2 = self.decoder4(dec3, enc3)
        dec1 = self.decoder3(dec2, enc2)
        return self.out(self.decoder2(dec1, enc1))


def _layers(unetr: nn.Module) -> tuple[nn.Module, ...]:
    return tuple(m for name in DECODER for m in getattr(unetr, name).modules())


def _names(unetr: nn.Module) -> tuple[str, ...]:
    return tuple(f"{name}.{sub}" for name in DECODER for sub, _ in getattr(unetr, name).named_modules())


def _structure(unetr: nn.Module) -> tuple[tuple[str, str, str], ...]:
    return _structure_of(_layers(unetr), _names(unetr))


def _structure_of(layers: tuple[nn.Module, ...], names: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """Each layer's name, class (by its qualified name: ``torch.export`` runs a copy whose classes
    are stand-ins of the same name) and settings (``extra_repr``: kernel, stride, padding, mode,
    ..., what the rules read)."""
    return tuple((name, f"{type(m).__module__}.{type(m).__qualname__}", m.extra_repr())
                 for name, m in zip(names, layers))


class InvariantDecoder:
    """UNETR's decoder traced and rewritten by the rule book (see the module docstring).

    Args:
        unetr (monai.networks.nets.UNETR): the model (its layers are used, never copied).
        patch_size (tuple of int): the ViT's patch size: the token maps are that window of the
            image batch.
        owner (str): the class name said in errors.

    Raises:
        ValueError: a decoder layer that torch.fx cannot trace or the rule book cannot make exact
            (named), as :func:`vispos.invariance.make_graph_invariant`.
    """

    def __init__(self, unetr: nn.Module, patch_size: tuple[int, ...], owner: str) -> None:
        n = len(patch_size)
        self.layers, self.names = _layers(unetr), _names(unetr)
        root = _Decoder(unetr)
        patch = Window(tuple(patch_size), tuple(patch_size), (0,) * n, (0,) * n, (1,) * n)
        try:
            self.graph = trace_features(root, n, class_name=f"{owner} decoder")
            self.runner = make_graph_invariant(self.graph, n, inputs=[(), (patch,), (patch,), (patch,), (patch,)])
        except UntraceableLayer as exc:
            raise ValueError(f"{owner}: the decoder runs on padded batches through vispos' padding-invariance "
                             f"rule book, which needs it traced with torch.fx: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"{owner}: the decoder cannot be made exact on padded batches: {exc}") from exc

    def fits(self, unetr: nn.Module) -> bool:
        """Whether ``unetr``'s decoder still holds the layers this graph calls."""
        layers = _layers(unetr)
        return len(layers) == len(self.layers) and all(a is b for a, b in zip(layers, self.layers))

    def rebound(self, unetr: nn.Module) -> "InvariantDecoder | None":
        """This rewritten graph over ``unetr``'s own layers, when its decoder is built as this one
        (the same names, classes and settings: a copy of the model, such as ``torch.export``
        makes, or a layer replaced by one of the same settings), without tracing again; None
        when it is not."""
        if _structure(unetr) != _structure_of(self.layers, self.names):
            return None
        twin = copy.copy(self)
        twin.layers = _layers(unetr)
        graphs = (copy.deepcopy(self.graph.train_graph), copy.deepcopy(self.graph.eval_graph))
        twin.graph = ModeGraphModule.of(_Decoder(unetr), *graphs, class_name=self.graph.__class__.__name__)
        return twin

    def __call__(self, training: bool, images: Tensor, tokens: list[Tensor], padding: Padding | None) -> Tensor:
        """The logits ``Tensor[B, out_channels, *S]`` of ``images`` ``Tensor[B, C, *S]`` and the four
        token maps; ``padding`` (``(B, *S)``, whole patches) None for a batch without padding."""
        self.graph.use_mode(training)
        refuse_unrun_hooks(self.graph, ((n.rstrip("."), m) for n, m in zip(self.names, self.layers)),
                           "the decoder runs on padded batches through vispos' padding-invariance rule book,")
        if padding is None:
            out = self.graph(images, *tokens)
        else:
            out = self.graph(images, *tokens, tuple(self.runner.paddings(padding, nearest=True)))
        (logits,) = pytree.tree_leaves(out)
        return logits


def decoder_padding(token_valid: Tensor, boxes: Any, patch: tuple[int, ...], canvas: tuple[int, ...]) -> Padding:
    """The padding of the decoder's image batch: each item's valid patches, voxel by voxel.

    Args:
        token_valid (Tensor[B, *G], bool): True on patches that hold a valid voxel.
        boxes (tuple of (start, stop) per item, or None): the items' voxel boxes when known on the
            host; a patch holding any of them is valid.
        patch (tuple of int): the patch size. canvas (tuple of int): ``S = G * patch``.

    Returns:
        Padding: ``(B, *S)``: rectangular (whole patches) from host boxes or a box mask read on
        the host; while tracing (export, compile), the patch mask repeated over its voxels, never
        read on the host.
    """
    if boxes is not None and not tracing():
        starts = [tuple(a // p * p for a, p in zip(start, patch)) for start, _ in boxes]
        stops = [tuple(-(-e // p) * p if e > a else a // p * p for a, e, p in zip(start, stop, patch))
                 for start, stop in boxes]
        sizes = [tuple(e - a for a, e in zip(s, t)) for s, t in zip(starts, stops)]
        return Padding.from_sizes(sizes, canvas, starts=starts, device=token_valid.device)
    mask = ~token_valid
    for axis, p in enumerate(patch):
        mask = mask.repeat_interleave(p, dim=1 + axis)
    return Padding.from_mask(mask)

