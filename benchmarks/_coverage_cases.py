"""Which models the coverage of ``vispos.make_padding_invariant`` is measured on: torchvision's
classifiers, video and segmentation networks, one timm model per timm module (its smallest by name)
with the CNN picks detectors pair with DETR heads, and MONAI's networks at small widths; each with
the item sizes its stock forward takes (``benchmarks/invariance_coverage.py`` runs them).

The timm selection (:func:`timm_models`, :data:`LARGE`, :data:`SMALL`) is shared with
``tests/test_invariance_sweep.py`` (the backbones' sweep), so that both pick the same models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: name fragments of timm sizes too large for a sweep on two CPU cores
LARGE = ("large", "huge", "giant", "enormous", "gigantic", "_xl", "xlarge", "1b", "3b", "_384", "_448", "_512",
         "_560", "_336", "_1024", "_h14", "_g14", "_e14", "412m", "570m", "306m", "300m", "_m48", "_m36", "264", "154",
         "base", "_l", "201", "169", "161")
#: smaller first: the first fragment a name contains ranks it
SMALL = ("test_", "atto", "femto", "pico", "nano", "xxs", "tiny", "_t0", "xs", "mini", "b0", "_m0", "_s0", "_s1",
         "small", "_050", "_035", "_100", "18", "121", "002", "26", "34", "lite", "m1")
#: timm modules whose smallest model is still too large or slow to build on two CPU cores
TOO_LARGE = frozenset({"deepseek_vit", "gemma4_vit", "mobilenetv5", "qwen3_vit", "nasnet", "pnasnet", "naflexvit",
                       "iformer", "tnt"})
#: further CNN picks from the families detectors pair with DETR heads, beside one per module
EXTRA = ("resnet50d", "seresnext26d_32x4d", "resnetrs50", "efficientnet_b0_gn", "tf_efficientnet_b0", "mixnet_s",
         "mnasnet_small", "mobilenetv3_small_100", "mobilenetv4_conv_small", "regnetx_002", "regnety_002",
         "regnetz_005", "convnext_atto", "convnextv2_atto", "gernet_s", "repvgg_a0", "mobileone_s0", "cspresnet50",
         "nf_resnet26", "xception41", "dla34", "resnet18", "ese_vovnet19b_dw")


def rank(name: str) -> tuple:
    """Sort key of a timm model name: smaller sizes (by :data:`SMALL`) first, then shorter names."""
    hits = [i for i, frag in enumerate(SMALL) if frag in name]
    return (min(hits) if hits else len(SMALL), len(name), name)


def timm_models(skip_modules=frozenset(), extra=EXTRA) -> list[str]:
    """One model per timm module (its smallest by :func:`rank`, none of :data:`LARGE`), modules in
    ``skip_modules`` left out, then the ``extra`` picks timm has; deterministic."""
    import timm

    chosen: list[str] = []
    for module in sorted(timm.list_modules()):
        if module in skip_modules:
            continue
        names = [n for n in timm.list_models(module=module) if not any(f in n for f in LARGE)]
        if names:
            chosen.append(min(names, key=rank))
    return chosen + [n for n in extra if n not in chosen and timm.is_model(n)]


#: item sizes (the item, its larger partner) tried in turn until the stock model runs both alone
ODD_2D = ((66, 90), (94, 62))
ALIGNED_2D = ((96, 128), (128, 96))


@dataclass(frozen=True)
class Case:
    """One architecture: ``build()`` returns it with random weights (no download); ``sizes`` are
    pairs ``(item, partner)`` of spatial sizes tried in turn; the canvas of a padded batch is a
    multiple of ``multiple`` beyond both."""

    name: str
    source: str
    build: Callable = field(compare=False)
    sizes: tuple = (ODD_2D, ALIGNED_2D)
    multiple: int = 32

    @property
    def key(self) -> str:
        """``source:name``, unique over the sweep (timm and torchvision share names)."""
        return f"{self.source}:{self.name}"


def _timm(name: str) -> Callable:
    def build():
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10)
    return build


def _timm_sizes(name: str) -> tuple:
    """The odd and aligned 2D sizes, then the model's own input size (a model that takes no other)."""
    import timm

    size = tuple(timm.get_pretrained_cfg_value(name, "input_size") or (3, 224, 224))[1:]
    return (ODD_2D, ALIGNED_2D, (size, size))


def timm_cases(skip_modules=TOO_LARGE) -> list[Case]:
    return [Case(name, "timm", _timm(name), _timm_sizes(name)) for name in timm_models(skip_modules)]


