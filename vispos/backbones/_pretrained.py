"""Pretrained backbone weights from the local caches only (timm's, torchvision's): never downloaded.

``pretrained=True`` (timm) and ``weights=...`` (torchvision) are resolved to the file the library
itself would have cached (the Hugging Face hub cache, the torch hub cache); when it is not there,
``FileNotFoundError`` says so at once, where the libraries alone would try the network (timm
retried for ~50 s; torchvision printed "Downloading" and raised ``URLError``), and how to pass a
local checkpoint instead.

Private module, used by the timm and torchvision adapters.

References:
    timm ``models/_builder.py`` (``_resolve_pretrained_source``, ``pretrained_cfg_overlay``);
    torchvision ``models/_api.py`` (``WeightsEnum.verify``, ``get_model_weights``);
    ``torch.hub.get_dir``; huggingface_hub ``try_to_load_from_cache``.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

__all__ = ["cached_timm_weights", "cached_torchvision_weights"]


def _hub_checkpoint(url: str) -> str:
    """Where ``torch.hub.load_state_dict_from_url(url)`` keeps its file."""
    import torch.hub

    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(url).path))


def _find_timm_weights(model_name: str) -> tuple[str | None, list[str]]:
    """Where timm's pretrained weights for ``model_name`` already lie on this machine.

    Looks, without any network access, where timm itself would have stored them: the Hugging
    Face hub cache (``hf_hub_id``: ``model.safetensors`` / ``pytorch_model.bin`` or the config's
    ``hf_hub_filename``), the torch hub cache (``url``: ``<torch.hub.get_dir()>/checkpoints``), or
    the config's own ``file``.

    Returns:
        (path or None, the places looked at, for the error message).

    Raises:
        ValueError: timm knows no pretrained weights for ``model_name``.
    """
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(model_name)
    if cfg is None or not (cfg.hf_hub_id or cfg.url or cfg.file):
        raise ValueError(
            f"pretrained=True, but timm has no pretrained weights for model_name={model_name!r}; "
            "pass pretrained=False (random weights) or checkpoint_path=<a local state dict>"
        )
    looked: list[str] = []
    if cfg.file:
        looked.append(str(cfg.file))
        if os.path.isfile(cfg.file):
            return str(cfg.file), looked
    if cfg.hf_hub_id:
        from huggingface_hub import constants, try_to_load_from_cache

        repo, _, revision = cfg.hf_hub_id.partition("@")
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else ["pytorch_model.bin"]
        for name in list(names):
            if name.endswith(".bin"):  # timm prefers the safetensors twin
                names.insert(0, "model.safetensors" if name == "pytorch_model.bin" else name[:-4] + ".safetensors")
        for name in names:
            found = try_to_load_from_cache(repo, name, cache_dir=constants.HF_HUB_CACHE, revision=revision or None)
            if isinstance(found, str) and os.path.isfile(found):
                return found, looked
        looked.append(f"{repo} ({' or '.join(names)}) in the Hugging Face cache {constants.HF_HUB_CACHE}")
    if cfg.url:
        path = _hub_checkpoint(cfg.url)
        if os.path.isfile(path):
            return path, looked
        looked.append(path)
    return None, looked



def cached_timm_weights(model_name: str) -> str:
    """The local file of timm's pretrained weights for ``model_name`` (for
    ``pretrained_cfg_overlay={"file": ...}``).

    Raises:
        ValueError: timm has no pretrained weights for ``model_name``.
        FileNotFoundError: they are not cached on this machine (the message names the places
            looked at and how to pass ``checkpoint_path`` instead).
    """
    local, looked = _find_timm_weights(model_name)
    if local is None:
        raise FileNotFoundError(
            f"pretrained=True needs timm's weights for model_name={model_name!r} on this "
            f"machine, and none are cached (looked for {'; '.join(looked)}); vispos never "
            "downloads. Pass checkpoint_path='/path/to/weights.safetensors' (or .pth: a "
            "local state dict, e.g. saved once with torch.save(timm.create_model("
            f"{model_name!r}, pretrained=True).state_dict(), 'weights.pth') where there is "
            "network) and pretrained=False, or fill timm's cache on a machine with network "
            "access"
        )
    return local


def cached_torchvision_weights(name: str, weights: Any) -> Any:
    """``weights`` for torchvision's model ``name`` (a name such as ``"DEFAULT"`` /
    ``"IMAGENET1K_V1"`` / ``"ResNet50_Weights.IMAGENET1K_V2"``, or the enum member), checked to
    be in the torch hub cache, so ``torchvision.models.get_model(name, weights=...)`` reads it
    without any network access. None passes through.

    Raises:
        ValueError: ``weights`` is not one of ``name``'s weights (the message lists them).
        FileNotFoundError: the weights' file is not in the torch hub cache (the message names the
            file, the folder and how to pass ``checkpoint_path`` instead).
    """
    if weights is None:
        return None
    from torchvision.models import get_model_weights

    enum = get_model_weights(name)
    try:
        resolved = enum.verify(weights)
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"weights={weights!r} is not one of {name!r}'s weights: "
            f"{['DEFAULT', *(w.name for w in enum)]}"
        ) from None
    path = _hub_checkpoint(resolved.url)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"weights={weights!r} ({resolved}) needs torchvision's file {os.path.basename(path)!r} "
            f"in the torch hub cache {os.path.dirname(path)!r}, and it is not there; vispos never "
            f"downloads. Pass checkpoint_path='/path/to/{os.path.basename(path)}' (fetched once "
            f"from {resolved.url} where there is network) and weights=None, or put the file in "
            "that folder"
        )
    return resolved
