"""Helpers shared by the backbone adapters: checkpoint loading with a report, frozen batch norm,
frozen stages, stem adaptation to the input's channel count and measured level shapes.

Private module; the public names are re-exported by :mod:`vispos.backbones`.

References:
    torchvision ``ops.FrozenBatchNorm2d``; Carion et al., DETR ``models/backbone.py`` (frozen
    batch norm, ``train_backbone``); timm ``models/_manipulate.py`` (``adapt_input_conv``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from .._checks import check_bool, check_int

__all__ = [
    "FrozenBatchNorm3d",
    "freeze_batch_norm",
    "load_checkpoint_state",
    "load_state_with_report",
    "format_load_report",
]

log = logging.getLogger("vispos.backbones")

_PREFIXES = ("module.", "model.", "backbone.0.body.", "backbone.body.", "backbone.", "body.")
# buffers a checkpoint may lack without changing the computation
_OPTIONAL_SUFFIXES = ("num_batches_tracked",)


# ------------------------------------------------------------------------------- checkpoints
def load_checkpoint_state(path: str | os.PathLike) -> dict[str, Tensor]:
    """Reads a state dict from a local ``.pt`` / ``.pth`` / ``.bin`` or ``.safetensors`` file.

    A checkpoint that wraps the weights (``{"model": ...}``, ``{"state_dict": ...}``) is unwrapped.
    Nothing is downloaded; ``.pt`` files are read with ``weights_only=True``.

    Args:
        path (str | PathLike): the file.

    Returns:
        dict[str, Tensor]: the state dict, tensors on the CPU.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is corrupt or truncated, or holds no mapping of names to tensors.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint_path {path!r} does not exist or is not a file")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state: Any = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise
    except Exception as exc:  # a truncated / corrupt file: pickle, zip and safetensors errors
        raise ValueError(
            f"checkpoint_path {path!r} could not be read as a torch or safetensors state dict "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
            state = state[key]
            break
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"checkpoint_path {path!r} does not hold a state dict of tensors")
    return dict(state)


def _strip_prefixes(state: Mapping[str, Tensor], own: set[str]) -> tuple[dict[str, Tensor], str]:
    """Drops a wrapper prefix (``module.``, DETR's ``backbone.0.body.``, ...) when that makes more
    keys match the model's own; returns the new dict and the prefix dropped (``""`` if none)."""
    best, best_prefix = dict(state), ""
    best_hits = len(own & best.keys())
    for prefix in _PREFIXES:
        stripped = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
        hits = len(own & stripped.keys())
        if hits > best_hits:
            best, best_hits, best_prefix = stripped, hits, prefix
    return best, best_prefix


def load_state_with_report(
    module: nn.Module, state: Mapping[str, Tensor], source: str = "checkpoint_path"
) -> dict[str, Any]:
    """Loads ``state`` into ``module`` (after stripping a wrapper prefix) and reports what happened.

    Keys the module lacks (a classifier head, say) are ignored and reported; keys the module needs
    but ``state`` lacks, and tensors of the wrong shape, raise. ``num_batches_tracked`` buffers may
    be absent (DETR's FrozenBatchNorm checkpoints have none).

    Args:
        module (nn.Module): receives the weights (modified in place: it is the adapter's own copy).
        state (Mapping[str, Tensor]): e.g. from :func:`load_checkpoint_state`; not modified.
        source (str): names the checkpoint in messages.

    Returns:
        dict: ``{"source": str, "prefix_stripped": str, "loaded": [keys], "missing": [keys],
        "unexpected": [keys]}`` (``missing`` is always empty: missing weights raise).

    Raises:
        ValueError: weights the module needs are missing, or have another shape (the message
            names up to five of them and the keys the file does hold).
    """
    own_state = module.state_dict()
    own = set(own_state)
    stripped, prefix = _strip_prefixes(state, own)
    missing = sorted(k for k in own - stripped.keys() if not k.endswith(_OPTIONAL_SUFFIXES))
    unexpected = sorted(stripped.keys() - own)
    if missing:
        raise ValueError(
            f"{source}: checkpoint {source!r} lacks {len(missing)} backbone weights, e.g. "
            f"{missing[:5]}; it holds keys such as {sorted(stripped)[:5]}"
        )
    mismatched = [
        f"{k}: checkpoint {tuple(stripped[k].shape)} vs backbone {tuple(own_state[k].shape)}"
        for k in sorted(own & stripped.keys())
        if tuple(stripped[k].shape) != tuple(own_state[k].shape)
    ]
    if mismatched:
        raise ValueError(
            f"{source}: {len(mismatched)} checkpoint tensors have the wrong shape, e.g. {mismatched[:5]}"
        )
    loaded = sorted(own & stripped.keys())
    module.load_state_dict({k: stripped[k] for k in loaded}, strict=False)
    report = {
        "source": source,
        "prefix_stripped": prefix,
        "loaded": loaded,
        "missing": missing,
        "unexpected": unexpected,
    }
    log.info("%s", format_load_report(report))
    return report


