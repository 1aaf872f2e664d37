"""A timm ``features_only`` model as a source of padded feature levels.

References:
    Wightman, PyTorch Image Models (timm), ``features_only=True`` and ``feature_info``;
    Carion et al., DETR ``models/backbone.py`` (mask resized to each level, frozen batch norm,
    ``train_backbone``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torch.fx.proxy import TraceError

from .._checks import as_sequence, check_bool, check_int, describe
from .._suggest import close_names
from ..invariance import PackedRunner, TokenRunner, make_graph_invariant, trace_dual
from ._batch_norm import freeze_batch_norm
from ._checkpoints import load_checkpoint_state, load_state_with_report
from ._freezing import check_freeze_args, freeze_through
from ._pretrained import cached_timm_weights
from .base import BackboneAdapter

__all__ = ["TimmBackbone"]


class TimmBackbone(BackboneAdapter):
    """A timm model with ``features_only=True``, returning one :class:`NestedTensor` per level.

    Channels and strides are read from timm's ``feature_info``, never hard-coded (a test checks
    them against real outputs); each level's mask is the input mask resized (nearest) to that
    level's spatial size.

    Args:
        model_name (str): a timm model name (``timm.list_models()``), e.g. ``"resnet50"``.
        out_indices (sequence of int, optional): feature levels to return, timm's indices (for
            ResNets ``0`` is the stem at stride 2 and ``1..4`` are strides 4..32; for a ViT / EVA /
            DINOv3 / SAM ViT, the blocks; for Swin, the stages); negative indices count from the
            last. The levels come back in block order, each once, whatever order this lists them
            in (as timm's ``features_only`` model returns them: ``(2, 0)`` gives levels 0 and 2,
            ``(1, 1)`` one level), in every mode; ``self.out_indices`` and the metadata follow that
            order. Default None: the model's last level, as DETR uses (``4`` for ResNets, the last
            block of a ViT, the last stage of Swin).
        pretrained (bool): load timm's pretrained weights from where timm caches them on this
            machine (the Hugging Face hub cache, or the torch hub cache for weights timm fetches
            by URL). Default False. Nothing is downloaded: weights that are not cached raise
            ``FileNotFoundError`` at once, naming the places looked at (on a machine with network
            access, ``timm.create_model(model_name, pretrained=True)`` fills the cache; or save
            the weights once and pass them as ``checkpoint_path``).
        checkpoint_path (str, optional): a local ``.pt`` / ``.pth`` / ``.safetensors`` state dict
            to load (wrapper prefixes such as ``module.`` or DETR's ``backbone.0.body.`` are
            stripped). Keys the backbone lacks (e.g. a classifier head) are reported in
            ``load_report`` and logged at INFO level; keys the backbone needs but the file lacks,
            or tensors of another shape, raise.
        in_chans (int): input channels. Default 3.
        train_backbone (bool): False stops the gradient of every backbone parameter (DETR's
            ``lr_backbone = 0``). Default True.
        frozen_stages (int): ``-1`` (default) trains every stage; ``k >= 0`` freezes every
            parameter up to and including the module that produces timm feature index ``k``
            (ResNets: ``0`` the stem, ``1`` the stem and ``layer1``, DETR's choice).
        frozen_batch_norm (bool): replace every batch norm by torchvision's
            ``FrozenBatchNorm2d`` (timm's ``BatchNormAct2d`` by its frozen twin), with the same
            statistics: what DETR trains with. Default False.
        padding_invariant (bool): an image in a padded batch (placed at the origin, DETR's
            layout) gets on its own cells exactly the features it gets alone, on every level, in
            eval and training mode: the model is traced with torch.fx and every layer that mixes
            cells is rewritten (convolutions and pools see zeros / ``-inf`` outside the item, batch
            norm in training, group norm and global pooling take statistics over valid cells), and
            each level's mask marks exactly the cells outside the item's own feature map
            (convolution arithmetic, not nearest resizing). Models whose features timm collects
            with forward hooks (``feature_cls='hook'``: Xception, NASNet, PiT) are traced to the
            hooked modules. A vision transformer with a token-model rule (timm's
            ``VisionTransformer`` and ``Eva``: ViT, DeiT 3, EVA-02, DINOv3, RoPE ViTs) runs as a whole
            instead: each item gets its own resampled position table and RoPE coordinates, and
            attention masks the keys outside the item. Layers and models that cannot be made exact
            are refused here, by name. Default False: DETR's numbers (docs/padding-invariance.md).
        packed (bool): timm's ``VisionTransformer`` and ``Eva`` families only: every item's tokens
            run in one sequence without padding tokens (attention per item, positions per item) and
            come back as the levels of ``padding_invariant=True`` (to rounding); ``forward`` also
            takes a list of ``(C, H, W)`` images. Other models are refused by name. Not together
            with ``padding_invariant``. Default False (docs/padding-invariance.md).
        model_kwargs (dict, optional): more keyword arguments for ``timm.create_model`` (e.g.
            ``{"drop_path_rate": 0.1}``, or a small ``depth`` / ``embed_dim``). Vision
            transformers are built with ``dynamic_img_size=True`` (any input size, the learned
            table resampled to it) and ``dynamic_img_pad=True`` (an edge that is not a multiple of
            the patch padded with zeros; timm alone refuses such a size) unless this says otherwise. Not modified. Default None.

    Attributes:
        out_indices (tuple[int, ...]): the returned levels' feature indices, non-negative, in block
            order, each once.
        num_channels (list[int]): channels of each returned level.
        strides (list[int]): reduction factor of each returned level.
        num_axes (int): 2.
        load_report (dict | None): ``{"source", "prefix_stripped", "loaded", "missing",
            "unexpected"}`` of the last checkpoint load (see :func:`format_load_report`).

    Shape:
        - input: NestedTensor ``(B, in_chans, H, W)`` with mask ``(B, H, W)`` (or none).
        - output: list of NestedTensor ``(B, num_channels[l], H_l, W_l)`` in the input's dtype,
          masks ``(B, H_l, W_l)`` bool, True = padding.

    Raises:
        TypeError: ``model_name`` is not a str; ``out_indices`` is not a sequence of ints;
            ``model_kwargs`` is not a dict with str keys, or holds a keyword the model does not
            take (timm's own error); a non-int ``in_chans`` / ``frozen_stages``; a non-bool ``pretrained`` /
            ``train_backbone`` / ``frozen_batch_norm``; ``forward`` is given anything but a
            NestedTensor.
        ValueError: an unknown model name; an empty ``out_indices`` or one not supported by the
            model; a ``model_kwargs`` value timm's constructor refuses (timm's ``ValueError`` /
            ``AssertionError``, its message kept);
            ``in_chans`` <= 0; an input on another device than the weights; a corrupt
            checkpoint; ``frozen_stages`` < -1 or beyond the model's stages; input channels other
            than ``in_chans``; the checkpoint lacks weights the backbone needs or has wrong shapes;
            ``pretrained=True`` for a model timm has no weights for; with ``padding_invariant=True``,
            a token model (a vision transformer timm runs through ``forward_intermediates``: BEiT,
            CaiT, XCiT, MViTv2, CrossViT, ...) whose class has no token-model rule (named, with
            the classes that have one), a layer that cannot be made exact or that torch.fx cannot
            trace (named), a traced graph that returns fewer levels than ``out_indices`` asks,
            and at ``forward`` an
            arbitrary (non-box) mask or an item too small for the model.
        FileNotFoundError: ``checkpoint_path`` does not exist; ``pretrained=True`` and timm's
            weights for ``model_name`` are not cached on this machine.

    References:
        timm ``features_only`` / ``FeatureInfo``; DETR ``models/backbone.py``.
    """

    num_axes = 2

    def __init__(
        self,
        model_name: str,
        out_indices: Sequence[int] | None = None,
        pretrained: bool = False,
        checkpoint_path: str | None = None,
        in_chans: int = 3,
        train_backbone: bool = True,
        frozen_stages: int = -1,
        frozen_batch_norm: bool = False,
        padding_invariant: bool = False,
        model_kwargs: dict[str, Any] | None = None,
        packed: bool = False,
    ) -> None:
        super().__init__()
        import timm

        if not isinstance(model_name, str):
            raise TypeError(f"model_name must be a str, got {type(model_name).__name__}")
        if out_indices is None:
            indices: tuple[int, ...] = (-1,)
        else:
            entries = as_sequence(out_indices)
            if entries is None:
                raise TypeError(f"out_indices must be a non-empty sequence of ints, got {describe(out_indices)}")
            indices = tuple(check_int(index, f"out_indices[{i}]") for i, index in enumerate(entries))
            if len(indices) == 0:
                raise ValueError(f"out_indices must be a non-empty sequence of ints, got {describe(out_indices)}")
        out_indices = indices
        if model_kwargs is None:
            model_kwargs = {}
        elif not (isinstance(model_kwargs, dict) and all(isinstance(k, str) for k in model_kwargs)):
            raise TypeError(f"model_kwargs must be a dict with str keys, got {describe(model_kwargs)}")
        pretrained = check_bool(pretrained, "pretrained")
        padding_invariant = check_bool(padding_invariant, "padding_invariant")
        if check_bool(packed, "packed") and padding_invariant:
            raise ValueError("packed=True is exact per item already (the padded invariant run without padding "
                             "tokens): pass packed=True or padding_invariant=True, not both")
        frozen_stages = check_freeze_args(train_backbone, frozen_stages, frozen_batch_norm)
        in_chans = check_int(in_chans, "in_chans", minimum=1)
        if not timm.is_model(model_name):
            close = close_names(model_name.split(".")[0], timm.list_models())  # nearest first
            raise ValueError(f"model_name {model_name!r} is not a timm model; nearest names: {close}")
        extra: dict[str, Any] = {**_family_kwargs(model_name), **model_kwargs}
        if pretrained:  # from the local cache only: timm alone would retry the network for ~50 s
            extra["pretrained_cfg_overlay"] = {"file": cached_timm_weights(model_name), "source": "timm"}
        try:
            self.body = timm.create_model(
                model_name,
                pretrained=pretrained,
                features_only=True,
                out_indices=tuple(out_indices),
                in_chans=in_chans,
                **extra,
            )
        except (IndexError, AssertionError, ValueError) as exc:
            if _from_feature_selection(exc):
                raise ValueError(
                    f"out_indices {tuple(out_indices)} are not available for {model_name!r}: {exc}"
                ) from exc
            raise ValueError(
                f"timm.create_model({model_name!r}, features_only=True, out_indices={tuple(out_indices)}, "
                f"in_chans={in_chans}, **{model_kwargs!r}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.model_name = model_name
        self.model_kwargs = dict(model_kwargs)
        self.out_indices = _in_block_order(self.body)
        self.pretrained = pretrained
        self.checkpoint_path = checkpoint_path
        self.in_chans = in_chans
        self.train_backbone = train_backbone
        self.frozen_stages = frozen_stages
        self.frozen_batch_norm = frozen_batch_norm
        self.num_channels = list(self.body.feature_info.channels())
        self.strides = list(self.body.feature_info.reduction())
        self.load_report: dict[str, Any] | None = None
        if checkpoint_path is not None:
            self.load_report = self.load_checkpoint(checkpoint_path)
        if frozen_batch_norm:
            freeze_batch_norm(self.body, num_axes=2)
        self._freeze()
        if packed:
            self._packed = PackedRunner.for_model(_token_model(self.body), model_name, self.out_indices, _token_model)
        if padding_invariant:  # last: the traced graph shares the frozen, loaded modules
            model = _token_model(self.body)
            self._invariant = TokenRunner.for_model(model, self.out_indices, _token_model)
            if self._invariant is None:  # no token-model rule: traced and rewritten layer by layer
                try:
                    self.body = trace_dual(self.body, num_axes=2, n_levels=len(self.out_indices))
                    self._invariant = make_graph_invariant(self.body, num_axes=2)
                except (ValueError, TraceError) as exc:
                    if model is None:  # a CNN's own refusal names its layer
                        raise
                    raise TokenRunner.refusal(model, model_name, exc) from exc

    def _stage_module(self, index: int) -> str:
        """The name, inside ``self.body``, of the module producing timm feature ``index``."""
        info = self.body.feature_info.info
        if index >= len(info):
            raise ValueError(
                f"frozen_stages={index} but {self.model_name!r} has feature indices 0..{len(info) - 1}"
            )
        name = info[index]["module"]
        names = {n for n, _ in self.body.named_modules()}
        for candidate in (name, name.replace(".", "_"), f"model.{name}"):  # the last: FeatureGetterNet
            if candidate in names:
                return candidate
        raise ValueError(
            f"frozen_stages={index}: module {name!r} of {self.model_name!r} is not part of the "
            f"feature model (out_indices {self.out_indices} stop before it)"
        )

    def _freeze(self) -> None:
        if not self.train_backbone:
            freeze_through(self.body, None)
        elif self.frozen_stages >= 0:
            freeze_through(self.body, self._stage_module(self.frozen_stages))

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Loads a local state dict into the backbone and returns its load report.

        Args:
            path (str | PathLike): ``.pt`` / ``.pth`` / ``.bin`` / ``.safetensors``.

        Returns:
            dict: ``{"source", "prefix_stripped", "loaded", "missing", "unexpected"}``.

        Raises:
            FileNotFoundError: no such file.
            ValueError: weights the backbone needs are missing from the file or have another
                shape.
        """
        state = load_checkpoint_state(path)
        return load_state_with_report(self.body, state, source=os.fspath(path))

    def _features(self, tensors):
        return list(self.body(tensors))

    def extra_repr(self) -> str:
        return (
            f"model_name={self.model_name!r}, out_indices={self.out_indices}, "
            f"pretrained={self.pretrained}, checkpoint_path={self.checkpoint_path!r}, "
            f"in_chans={self.in_chans}, train_backbone={self.train_backbone}, "
            f"frozen_stages={self.frozen_stages}, frozen_batch_norm={self.frozen_batch_norm}, "
            f"padding_invariant={self.padding_invariant}, packed={self._packed is not None}"
        )


#: options every model of a timm module gets by default: vision transformers take any input size
#: (``dynamic_img_size``, the table resampled to it; ``dynamic_img_pad``, an edge that is not a
#: multiple of the patch padded with zeros, where timm would refuse the size); Swin returns its stages channels-first through ``forward_intermediates``
_FAMILY_KWARGS: dict[str, dict[str, Any]] = {
    "timm.models.vision_transformer": {"dynamic_img_size": True, "dynamic_img_pad": True},
    "timm.models.deit": {"dynamic_img_size": True, "dynamic_img_pad": True},
    "timm.models.eva": {"dynamic_img_size": True, "dynamic_img_pad": True},
    "timm.models.swin_transformer": {"dynamic_img_size": True, "feature_cls": "getter"},
    "timm.models.swin_transformer_v2": {"dynamic_img_size": True, "feature_cls": "getter"},
}


def _family_kwargs(model_name: str) -> dict[str, Any]:
    """The default ``timm.create_model`` options of ``model_name``'s family (see ``_FAMILY_KWARGS``)."""
    from timm.models import model_entrypoint, split_model_name_tag

    module = model_entrypoint(split_model_name_tag(model_name)[0]).__module__
    return dict(_FAMILY_KWARGS.get(module, {}))


def _from_feature_selection(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by timm's feature selection (``timm/models/_features*.py``:
    an out-of-range ``out_indices``) rather than by the model's own constructor (a bad
    ``model_kwargs`` value)."""
    tb = exc.__traceback__
    while tb is not None:
        parts = tb.tb_frame.f_code.co_filename.replace("\\", "/").split("/")
        if parts[-2:-1] == ["models"] and parts[-1].startswith("_features") and "timm" in parts:
            return True
        tb = tb.tb_next
    return False


def _in_block_order(body: Any) -> tuple[int, ...]:
    """The feature indices ``body`` returns, non-negative, in block order, each once: timm's
    ``features_only`` wrappers return their levels so (``forward_intermediates`` takes its indices
    as a set; the hook and graph wrappers collect in module order) whatever order ``out_indices``
    lists them in. ``body.feature_info`` (and a getter wrapper's ``out_indices``) is set to that
    order, so that the channels and strides it reports are those of the levels it returns."""
    from timm.models._features import FeatureGetterNet

    info = body.feature_info
    count = len(info.info)
    order = sorted({int(i) % count for i in info.out_indices})
    body.feature_info = info.from_other(order)
    if isinstance(body, FeatureGetterNet):
        body.out_indices = list(order)
    return tuple(order)


def _token_model(body: Any) -> Any:
    """The timm model inside a ``features_only`` wrapper that calls its ``forward_intermediates``
    (timm's ``FeatureGetterNet``), or None for the other wrappers."""
    from timm.models._features import FeatureGetterNet

    return body.model if isinstance(body, FeatureGetterNet) else None