#: torchvision classifiers (ImageNet-style), the smallest of each family and a few more sizes
TV_CLASSIFIERS = (
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_b1", "efficientnet_v2_s", "googlenet",
    "inception_v3", "maxvit_t", "mnasnet0_5", "mnasnet1_0", "mobilenet_v2", "mobilenet_v3_large",
    "mobilenet_v3_small", "regnet_x_400mf", "regnet_x_800mf", "regnet_y_400mf", "regnet_y_800mf", "regnet_x_1_6gf",
    "regnet_y_1_6gf", "resnet18", "resnet34", "resnet50", "resnext50_32x4d", "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0", "squeezenet1_0", "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_32",
)
TV_VIDEO = ("r3d_18", "mc3_18", "r2plus1d_18", "s3d", "swin3d_t", "mvit_v2_s")
TV_SEGMENTATION = ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "lraspp_mobilenet_v3_large")
VIDEO_SIZES = (((4, 36, 44), (6, 44, 32)), ((8, 64, 64), (8, 96, 64)))
VIT_SIZES = (ODD_2D, ALIGNED_2D, ((224, 224), (224, 224)))


def _torchvision(name: str, **kwargs) -> Callable:
    def build():
        from torchvision.models import get_model

        return get_model(name, weights=None, **kwargs)
    return build


def torchvision_cases() -> list[Case]:
    cases = []
    for name in TV_CLASSIFIERS:
        kwargs = {"num_classes": 10}
        if name in ("googlenet", "inception_v3"):
            kwargs.update(aux_logits=False, init_weights=True)
        sizes = VIT_SIZES if name.startswith(("vit_", "maxvit")) else (ODD_2D, ALIGNED_2D)
        cases.append(Case(name, "torchvision", _torchvision(name, **kwargs), sizes))
    cases += [Case(name, "torchvision", _torchvision(name, num_classes=10), VIDEO_SIZES, 8) for name in TV_VIDEO]
    cases += [Case(name, "torchvision", _torchvision(name, num_classes=3, weights_backbone=None))
              for name in TV_SEGMENTATION]
    return cases


_HIGHRES_LAYERS = (
    {"name": "conv_0", "n_features": 4, "kernel_size": 3},
    {"name": "res_1", "n_features": 4, "kernels": (3, 3), "repeat": 1},
    {"name": "res_2", "n_features": 8, "kernels": (3, 3), "repeat": 1},
    {"name": "conv_1", "n_features": 8, "kernel_size": 1},
    {"name": "conv_2", "kernel_size": 1},
)
_TINY_BLOCKS = ["r1_k3_s11_e1_i32_o16_se0.25", "r2_k3_s22_e6_i16_o24_se0.25"]
_SMALL_3D = (((8, 12, 16), (16, 8, 12)), ((16, 16, 16), (16, 16, 32)))
_SMALL_2D = (((32, 48), (48, 16)), ((64, 64), (64, 96)))