def format_load_report(report: Mapping[str, Any]) -> str:
    """One line summarising a load report from :func:`load_state_with_report`."""
    unexpected = list(report.get("unexpected", []))
    text = (
        f"loaded {len(report.get('loaded', []))} tensors from {report.get('source')!r}"
        + (f" (prefix {report['prefix_stripped']!r} stripped)" if report.get("prefix_stripped") else "")
        + f"; missing {len(report.get('missing', []))}; ignored {len(unexpected)} keys not in the backbone"
    )
    if unexpected:
        text += f", e.g. {unexpected[:5]}"
    return text


# ----------------------------------------------------------------------------- frozen norms
class FrozenBatchNorm3d(FrozenBatchNorm2d):
    """Batch norm over ``(N, C, D, H, W)`` with fixed statistics and affine parameters.

    torchvision's :class:`~torchvision.ops.FrozenBatchNorm2d` (same buffers, same state-dict keys,
    ``num_batches_tracked`` dropped on load) with the per-channel scale broadcast over three
    spatial axes: ``y = x * w / sqrt(running_var + eps) + (b - running_mean * w / sqrt(...))``.

    Args:
        num_features (int): ``C``.
        eps (float): added to the variance. Default 1e-5.

    Shape:
        input and output ``Tensor[N, C, D, H, W]``, same dtype.

    References:
        torchvision ``ops.misc.FrozenBatchNorm2d``; DETR ``models/backbone.py``.
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 5:
            raise ValueError(f"FrozenBatchNorm3d expects (N, C, D, H, W), got shape {tuple(x.shape)}")
        shape = (1, -1, 1, 1, 1)
        scale = self.weight.reshape(shape) * (self.running_var.reshape(shape) + self.eps).rsqrt()
        bias = self.bias.reshape(shape) - self.running_mean.reshape(shape) * scale
        return x * scale + bias


def _frozen_copy(bn: nn.Module, n_spatial: int) -> nn.Module | None:
    """A frozen twin of one batch-norm module, or None when ``bn`` is not one we convert."""
    frozen: nn.Module
    if type(bn).__name__ in ("BatchNormAct2d", "SyncBatchNormAct") and type(bn).__module__.startswith("timm"):
        from timm.layers import FrozenBatchNormAct2d

        frozen = FrozenBatchNormAct2d(bn.num_features, eps=bn.eps, apply_act=False)
        frozen.act, frozen.drop = bn.act, bn.drop  # keep timm's fused activation
    elif type(bn) is nn.BatchNorm3d or (type(bn) is nn.SyncBatchNorm and n_spatial == 3):
        frozen = FrozenBatchNorm3d(bn.num_features, eps=bn.eps)
    elif type(bn) in (nn.BatchNorm2d, nn.SyncBatchNorm):
        frozen = FrozenBatchNorm2d(bn.num_features, eps=bn.eps)
    else:
        return None
    with torch.no_grad():
        if bn.affine:
            frozen.weight.copy_(bn.weight.detach())
            frozen.bias.copy_(bn.bias.detach())
        if bn.track_running_stats and bn.running_mean is not None:
            frozen.running_mean.copy_(bn.running_mean)
            frozen.running_var.copy_(bn.running_var)
    ref = bn.running_mean if bn.running_mean is not None else bn.weight
    return frozen.to(device=ref.device, dtype=ref.dtype)


def freeze_batch_norm(module: nn.Module, n_spatial: int = 2) -> nn.Module:
    """Replaces every ``BatchNorm2d`` / ``BatchNorm3d`` in ``module`` by a frozen twin, in place.

    ``nn.BatchNorm2d`` and ``nn.SyncBatchNorm`` become torchvision's ``FrozenBatchNorm2d``,
    ``nn.BatchNorm3d`` becomes :class:`FrozenBatchNorm3d`, timm's ``BatchNormAct2d`` becomes timm's
    ``FrozenBatchNormAct2d`` (so its fused activation is kept). Statistics, affine parameters and
    ``eps`` are copied, so the output equals the original module's in ``eval()`` mode.

    Args:
        module (nn.Module): modified in place; the adapters call this on their own private copy.
        n_spatial (int): 2 or 3, the rank a ``SyncBatchNorm`` (which does not know it) works on.

    Returns:
        nn.Module: ``module`` itself, or its replacement when ``module`` is a batch norm.

    References:
        DETR ``models/backbone.py`` (``FrozenBatchNorm2d``); torchvision ``ops.FrozenBatchNorm2d``.
    """
    top = _frozen_copy(module, n_spatial)
    if top is not None:
        return top
    for name, child in list(module.named_children()):
        frozen = _frozen_copy(child, n_spatial)
        if frozen is not None:
            setattr(module, name, frozen)
        else:
            freeze_batch_norm(child, n_spatial)
    return module


def freeze_through(module: nn.Module, boundary: str | None) -> list[str]:
    """Stops gradients of every parameter registered up to and including module ``boundary``.

    Modules are taken in registration order (``named_modules()``), which is execution order for
    the CNNs the adapters wrap; ``boundary=None`` freezes everything.

    Returns:
        list[str]: the names of the parameters frozen.

    Raises:
        ValueError: ``boundary`` is not a module of ``module``.
    """
    names = [n for n, _ in module.named_modules()]
    if boundary is None:
        end = len(names) - 1
    else:
        if boundary not in names:
            raise ValueError(f"module {boundary!r} not found; modules are e.g. {names[1:12]}")
        start = names.index(boundary)
        end = max(i for i, n in enumerate(names) if i == start or n.startswith(boundary + "."))
    frozen = []
    for name, mod in list(module.named_modules())[: end + 1]:
        for pname, p in mod.named_parameters(recurse=False):
            p.requires_grad_(False)
            frozen.append(f"{name}.{pname}" if name else pname)
    return frozen


def check_in_chans(in_chans: Any, allow_none: bool = False) -> None:
    """Validates a backbone's input channel count: a positive int (or None where allowed).

    Raises:
        TypeError: not an int. ValueError: not positive.
    """
    if in_chans is None and allow_none:
        return
    check_int(in_chans, "in_chans", minimum=1)


def check_input_device(tensors: Tensor, module: nn.Module) -> None:
    """Raises ``ValueError`` when ``tensors`` and ``module``'s first parameter are on different
    devices (torch would otherwise fail deep inside the first convolution)."""
    param = next(iter(module.parameters()), None)
    if param is not None and param.device != tensors.device:
        raise ValueError(
            f"x is on {tensors.device} but the backbone's weights are on {param.device}; move the "
            f"model with .to({str(tensors.device)!r}) or the batch with x.to({str(param.device)!r})"
        )


_AUTOCAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_input_dtype(tensors: Tensor, module: nn.Module) -> None:
    """Raises ``TypeError`` when ``tensors`` cannot go through ``module``'s weights as they are
    (torch would otherwise fail inside the first convolution with "expected scalar type Byte but
    found Float"): an integer batch always (images must be converted to float and normalized
    first), a floating batch of another dtype than the weights unless ``torch.autocast`` is on
    for its device and both are float32 / float16 / bfloat16 (autocast then casts them)."""
    param = next((p for p in module.parameters() if p.is_floating_point()), None)
    if param is None or tensors.dtype == param.dtype:
        return
    if not tensors.is_floating_point():
        raise TypeError(
            f"x.tensors has dtype {tensors.dtype} but the backbone's weights are {param.dtype}; "
            "convert the images to float and normalize them first, e.g. "
            "torchvision.transforms.v2.ToDtype(torch.float32, scale=True) then Normalize(mean, std) "
            "(or x.tensors.float() / 255)"
        )
    device_type = tensors.device.type
    if (
        torch.is_autocast_enabled(device_type)
        and tensors.dtype in _AUTOCAST_DTYPES
        and param.dtype in _AUTOCAST_DTYPES
    ):
        return
    raise TypeError(
        f"x.tensors has dtype {tensors.dtype} but the backbone's weights are {param.dtype}; cast "
        f"the batch with x.to({param.dtype}) or the model with .to({tensors.dtype}), or run under "
        f"torch.autocast({device_type!r}) (float32, float16 and bfloat16 only)"
    )


def check_freeze_args(train_backbone: Any, frozen_stages: Any, frozen_batch_norm: Any) -> None:
    """Validates the freezing keywords the adapters share."""
    check_bool(train_backbone, "train_backbone")
    check_bool(frozen_batch_norm, "frozen_batch_norm")
    check_int(frozen_stages, "frozen_stages", minimum=-1)  # -1: train every stage


# --------------------------------------------------------------------------------- the stem
def first_conv(module: nn.Module) -> tuple[str, nn.Module]:
    """The name and module of the first ``Conv2d`` / ``Conv3d`` in registration order.

    Raises:
        ValueError: the module has no convolution.
    """
    for name, mod in module.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Conv3d)):
            return name, mod
    raise ValueError(f"{type(module).__name__} has no Conv2d / Conv3d to read the input channels from")


def adapt_stem(module: nn.Module, in_chans: int) -> None:
    """Gives the first convolution of ``module`` ``in_chans`` input channels, in place.

    Every new input channel gets the mean of the old ones' kernels times ``old / in_chans``, so an
    input whose channels are all equal gives the same response as before (for ``in_chans=1``
    this is the sum over the RGB kernels, timm's ``adapt_input_conv``).

    Raises:
        ValueError: the stem convolution is grouped.

    References:
        timm ``models/_manipulate.py`` (``adapt_input_conv``).
    """
    name, conv = first_conv(module)
    if conv.in_channels == in_chans:
        return
    if conv.groups != 1:
        raise ValueError(f"cannot adapt the grouped stem convolution {name!r} to in_chans={in_chans}")
    old = conv.in_channels
    weight = conv.weight.detach()
    new_weight = weight.mean(dim=1, keepdim=True).expand(-1, in_chans, *weight.shape[2:]) * (old / in_chans)
    cls = type(conv)
    new = cls(
        in_chans, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
        dilation=conv.dilation, groups=1, bias=conv.bias is not None, padding_mode=conv.padding_mode,
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(new_weight)
        if conv.bias is not None:
            new.bias.copy_(conv.bias.detach())
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, child, new)


# ---------------------------------------------------------------------------- measured shapes
@torch.no_grad()
def measure_levels(
    forward, module: nn.Module, in_chans: int, probe: Sequence[int]
) -> tuple[list[int], list[tuple[int, ...]]]:
    """Runs ``forward`` once on zeros ``(1, in_chans, *probe)`` in eval mode and reads each output's
    channels and per-axis stride (``probe / output size``). Training mode is restored after.

    Returns:
        ``(channels, strides)``: one int and one tuple of ``len(probe)`` ints per level.
    """
    was_training = module.training
    module.eval()
    try:
        param = next(iter(module.parameters()), None)
        buf = next(iter(module.buffers()), None)
        ref = param if param is not None else buf
        kwargs = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
        outs = forward(torch.zeros(1, in_chans, *probe, **kwargs))
    finally:
        module.train(was_training)
    channels = [int(o.shape[1]) for o in outs]
    strides = [
        tuple(max(1, round(p / s)) for p, s in zip(probe, o.shape[2:])) for o in outs
    ]
    return channels, strides
