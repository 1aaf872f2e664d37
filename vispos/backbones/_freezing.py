"""Frozen stages: backbone parameters frozen up to a named module, as the adapters' arguments ask.

References:
    Carion et al., DETR ``models/backbone.py`` (``train_backbone``); mmdet / detectron2
    ``frozen_stages``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .._checks import check_bool, check_int

__all__ = ["freeze_through", "check_freeze_args"]


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


def check_freeze_args(train_backbone: Any, frozen_stages: Any, frozen_batch_norm: Any) -> int:
    """Validates the freezing keywords the adapters share; returns ``frozen_stages`` as an int."""
    train_backbone = check_bool(train_backbone, "train_backbone")
    frozen_batch_norm = check_bool(frozen_batch_norm, "frozen_batch_norm")
    return check_int(frozen_stages, "frozen_stages", minimum=-1)  # -1: train every stage