def _monai_specs() -> dict:
    """name -> (builder, sizes, canvas multiple): MONAI networks at small widths."""
    from monai.networks import nets

    group = ("group", {"num_groups": 2})
    return {
        "UNet-3d-batch": (lambda: nets.UNet(3, 1, 2, (4, 8, 16), (2, 2), num_res_units=1, norm="batch"), _SMALL_3D, 4),
        "UNet-2d-instance": (lambda: nets.UNet(2, 1, 2, (4, 8, 16, 32), (2, 2, 2), num_res_units=2,
                                               norm="instance"), _SMALL_2D, 8),
        "UNet-2d-no-residual": (lambda: nets.UNet(2, 1, 2, (4, 8, 16), (2, 2), num_res_units=0), _SMALL_2D, 4),
        "AttentionUnet-3d": (lambda: nets.AttentionUnet(3, 1, 2, (4, 8, 16), (2, 2)), _SMALL_3D, 4),
        "BasicUNet-2d": (lambda: nets.BasicUNet(2, 1, 2, features=(4, 4, 4, 8, 8, 4)), _SMALL_2D, 16),
        "BasicUNet-3d": (lambda: nets.BasicUNet(3, 1, 2, features=(4, 4, 4, 8, 8, 4)),
                         (((16, 16, 32), (32, 16, 16)),), 16),
        "BasicUNet-2d-pixelshuffle": (lambda: nets.BasicUNet(2, 1, 2, features=(4, 4, 4, 8, 8, 4),
                                                             upsample="pixelshuffle"), _SMALL_2D, 16),
        "BasicUNetPlusPlus-2d": (lambda: nets.BasicUNetPlusPlus(2, 1, 2, features=(4, 4, 4, 8, 8, 4)), _SMALL_2D, 16),
        "BasicUNetPlusPlus-2d-deep-supervision": (lambda: nets.BasicUNetPlusPlus(
            2, 1, 2, features=(4, 4, 4, 8, 8, 4), deep_supervision=True), _SMALL_2D, 16),
        "DynUNet-3d": (lambda: nets.DynUNet(3, 1, 2, [3, 3, 3], [1, 2, 2], [2, 2], filters=[4, 8, 16]), _SMALL_3D, 4),
        "DynUNet-3d-residual": (lambda: nets.DynUNet(3, 1, 2, [3, 3, 3], [1, 2, 2], [2, 2], filters=[4, 8, 16],
                                                     res_block=True), _SMALL_3D, 4),
        "DynUNet-3d-deep-supervision": (lambda: nets.DynUNet(3, 1, 2, [3, 3, 3], [1, 2, 2], [2, 2], filters=[4, 8, 16],
                                                             deep_supervision=True, deep_supr_num=1), _SMALL_3D, 4),
        "SegResNet-3d": (lambda: nets.SegResNet(3, init_filters=4, in_channels=1, out_channels=2,
                                                blocks_down=(1, 1, 1), blocks_up=(1, 1), norm=group), _SMALL_3D, 4),
        "SegResNetDS-3d": (lambda: nets.SegResNetDS(3, init_filters=4, in_channels=1, out_channels=2,
                                                    blocks_down=(1, 1, 1), dsdepth=2), _SMALL_3D, 4),
        "SegResNetVAE-3d": (lambda: nets.SegResNetVAE((16, 16, 16), spatial_dims=3, init_filters=4, in_channels=1,
                                                      out_channels=2, blocks_down=(1, 1, 1), blocks_up=(1, 1),
                                                      norm=group), (((16, 16, 16), (16, 16, 16)),), 4),
        "HighResNet-3d": (lambda: nets.HighResNet(3, 1, 2, layer_params=_HIGHRES_LAYERS),
                          (((6, 9, 7), (9, 5, 8)),), 4),
        "VNet-2d": (lambda: nets.VNet(2, 1, 2), (((32, 48), (48, 32)),), 16),
        "DenseNet121-2d": (lambda: nets.DenseNet121(2, 1, 3, init_features=4, growth_rate=4, block_config=(1, 1, 1, 1)),
                           (((64, 72), (72, 48)),), 4),
        "ResNet-3d": (lambda: nets.ResNet("basic", (1, 1, 1, 1), (4, 8, 8, 16), spatial_dims=3, n_input_channels=1,
                                          num_classes=3), (((20, 24, 12), (12, 20, 28)),), 4),
        "SEResNet-2d": (lambda: nets.SENet(2, 1, "se_resnet_bottleneck", layers=(1, 1, 1, 1), groups=1, reduction=4,
                                           inplanes=8, downsample_kernel_size=1, input_3x3=False, num_classes=3),
                        (((64, 72), (72, 48)),), 4),
        "EfficientNet-3d": (lambda: nets.EfficientNet(_TINY_BLOCKS, spatial_dims=3, in_channels=1, num_classes=3,
                                                      width_coefficient=0.25, image_size=32), _SMALL_3D, 4),
        "Classifier-2d": (lambda: nets.Classifier((1, 32, 32), 3, (4, 8), (2, 2)), (((32, 32), (32, 32)),), 4),
        "AutoEncoder-3d": (lambda: nets.AutoEncoder(3, 1, 1, (4, 8), (2, 2), num_res_units=1), _SMALL_3D, 4),
        "RegUNet-2d": (lambda: nets.RegUNet(2, 1, num_channel_initial=4, depth=2, out_channels=2), _SMALL_2D, 4),
        "MedNeXt-3d": (lambda: nets.MedNeXt(3, init_filters=4, in_channels=1, out_channels=2, blocks_down=(1, 1, 1),
                                            blocks_bottleneck=1, blocks_up=(1, 1, 1), kernel_size=3),
                       (((16, 16, 24), (24, 16, 16)),), 8),
        "UNETR-3d": (lambda: nets.UNETR(1, 2, img_size=16, feature_size=4, hidden_size=24, mlp_dim=48, num_heads=2),
                     (((16, 16, 16), (16, 16, 16)),), 16),
        "SwinUNETR-3d": (lambda: nets.SwinUNETR(in_channels=1, out_channels=2, feature_size=12, depths=(1, 1, 1, 1),
                                                num_heads=(1, 1, 1, 1)), (((32, 32, 32), (32, 32, 32)),), 32),
    }


def monai_cases() -> list[Case]:
    return [Case(name, "monai", build, sizes, multiple) for name, (build, sizes, multiple) in _monai_specs().items()]


def all_cases() -> list[Case]:
    """Every architecture of the coverage sweep: torchvision, timm, MONAI (in that order)."""
    return torchvision_cases() + timm_cases() + monai_cases()


#: ``--quick``: an exact classifier, a refused transformer, an exact MONAI segmenter, each a few seconds
QUICK = ("torchvision:resnet18", "timm:test_vit", "monai:UNet-2d-no-residual")
